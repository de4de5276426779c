package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"
)

// Verdict is the outcome for one node.
type Verdict string

// Verdicts.
const (
	// OK: every client CA the node advertises is vouched for.
	OK Verdict = "OK"
	// Flagged: the node accepts a CA the root did not vouch for, asks for
	// no client certificate, or serves a certificate not under the root.
	Flagged Verdict = "FLAGGED"
	// Unreachable: no TLS handshake got as far as the CertificateRequest.
	Unreachable Verdict = "UNREACHABLE"
)

// Result is what Check found at one node.
type Result struct {
	// Node is host:port.
	Node string
	// Verdict and Reason (empty when OK).
	Verdict Verdict
	Reason  string
	// Advertised are the client-CA names the node listed, as strings.
	Advertised []string
}

// Line is the result as one line of output.
func (r Result) Line() string {
	s := fmt.Sprintf("%-11s %s", r.Verdict, r.Node)
	if r.Reason != "" {
		s += ": " + r.Reason
	}
	if len(r.Advertised) > 0 {
		s += " (client CAs: " + strings.Join(r.Advertised, "; ") + ")"
	}
	return s
}

// Checker checks nodes against the vouched set.
type Checker struct {
	// Root is os-ca.crt; apid's serving certificate must chain to it.
	Root *x509.Certificate
	// Vouched is the `ca` set the root vouches for (the root included):
	// certdir.ReadBundle of the ceremony directory.
	Vouched []*x509.Certificate
	// Timeout bounds each node's dial and handshake.
	Timeout time.Duration
	// Concurrency bounds the nodes checked at once.
	Concurrency int
}

// CheckAll checks every node, at most Concurrency at once, and returns
// the results in the order of nodes.
func (c *Checker) CheckAll(ctx context.Context, nodes []string) []Result {
	out := make([]Result, len(nodes))
	sem := make(chan struct{}, max(1, c.Concurrency))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i] = c.Check(ctx, n)
		}()
	}
	wg.Wait()
	return out
}

// handshake is what one TLS handshake revealed.
type handshake struct {
	mu        sync.Mutex
	requested bool
	names     [][]byte
	chain     []*x509.Certificate
}

// Check connects to node without credentials and judges what its TLS
// handshake reveals.
func (c *Checker) Check(ctx context.Context, node string) Result {
	h, err := c.handshake(ctx, node)
	if h.chain == nil {
		return Result{Node: node, Verdict: Unreachable, Reason: errString(err)}
	}
	r := Result{Node: node, Verdict: OK, Advertised: nameStrings(h.names)}
	if reason := c.judge(h); reason != "" {
		r.Verdict, r.Reason = Flagged, reason
	}
	return r
}

// judge says what is wrong with what a handshake revealed ("" if nothing).
func (c *Checker) judge(h *handshake) string {
	if !h.requested {
		return "asks for no client certificate: apid always does, so this is not an apid configured by trustd"
	}
	if extra := c.unvouched(h.names); len(extra) > 0 {
		return "accepts client CAs the root did not vouch for: " + strings.Join(extra, "; ")
	}
	if err := c.servingErr(h.chain); err != nil {
		return "serving certificate does not chain to the root: " + err.Error()
	}
	return ""
}

func errString(err error) string {
	if err == nil {
		return "no certificate received"
	}
	return err.Error()
}

// handshake runs a TLS handshake that offers no client certificate and
// records the server's chain and CertificateRequest. It verifies nothing
// itself (servingErr does): the point is to see what a poisoned node
// presents.
func (c *Checker) handshake(ctx context.Context, node string) (*handshake, error) {
	h := &handshake{}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{
		// Verified by hand in servingErr: a failed verification here
		// would end the handshake before the CertificateRequest is read.
		InsecureSkipVerify: true,
		MinVersion:         tls.VersionTLS12,
		VerifyConnection: func(cs tls.ConnectionState) error {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.chain = cs.PeerCertificates
			return nil
		},
		GetClientCertificate: func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.requested, h.names = true, cri.AcceptableCAs
			return &tls.Certificate{}, nil
		},
	}, NetDialer: &net.Dialer{Timeout: c.Timeout}}
	conn, err := d.DialContext(ctx, "tcp", node)
	if err == nil {
		// TLS 1.3: the server judges the (empty) client certificate after
		// the client's handshake ends; read its verdict, briefly.
		_ = conn.SetReadDeadline(time.Now().Add(min(c.Timeout, time.Second)))
		_, _ = conn.Read(make([]byte, 1))
		_ = conn.Close()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h, err
}

// servingErr verifies apid's serving chain to the root for ServerAuth
// (the names are not checked: nodes are dialled by whatever address the
// operator listed).
func (c *Checker) servingErr(chain []*x509.Certificate) error {
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(c.Root)
	for _, ic := range chain[1:] {
		inter.AddCert(ic)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}

// unvouched returns the advertised names not matched by a vouched CA,
// each vouched CA matching one name at most: the list carries names, not
// keys, so a CA that copies a vouched CA's subject shows up as a second
// entry with that name. (One that replaces the vouched CA under the
// same name cannot be told apart from outside; such a worker refuses the
// real talosconfigs.)
func (c *Checker) unvouched(names [][]byte) []string {
	pool := make([][]byte, 0, len(c.Vouched))
	for _, v := range c.Vouched {
		pool = append(pool, v.RawSubject)
	}
	var extra []string
	for _, n := range names {
		i := slices.IndexFunc(pool, func(p []byte) bool { return string(p) == string(n) })
		if i < 0 {
			extra = append(extra, nameString(n))
			continue
		}
		pool = slices.Delete(pool, i, i+1)
	}
	return extra
}

func nameStrings(names [][]byte) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, nameString(n))
	}
	return out
}

// nameString renders a DER distinguished name (RFC 4514 form).
func nameString(der []byte) string {
	var seq pkix.RDNSequence
	if rest, err := asn1.Unmarshal(der, &seq); err != nil || len(rest) > 0 {
		return fmt.Sprintf("<unparsable name, %d bytes>", len(der))
	}
	var n pkix.Name
	n.FillFromRDNSequence(&seq)
	return n.String()
}

// ErrFlagged is returned by Summarize when any node was flagged or could
// not be checked.
var ErrFlagged = errors.New("fleet check failed")

// Summarize counts the verdicts and returns ErrFlagged (wrapped with the
// counts) unless every node is OK.
func Summarize(results []Result) error {
	counts := map[Verdict]int{}
	for _, r := range results {
		counts[r.Verdict]++
	}
	if counts[Flagged]+counts[Unreachable] == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d of %d nodes flagged, %d unreachable", ErrFlagged, counts[Flagged], len(results), counts[Unreachable])
}
