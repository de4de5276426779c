// Package doctor connects to trustd exactly as a Talos worker with a given
// machine config would (its token, its machine.ca and machine.acceptedCAs,
// its control-plane endpoint, port 50001) and reports each step with a
// specific hint for the failures users hit.
package doctor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/internal/workerclient"
)

// Resolver resolves host names (net.DefaultResolver implements it).
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// Options configures Run.
type Options struct {
	// Config is the worker's machine config.
	Config *WorkerConfig
	// Endpoint overrides host:port (default: the host of
	// the cluster endpoint: KubeClusterConfig or cluster.controlPlane.endpoint, port 50001).
	Endpoint string
	// TalosctlCA is the CA whose talosctl certificates must be let in
	// by the returned bundle; nil means machine.ca.
	TalosctlCA *x509.Certificate
	// Timeout bounds each network step; zero means 10 s (a worker's
	// per-attempt timeout).
	Timeout time.Duration
	// Resolver; nil means net.DefaultResolver.
	Resolver Resolver
	// Rand for the test CSR key.
	Rand io.Reader
	// MaxAddresses caps the resolved addresses checked (default 4).
	MaxAddresses int
}

// Step is one check.
type Step struct {
	Name   string `json:"name"`
	Target string `json:"target,omitempty"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
	Hint   string `json:"hint,omitempty"`
}

// Report is the list of steps run.
type Report struct {
	Steps []Step `json:"steps"`
}

// OK reports whether every step passed.
func (r *Report) OK() bool {
	for _, s := range r.Steps {
		if !s.OK {
			return false
		}
	}
	return len(r.Steps) > 0
}

func (r *Report) add(s Step) bool {
	r.Steps = append(r.Steps, s)
	return s.OK
}

// Run performs the checks. It stops checking a target at the first step
// that fails, as the worker would.
func Run(ctx context.Context, o Options) *Report {
	r := &Report{}
	if o.Config == nil {
		r.add(Step{Name: "machine config", Detail: "no machine config"})
		return r
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
	if o.MaxAddresses <= 0 {
		o.MaxAddresses = 4
	}
	if o.TalosctlCA == nil {
		o.TalosctlCA = o.Config.CA
	}
	roots := workerclient.Roots(append([]*x509.Certificate{o.Config.CA}, o.Config.AcceptedCAs...)...)
	detail := fmt.Sprintf("machine.ca %q, %d acceptedCAs, token set", o.Config.CA.Subject, len(o.Config.AcceptedCAs))
	if o.Config.HasCAKey {
		r.add(Step{Name: "machine config", OK: false, Detail: detail + ", machine.ca.key set",
			Hint: "a worker's machine config must not hold the OS CA key: remove machine.ca.key (the key belongs on the TPM/HSM)"})
		return r
	}
	r.add(Step{Name: "machine config", OK: true, Detail: detail})

	host, port := "", workerclient.Port
	if o.Endpoint != "" {
		h, p, err := net.SplitHostPort(o.Endpoint)
		if err != nil {
			r.add(Step{Name: "endpoint", Detail: err.Error(), Hint: "--endpoint takes host:port"})
			return r
		}
		host, port = h, p
	} else {
		h, err := o.Config.EndpointHost()
		if err != nil {
			r.add(Step{Name: "endpoint", Detail: err.Error(), Hint: "pass the full worker machine config (with its KubeClusterConfig document or cluster.controlPlane.endpoint) or --endpoint host:port"})
			return r
		}
		host = h
	}

	// DNS: a worker dials every address the endpoint resolves to.
	var addrs []string
	if ip := net.ParseIP(host); ip != nil {
		addrs = []string{host}
		r.add(Step{Name: "dns", Target: host, OK: true, Detail: "endpoint is an IP address"})
	} else {
		lctx, cancel := context.WithTimeout(ctx, o.Timeout)
		res, err := o.Resolver.LookupHost(lctx, host)
		cancel()
		if err != nil || len(res) == 0 {
			r.add(Step{Name: "dns", Target: host, Detail: errString(err, "no addresses"),
				Hint: "the worker cannot resolve the cluster endpoint; fix DNS for " + host + " or use an IP endpoint"})
			return r
		}
		if len(res) > o.MaxAddresses {
			res = res[:o.MaxAddresses]
		}
		addrs = res
		r.add(Step{Name: "dns", Target: host, OK: true, Detail: strings.Join(res, ", ")})
	}

	// Workers verify the server with ServerName = the exact host they
	// dialled: each IP, and (Talos 1.12.3+) the endpoint host name.
	type target struct{ dial, serverName string }
	var targets []target
	for _, a := range addrs {
		targets = append(targets, target{net.JoinHostPort(a, port), a})
	}
	if net.ParseIP(host) == nil {
		targets = append(targets, target{net.JoinHostPort(addrs[0], port), host})
	}
	for _, t := range targets {
		checkTarget(ctx, r, o, roots, t.dial, t.serverName)
	}
	return r
}

func errString(err error, def string) string {
	if err == nil {
		return def
	}
	return err.Error()
}

func checkTarget(ctx context.Context, r *Report, o Options, roots *x509.CertPool, addr, serverName string) {
	label := addr
	if host, _, _ := net.SplitHostPort(addr); host != serverName {
		label = fmt.Sprintf("%s (as %s)", addr, serverName)
	}
	// TCP.
	d := net.Dialer{Timeout: o.Timeout}
	dctx, cancel := context.WithTimeout(ctx, o.Timeout)
	conn, err := d.DialContext(dctx, "tcp", addr)
	cancel()
	if err != nil {
		r.add(Step{Name: "tcp", Target: label, Detail: err.Error(), Hint: tcpHint(err, addr)})
		return
	}
	r.add(Step{Name: "tcp", Target: label, OK: true})
	localIP := conn.LocalAddr().(*net.TCPAddr).IP
	// TLS handshake: verification is done below, step by step, so that
	// an untrusted chain and a missing SAN are told apart.
	tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, ServerName: sniName(serverName), NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}) //nolint:gosec // verified by hand below
	_ = tc.SetDeadline(time.Now().Add(o.Timeout))
	err = tc.HandshakeContext(ctx)
	if err != nil {
		_ = tc.Close()
		r.add(Step{Name: "tls handshake", Target: label, Detail: err.Error(), Hint: "the port answers but not with TLS as trustd does: is something else listening on " + addr + "?"})
		return
	}
	st := tc.ConnectionState()
	_ = tc.Close()
	leaf := st.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range st.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		r.add(Step{Name: "tls chain", Target: label, Detail: "x509: " + strings.TrimPrefix(err.Error(), "x509: "), Hint: chainHint(err, leaf)})
		return
	}
	r.add(Step{Name: "tls chain", Target: label, OK: true, Detail: fmt.Sprintf("server certificate %q issued by %q, trusted by machine.ca/acceptedCAs", leaf.Subject, leaf.Issuer)})
	if err := leaf.VerifyHostname(serverName); err != nil {
		r.add(Step{Name: "san match", Target: label, Detail: err.Error(),
			Hint: fmt.Sprintf("the serving certificate lacks %s: re-issue it for every address workers dial and the endpoint host name, e.g. steward-trustd-ceremony server-cert --san %s (or add it to TRUSTD_CERT_SANS for a self-issued certificate)", serverName, serverName)})
		return
	}
	r.add(Step{Name: "san match", Target: label, OK: true, Detail: serverName})

	checkRPC(ctx, r, o, workerclient.TLSConfig(roots, serverName), addr, label, localIP)
}

// checkRPC asks for a certificate exactly as the worker does and checks
// the answer as the worker and apid would.
func checkRPC(ctx context.Context, r *Report, o Options, tlsCfg *tls.Config, addr, label string, localIP net.IP) {
	_, csrPEM, err := workerclient.NewCSR(o.Rand, workerclient.KeyTypeFor(o.Config.CA.PublicKey), &x509.CertificateRequest{
		Subject:     pkix.Name{CommonName: "steward-trustd-doctor", Organization: []string{"os:server"}},
		IPAddresses: []net.IP{localIP},
	})
	if err != nil {
		r.add(Step{Name: "csr", Target: label, Detail: err.Error()})
		return
	}
	cc, err := workerclient.Dial(addr, tlsCfg)
	if err != nil {
		r.add(Step{Name: "token", Target: label, Detail: err.Error()})
		return
	}
	defer func() { _ = cc.Close() }()
	rctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	resp, err := workerclient.Request(rctx, cc, o.Config.Token, csrPEM)
	var bad *workerclient.ResponseError
	switch {
	case errors.As(err, &bad):
		r.add(Step{Name: "token", Target: label, OK: true, Detail: "accepted"})
		r.add(Step{Name: "csr", Target: label, Detail: bad.Error(), Hint: responseHint(bad.Part)})
		return
	case status.Code(err) == codes.Unauthenticated:
		r.add(Step{Name: "token", Target: label, Detail: err.Error(),
			Hint: "wrong token: machine.token differs from the daemon's token file (TRUSTD_CERT_DIR/token); apply the worker patch from the ceremony directory, or fix the Secret"})
		return
	case err != nil:
		r.add(Step{Name: "token", Target: label, OK: true, Detail: "accepted (the request got past authentication)"})
		r.add(Step{Name: "csr", Target: label, Detail: err.Error(), Hint: rpcErrHint(err)})
		return
	}
	r.add(Step{Name: "token", Target: label, OK: true, Detail: "accepted"})
	crt := resp.Cert
	r.add(Step{Name: "csr", Target: label, OK: true, Detail: fmt.Sprintf("issued %q by %q, valid until %s", crt.Subject, crt.Issuer, crt.NotAfter.UTC().Format(time.RFC3339))})
	if !checkIssued(r, label, resp.CertPEM, o.TalosctlCA, localIP.String()) {
		return
	}
	checkBundle(r, label, resp.Bundle, o.TalosctlCA)
}

// checkIssued verifies the issued certificate as talosctl verifies the
// apid that serves it: the whole crt (leaf, then any issuer chain, which
// apid serves as it is) to talosctl's CA, for ServerAuth, with ServerName =
// the node address talosctl dials — here the address this check's CSR
// named.
func checkIssued(r *Report, label string, crtPEM []byte, ca *x509.Certificate, nodeAddr string) bool {
	chain, err := pki.ParseCertificates(crtPEM)
	if err != nil {
		return r.add(Step{Name: "talosctl verify", Target: label, Detail: err.Error(), Hint: responseHint(workerclient.PartCert)})
	}
	leaf := chain[0]
	opts := x509.VerifyOptions{Roots: workerclient.Roots(ca), Intermediates: workerclient.Roots(chain[1:]...), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if _, err := leaf.Verify(opts); err != nil {
		return r.add(Step{Name: "talosctl verify", Target: label, Detail: "x509: " + strings.TrimPrefix(err.Error(), "x509: "), Hint: issuedChainHint(err, ca)})
	}
	if err := leaf.VerifyHostname(nodeAddr); err != nil {
		return r.add(Step{Name: "talosctl verify", Target: label, Detail: err.Error(),
			Hint: fmt.Sprintf("the issued certificate does not name the node address %s that its CSR asked for, so talosctl would refuse apid there: in the tiered setup the intermediate's --permitted-ip-ranges must cover every worker address (re-sign it with intermediate sign)", nodeAddr)})
	}
	return r.add(Step{Name: "talosctl verify", Target: label, OK: true,
		Detail: fmt.Sprintf("apid serving this certificate (%d certificate(s)) verifies for ServerAuth at %s to %q, as talosctl checks it", len(chain), nodeAddr, ca.Subject)})
}

// issuedChainHint explains an issued certificate talosctl would refuse.
func issuedChainHint(err error, ca *x509.Certificate) string {
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	switch {
	case errors.As(err, &ua):
		return fmt.Sprintf("the issued certificate does not chain to %q, the CA talosctl trusts (the talosconfig's ca): the daemon signs under another CA, or in the tiered setup its issuer.crt is missing from the response — check the daemon's os-ca.crt and issuer.crt", ca.Subject)
	case errors.As(err, &ci) && ci.Reason == x509.Expired:
		return "the issued certificate is not valid now: check the clocks of this host and the daemon's, and the expiry of os-ca.crt and issuer.crt"
	case errors.As(err, &ci) && ci.Reason == x509.CANotAuthorizedForThisName:
		return "the issued certificate names an address outside the intermediate's name constraints (--permitted-ip-ranges): talosctl refuses the chain; widen the ranges and re-sign the intermediate"
	}
	return "talosctl would refuse apid serving this certificate"
}

// responseHint explains a response a worker could not use.
func responseHint(p workerclient.Part) string {
	switch p {
	case workerclient.PartCert:
		return "the server returned no usable certificate: workers would retry forever"
	case workerclient.PartCA:
		return "an unparseable ca bundle stops apid from starting on Talos 1.9-1.12"
	}
	return "the issued certificate does not chain to the returned ca: the daemon's os-ca.crt is not the CA of its signing key"
}

// checkBundle tells whether apid, whose client-CA pool is the returned
// bundle, lets in talosctl certificates signed by ca.
func checkBundle(r *Report, label string, bundle []*x509.Certificate, ca *x509.Certificate) {
	for _, b := range bundle {
		if b.Equal(ca) {
			if !pki.AllowsClientAuth(b) {
				r.add(Step{Name: "talosctl access", Target: label, Detail: fmt.Sprintf("CA %q is in the bundle but its ExtKeyUsage excludes ClientAuth", ca.Subject), Hint: "apid refuses client chains through such a CA: re-create the CA with the ceremony (EKU ServerAuth+ClientAuth)"})
				return
			}
			r.add(Step{Name: "talosctl access", Target: label, OK: true, Detail: fmt.Sprintf("the returned ca (%d CA(s)) lets in talosctl certificates signed by %q", len(bundle), ca.Subject)})
			return
		}
	}
	var names []string
	for _, b := range bundle {
		names = append(names, fmt.Sprintf("%q", b.Subject))
	}
	r.add(Step{Name: "talosctl access", Target: label, Detail: fmt.Sprintf("the returned ca holds %s, not %q", strings.Join(names, ", "), ca.Subject),
		Hint: "talosctl certificates signed by this CA will be refused by apid: add the CA to the daemon's accepted-cas.crt (rotation) or issue talosconfigs from the daemon's CA"})
}

// sniName is the SNI a Go worker sends: none for an IP address.
func sniName(serverName string) string {
	if net.ParseIP(serverName) != nil {
		return ""
	}
	return serverName
}

func tcpHint(err error, addr string) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused: nothing listens on " + addr + "; trustd must answer on the API endpoint's address at port 50001 (workers cannot use another port)"
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		return "deadline exceeded: nothing answered " + addr + " in time; port 50001 is probably not exposed (Service/LoadBalancer/firewall) on that address, or the address is wrong"
	case errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH):
		return "no route to " + addr + ": the worker's network cannot reach the control-plane endpoint"
	}
	return "the worker cannot open a TCP connection to " + addr
}

func chainHint(err error, leaf *x509.Certificate) string {
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	switch {
	case errors.As(err, &ua):
		return fmt.Sprintf("the server certificate (issuer %q) is not signed by machine.ca or machine.acceptedCAs: the daemon uses another CA than this machine config (wrong cluster, stale config, or a rotation finished before workers got the new patch); apply the ceremony's worker patch", leaf.Issuer)
	case errors.As(err, &ci) && ci.Reason == x509.Expired:
		return "the server certificate is expired or not yet valid: check both clocks, then re-issue it with server-cert"
	case errors.As(err, &ci) && ci.Reason == x509.IncompatibleUsage:
		return "the server certificate is not valid for ServerAuth: re-issue it with server-cert"
	}
	return "the worker would refuse this server certificate"
}

func rpcHint(code codes.Code) string {
	switch code {
	case codes.PermissionDenied:
		return "the daemon's issuance policy refused this node's request (TRUSTD_ALLOWED_SAN_CIDRS / TRUSTD_REQUIRE_PEER_IP): the worker's addresses must be allowed"
	case codes.InvalidArgument:
		return "the daemon refused the certificate request as malformed"
	case codes.Unavailable, codes.ResourceExhausted:
		return "the daemon is overloaded or its signing device is unavailable; workers retry, but check steward-trustd logs and the device"
	case codes.DeadlineExceeded:
		return "deadline exceeded: the daemon did not sign within the worker's 10 s attempt window; check the signing device (TPM/HSM) latency"
	}
	return "check the steward-trustd logs"
}
