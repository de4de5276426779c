package talos

import (
	"crypto/tls"
	stdx509 "crypto/x509"
	"encoding/pem"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/steward-trustd/steward-trustd/internal/authz"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
)

// authzFleet are the machines of the test; each dials from its own
// address.
type authzFleet struct {
	worker1, worker2 inventoryMachine
	// late appeared two hours ago, outside the 30 min join window.
	late inventoryMachine
	// stranger is in no inventory.
	stranger inventoryMachine
	// intruder is a later inventory entry given worker-1's pinned address.
	intruder inventoryMachine
}

func newAuthzFleet() authzFleet {
	return authzFleet{
		worker1:  inventoryMachine{name: "worker-1", addr: "127.0.0.11"},
		worker2:  inventoryMachine{name: "worker-2", addr: "127.0.0.12"},
		late:     inventoryMachine{name: "late", addr: "127.0.0.13", created: time.Now().Add(-2 * time.Hour).UTC().Format(time.RFC3339)},
		stranger: inventoryMachine{name: "stranger", addr: "127.0.0.99"},
		intruder: inventoryMachine{name: "intruder", addr: "127.0.0.11"},
	}
}

// authzE2E is the daemon and authorizer pair under test.
type authzE2E struct {
	files        authorizerFiles
	certs, token string
	caPEM        []byte
	d            *daemon
	m            authzFleet
}

// startDaemon (re)starts the daemon against the authorizer's socket.
func (e *authzE2E) startDaemon(t *testing.T, mode string) {
	t.Helper()
	if e.d != nil {
		e.d.Stop(t)
	}
	e.d = startDaemon(t, "TRUSTD_CERT_DIR="+e.certs, "TRUSTD_PEER_RATE=-1", "TRUSTD_AUTHORIZER=unix://"+e.files.sock,
		"TRUSTD_AUTHORIZER_MODE="+mode, "TRUSTD_AUTHORIZER_CACHE_TTL=0s")
}

// issued: Talos's worker code from m's address with m's SANs (127.0.0.1
// included) gets a certificate that apid can serve.
func (e *authzE2E) issued(t *testing.T, m inventoryMachine) {
	t.Helper()
	ca, crt, id, err := machineRequest(t, sourceProxy(t, m.addr, e.d.Addr), e.token, e.caPEM, m.addr, m.name, 30*time.Second)
	if err != nil {
		t.Fatalf("%s from %s: %v\n%s", m.name, m.addr, err, e.d.Logs())
	}
	checkServes(t, ca, crt, id.Key, m.addr, m.name)
}

// refused: Talos's worker code from src asking for ip and name gets no
// certificate but code, and the audit line records outcome.
func (e *authzE2E) refused(t *testing.T, src, ip, name, code, outcome string) {
	t.Helper()
	_, _, _, err := machineRequest(t, sourceProxy(t, src, e.d.Addr), e.token, e.caPEM, ip, name, 5*time.Second)
	if err == nil {
		t.Fatalf("%s from %s got a certificate for %s %s\n%s", name, src, ip, name, e.d.Logs())
	}
	if !strings.Contains(err.Error(), code) || (code == "PermissionDenied" && !strings.Contains(err.Error(), outcome)) {
		t.Fatalf("%s from %s: %v, want %s (%s)", name, src, err, code, outcome)
	}
	if !strings.Contains(e.d.Logs(), `"peer":"`+src) || !strings.Contains(e.d.Logs(), `"authorizer":"`+outcome+`"`) {
		t.Fatalf("no audit line with authorizer=%s for %s\n%s", outcome, src, e.d.Logs())
	}
}

// TestAuthorizerTalosWorkers: per-machine authorization end to end, with
// Talos v1.14.1's worker code through the daemon binary and the
// steward-trustd-authorizer binary on a unix socket, each machine from
// its own 127.0.0.x address.
func TestAuthorizerTalosWorkers(t *testing.T) {
	dir := t.TempDir()
	e := &authzE2E{certs: gencreds(t), files: authorizerFiles{bin: filepath.Join(binDir, "steward-trustd-authorizer"), sock: filepath.Join(dir, "authz.sock"),
		inventory: filepath.Join(dir, "inventory.json"), state: filepath.Join(dir, "state.json")}, m: newAuthzFleet()}
	e.token = strings.TrimSpace(string(readFile(t, filepath.Join(e.certs, certdir.FileToken))))
	e.caPEM = readFile(t, filepath.Join(e.certs, certdir.FileCACert))
	m := e.m
	writeInventory(t, e.files.inventory, "30m", m.worker1, m.worker2, m.late)
	authorizer := e.files.start(t)
	e.startDaemon(t, "enforce")

	t.Run("own address and names", func(t *testing.T) { e.issued(t, m.worker1); e.issued(t, m.worker2) })
	t.Run("refused", func(t *testing.T) {
		for _, c := range []struct{ name, src, ip, san, outcome string }{
			{"unknown address", m.stranger.addr, m.stranger.addr, m.stranger.name, authz.OutcomeUnknownMachine},
			{"another machine's address as SAN", m.worker1.addr, m.worker2.addr, m.worker1.name, authz.OutcomeAddressNotOwned},
			{"pinned address asking for another machine's name", m.worker1.addr, m.worker1.addr, m.worker2.name, authz.OutcomePinned},
			{"outside the join window", m.late.addr, m.late.addr, m.late.name, authz.OutcomeOutsideWindow},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				e.refused(t, c.src, c.ip, c.san, "PermissionDenied", c.outcome)
			})
		}
	})
	t.Run("hot reload", e.hotReload)
	t.Run("authorizer killed", func(t *testing.T) {
		authorizer.kill()
		e.refused(t, m.worker2.addr, m.worker2.addr, m.worker2.name, "Unavailable", "error")
	})
	// The processes outlive their subtests: started on the test's t.
	e.files.start(t)
	e.startDaemon(t, "enforce")
	t.Run("restarts keep pins", func(t *testing.T) {
		e.refused(t, m.intruder.addr, m.intruder.addr, m.intruder.name, "PermissionDenied", authz.OutcomePinned)
	})
	e.startDaemon(t, "observe")
	t.Run("observe mode", func(t *testing.T) {
		e.issued(t, m.stranger)
		if !strings.Contains(e.d.Logs(), `"authorizer":"`+authz.OutcomeWouldDeny+`"`) {
			t.Fatalf("observe mode issued without a would_deny audit line\n%s", e.d.Logs())
		}
	})
}

// hotReload: worker-2 removed from the inventory file and worker-1's
// pinned address given to a new machine; the running authorizer picks the
// file up and both are refused.
func (e *authzE2E) hotReload(t *testing.T) {
	m := e.m
	writeInventory(t, e.files.inventory, "30m", m.intruder, m.late)
	eventually(t, 30*time.Second, "the authorizer reloading the inventory", func() bool {
		outcome, err := e.files.decide(m.worker2.addr, m.worker2.name)
		return err == nil && outcome == authz.OutcomeUnknownMachine
	})
	for _, c := range []struct {
		name string
		m    inventoryMachine
		want string
	}{{"removed machine", m.worker2, authz.OutcomeUnknownMachine}, {"pinned address given to another", m.intruder, authz.OutcomePinned}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e.refused(t, c.m.addr, c.m.addr, c.m.name, "PermissionDenied", c.want)
		})
	}
}

// checkServes: what apid does with the answer works — the certificate
// matches the worker's key and verifies, against the returned ca, for the
// machine's address and name.
func checkServes(t *testing.T, caBundle, crt, key []byte, ip, name string) {
	t.Helper()
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		t.Fatalf("issued certificate does not match the worker's key: %v", err)
	}
	pool := stdx509.NewCertPool()
	if !pool.AppendCertsFromPEM(caBundle) {
		t.Fatalf("returned ca is not a PEM bundle: %q", caBundle)
	}
	block, _ := pem.Decode(crt)
	cert, err := stdx509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{ip, "127.0.0.1", name} {
		if _, err := cert.Verify(stdx509.VerifyOptions{Roots: pool, DNSName: host, KeyUsages: []stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("issued certificate does not verify for %s: %v", host, err)
		}
	}
}
