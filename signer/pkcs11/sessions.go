package pkcs11

// DefaultMaxSessions bounds the sessions one Signer opens when
// Backend.MaxSessions is zero.
const DefaultMaxSessions = 8

// ckUnavailableInformation and ckEffectivelyInfinite are the special
// CK_ULONG values of CK_TOKEN_INFO.ulMaxSessionCount (PKCS#11 v2.40 §3.2,
// CK_UNAVAILABLE_INFORMATION = ~0UL, CK_EFFECTIVELY_INFINITE = 0). They
// are defined here so that sessionLimit, pure arithmetic, builds without
// cgo and is tested there too.
const (
	ckUnavailableInformation = ^uint(0)
	ckEffectivelyInfinite    = 0
)

// sessionLimit returns how many signing sessions a Signer may open:
// configured (DefaultMaxSessions when not positive), lowered to what the
// token says it allows minus the anchor session. The token's count is a
// CK_ULONG read as unsigned, and anything that is not a plain small count
// means "no limit stated": opencryptoki's soft token reports
// (CK_ULONG)-2, which as a signed int made the pool size negative and
// make(chan) panic. The result is always at least 1.
func sessionLimit(configured int, tokenMax uint) int {
	limit := configured
	if limit <= 0 {
		limit = DefaultMaxSessions
	}
	if tokenMax == ckEffectivelyInfinite || tokenMax == ckUnavailableInformation || tokenMax <= 1 {
		return limit
	}
	// tokenMax-1 < limit with limit positive: the conversion cannot overflow.
	if tokenMax-1 < uint(limit) {
		return int(tokenMax - 1)
	}
	return limit
}
