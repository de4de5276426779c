package server

import (
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
