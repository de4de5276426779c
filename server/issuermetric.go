package server

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterIssuerExpiry registers trustd_issuer_expiry_seconds: the
// seconds until the signing key's certificate chain (issuer.crt, or
// os-ca.crt in the single-tier setup) stops verifying, computed at each
// scrape from the credentials in use. In the tiered setup every replica's
// intermediate was typically enrolled at the same time, so this is the
// correlated risk to alert on. A nil clock means time.Now.
func RegisterIssuerExpiry(reg prometheus.Registerer, svc *Service, clock func() time.Time) {
	now := clockOrDefault(clock)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "trustd_issuer_expiry_seconds",
		Help: "Seconds until the signing key's certificate chain (issuer.crt, else os-ca.crt) expires.",
	}, func() float64 {
		return svc.Credentials().IssuerNotAfter().Sub(now()).Seconds()
	}))
}

// IssuerExpiryWarning is how long before the signing key's chain expires
// LogIssuer warns: enough for an offline root ceremony to re-sign it.
const IssuerExpiryWarning = 30 * 24 * time.Hour

// LogIssuer says which certificate the daemon signs with and until when,
// at start and at each reload, and warns when that chain is close to its
// end: worker certificates are clamped to it, so past it none verifies.
func LogIssuer(log *slog.Logger, c *Credentials, now time.Time) {
	issuer, notAfter := c.Issuer(), c.IssuerNotAfter()
	attrs := []any{"issuer", issuer.Subject.String(), "tiered", len(c.Chain()) > 0, "issuer_not_after", notAfter}
	if notAfter.Sub(now) < IssuerExpiryWarning {
		log.Warn("the signing key's certificate chain expires soon; have the root re-sign it (steward-trustd-ceremony intermediate sign, or rotate)", attrs...)
		return
	}
	log.Info("signing with", attrs...)
}
