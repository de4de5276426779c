package certlint

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
	"sync"
)

// throwawayRSABits is the size of the RSA throwaway key: any size gives
// the same signature algorithm (sha256WithRSAEncryption), so the smallest
// Go still generates keeps the one-time cost low.
const throwawayRSABits = 2048

// Throwaway keys, one per algorithm, generated on first use and never
// changed: they sign only the copies that are linted and thrown away, so
// they need no protection, and generating an RSA key per certificate
// would cost more than the certificate.
var (
	throwawayP256    = sync.OnceValues(func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) })
	throwawayP384    = sync.OnceValues(func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P384(), rand.Reader) })
	throwawayP521    = sync.OnceValues(func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P521(), rand.Reader) })
	throwawayEd25519 = sync.OnceValues(func() (crypto.Signer, error) {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		return k, err
	})
	throwawayRSA = sync.OnceValues(func() (crypto.Signer, error) { return rsa.GenerateKey(rand.Reader, throwawayRSABits) })
)

// ThrowawayKey returns a key of the same algorithm as pub (and, for
// ECDSA, the same curve), so that a certificate signed by it carries the
// same signatureAlgorithm, hence the same to-be-signed bytes, as one
// signed by the CA key.
func ThrowawayKey(pub crypto.PublicKey) (crypto.Signer, error) {
	switch k := pub.(type) {
	case ed25519.PublicKey:
		return throwawayEd25519()
	case *rsa.PublicKey:
		return throwawayRSA()
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return throwawayP256()
		case elliptic.P384():
			return throwawayP384()
		case elliptic.P521():
			return throwawayP521()
		}
		return nil, fmt.Errorf("lint: no throwaway key for ECDSA curve %s", k.Curve.Params().Name)
	}
	return nil, fmt.Errorf("lint: no throwaway key for CA key type %T", pub)
}
