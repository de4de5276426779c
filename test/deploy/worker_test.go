package deploy

import (
	"context"
	"crypto/tls"
	stdx509 "crypto/x509"
	"net"
	"strings"
	"testing"
	"time"

	talosx509 "github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/grpc/gen"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// workerSANs are what a Talos v1.14 worker's apid CSR carries
// (internal/app/machined/pkg/controllers/secrets/api_cert_sans.go): its
// node addresses (10.5.0.2 lies in the layouts' placeholder node network
// 10.0.0.0/8), 127.0.0.1 always, its hostname and FQDN; CN is the FQDN.
var (
	workerIPs   = []net.IP{net.ParseIP("10.5.0.2"), net.ParseIP("127.0.0.1")}
	workerNames = []string{"worker-1", "worker-1.cluster.local"}
)

// TestTalosWorkerThroughEveryLayout starts the daemon as each shipped
// Kubernetes layout runs it — its environment with only the documented
// site values replaced (TRUSTD_ALLOWED_SAN_CIDRS as shipped), its Secrets
// as kubelet mounts them, its uid/gid — and sends the request Talos's own
// worker code makes, both key generations; every layout must issue. The
// systemd unit's environment is run the same way by test/talos's
// TestSystemdUnit.
func TestTalosWorkerThroughEveryLayout(t *testing.T) {
	bins := podBinaries(t)
	for _, l := range []struct {
		name  string
		setup layoutSetup
	}{
		{"file", fileLayout},
		{"pkcs11", pkcs11Layout("overlays/pkcs11")},
		{"ha-pkcs11", pkcs11Layout("overlays/ha-pkcs11")},
		{"tpm", tpmLayout},
		{"ha-tpm", tieredTPMLayout(haTPMPod, "overlays/ha-tpm/kustomization.yaml")},
		{"kamaji", tieredTPMLayout(kamajiPod, "overlays/ha-tpm/kustomization.yaml")},
	} {
		t.Run(l.name, func(t *testing.T) {
			s := l.setup(t, bins)
			for _, ed25519 := range []bool{false, true} {
				crt, err := talosWorkerRequest(t, s, ed25519)
				if err != nil {
					t.Fatalf("Talos worker (ed25519 %v): %v\n%s", ed25519, err, s.logs())
				}
				checkWorkerCert(t, crt, s.caPEM)
			}
			checkServedNames(t, s)
		})
	}
}

// talosWorkerRequest builds the apid CSR as machined does (a key matching
// the CA, or Talos 1.9's Ed25519) and sends it through RemoteGenerator.
func talosWorkerRequest(t *testing.T, s *served, ed25519 bool) ([]byte, error) {
	t.Helper()
	accepted := []*talosx509.PEMEncodedCertificate{{Crt: s.caPEM}}
	caCert, err := accepted[0].GetCert()
	check(t, err)
	opts := []talosx509.Option{talosx509.IPAddresses(workerIPs), talosx509.DNSNames(workerNames), talosx509.CommonName(workerNames[1])}
	var csr *talosx509.CertificateSigningRequest
	if ed25519 {
		csr, _, err = talosx509.NewEd25519CSRAndIdentity(opts...)
	} else {
		csr, _, err = talosx509.NewCSRAndIdentityFromCA(caCert, opts...)
	}
	check(t, err)
	remote, err := gen.NewRemoteGenerator(s.token, []string{s.addr}, accepted)
	check(t, err)
	defer remote.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, crt, err := remote.IdentityContext(ctx, csr)
	return crt, err
}

// checkWorkerCert: the issued certificate (plus any intermediate served
// with it) verifies to the worker's CA for every name it asked for.
func checkWorkerCert(t *testing.T, crt, caPEM []byte) {
	t.Helper()
	chain, err := pki.ParseCertificates(crt)
	check(t, err)
	opts := stdx509.VerifyOptions{Roots: stdx509.NewCertPool(), Intermediates: stdx509.NewCertPool(), KeyUsages: []stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}}
	opts.Roots.AppendCertsFromPEM(caPEM)
	for _, c := range chain[1:] {
		opts.Intermediates.AddCert(c)
	}
	for _, name := range append([]string{workerIPs[0].String(), workerIPs[1].String()}, workerNames...) {
		opts.DNSName = name
		if _, err := chain[0].Verify(opts); err != nil {
			t.Errorf("issued certificate does not verify for %s: %v", name, err)
		}
	}
}

// checkServedNames: the serving certificate verifies to the worker's CA
// for every site value of TRUSTD_CERT_SANS (workers dial the endpoint's
// hostname too), as a worker's TLS client checks it.
func checkServedNames(t *testing.T, s *served) {
	t.Helper()
	roots := stdx509.NewCertPool()
	roots.AppendCertsFromPEM(s.caPEM)
	for _, name := range strings.Split(s.p.site["TRUSTD_CERT_SANS"], ",") {
		conn, err := tls.Dial("tcp", s.addr, &tls.Config{RootCAs: roots, ServerName: name, MinVersion: tls.VersionTLS12})
		if err != nil {
			t.Errorf("a worker dialling %s: %v", name, err)
			continue
		}
		conn.Close()
	}
}

func isIP(s string) bool { return net.ParseIP(s) != nil }
