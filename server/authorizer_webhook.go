package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/authz"
)

// WebhookTLS are the files of an https webhook's mutual TLS.
type WebhookTLS struct {
	// CAFile holds the CA certificates the webhook's certificate must
	// chain to (default: the system roots).
	CAFile string
	// CertFile and KeyFile are the daemon's client certificate and key.
	CertFile, KeyFile string
	// SocketUID is a uid a unix socket may be owned by besides root and
	// this process's (the authorizer's own user under systemd); 0 adds
	// nothing.
	SocketUID int
}

// badResponseError is a webhook answer that is not a valid decision.
type badResponseError struct{ err error }

func (e *badResponseError) Error() string { return e.err.Error() }
func (e *badResponseError) Unwrap() error { return e.err }

// webhook asks a decision over HTTP(S) or HTTP on a unix socket.
type webhook struct {
	client *http.Client
	url    string
	name   string
}

// NewWebhook builds a decider for an https:// URL or a unix:///path socket.
func NewWebhook(target string, tlsFiles WebhookTLS) (Decider, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("authorizer %q: %w", target, err)
	}
	switch u.Scheme {
	case "https":
		return newHTTPSWebhook(u, tlsFiles)
	case "unix":
		if u.Host != "" || u.Path == "" {
			return nil, fmt.Errorf("authorizer %q: want unix:///absolute/path.sock", target)
		}
		return newUnixWebhook(u.Path, tlsFiles.SocketUID), nil
	}
	return nil, fmt.Errorf("authorizer %q: want none, file:/path, https://host/… or unix:///path.sock", target)
}

func newHTTPSWebhook(u *url.URL, files WebhookTLS) (*webhook, error) {
	cfg, err := files.config()
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: true}
	dest := strings.TrimSuffix(u.String(), "/")
	if u.Path == "" || u.Path == "/" {
		dest += authz.DecidePath
	}
	return &webhook{client: &http.Client{Transport: tr, CheckRedirect: noRedirect}, url: dest, name: u.Redacted()}, nil
}

func (f WebhookTLS) config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("authorizer CA: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("authorizer CA %s holds no PEM certificate", f.CAFile)
		}
	}
	if (f.CertFile == "") != (f.KeyFile == "") {
		return nil, errors.New("authorizer client certificate: set both the certificate and the key file, or neither")
	}
	if f.CertFile != "" {
		pair, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("authorizer client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

func noRedirect(*http.Request, []*http.Request) error {
	return errors.New("the authorizer answered with a redirect; point the daemon at the final URL")
}

func newUnixWebhook(path string, uid int) *webhook {
	dialer := &net.Dialer{}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if err := checkSocket(path, uid); err != nil {
				return nil, err
			}
			return dialer.DialContext(ctx, "unix", path)
		},
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	return &webhook{client: &http.Client{Transport: tr, CheckRedirect: noRedirect}, url: "http://authorizer" + authz.DecidePath, name: "unix://" + path}
}

// checkSocket refuses a socket that someone else could have put there:
// it must be a socket owned by root, this process's user or uid, and not
// writable by others (connecting to a unix socket needs write access).
func checkSocket(path string, uid int) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("authorizer socket: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.Mode()&os.ModeSocket == 0:
		return fmt.Errorf("authorizer socket %s is not a socket", path)
	case !ok:
		return fmt.Errorf("authorizer socket %s: owner unknown", path)
	case st.Uid != 0 && int(st.Uid) != os.Getuid() && int(st.Uid) != uid:
		return fmt.Errorf("authorizer socket %s is owned by uid %d, not root, this process's uid %d nor TRUSTD_AUTHORIZER_SOCKET_UID: refusing it", path, st.Uid, os.Getuid())
	case fi.Mode().Perm()&0o002 != 0:
		return fmt.Errorf("authorizer socket %s is writable by others (mode %v): make it 0660 or stricter", path, fi.Mode().Perm())
	}
	return nil
}

// Describe implements Decider.
func (w *webhook) Describe() string { return w.name }

// Decide implements Decider.
func (w *webhook) Decide(ctx context.Context, req *authz.Request) (*authz.Response, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode decision request: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("decision request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := w.client.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("ask %s: %w", w.name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, &badResponseError{fmt.Errorf("%s answered %s: %q", w.name, resp.Status, bytes.TrimSpace(msg))}
	}
	d, err := authz.DecodeResponse(resp.Body)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", w.name, ctx.Err())
		}
		return nil, &badResponseError{fmt.Errorf("%s: %w", w.name, err)}
	}
	return d, nil
}
