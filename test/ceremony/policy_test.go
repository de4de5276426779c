package ceremony_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/internal/doctor"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// requestCode asks the daemon for a worker certificate and returns the
// gRPC code (OK on success).
func requestCode(t *testing.T, addr string, wc *doctor.WorkerConfig) codes.Code {
	t.Helper()
	_, _, err := workerRequest(t, addr, wc)
	return grpcstatus.Code(err)
}

// eventually retries f every 200ms for up to 10s (the daemon re-reads the
// approvals directory at most once a second, when it signs).
func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if f() {
			return
		}
	}
	t.Fatalf("%s: not within 10s", what)
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // loopback test helper
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// signedPolicySetup is a TPM key under two policy authorities served by
// the daemon, all sharing one swtpm through its relay.
type signedPolicySetup struct {
	sw                         *tpmsim.Swtpm
	root, approvals, uri       string
	primary, breakGlass, other string
	dir                        string
	wc                         *doctor.WorkerConfig
	d                          *daemon
	health                     string
}

func newSignedPolicySetup(t *testing.T) *signedPolicySetup {
	t.Helper()
	requireScheme(t, "tpm")
	s := &signedPolicySetup{sw: tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{}), root: t.TempDir()}
	s.approvals = filepath.Join(s.root, "approvals")
	s.uri = "tpm:path=" + filepath.Join(s.root, "ca.tpmkey") + ";" + s.sw.URIAttrs() + ";approvals=" + s.approvals
	offline := filepath.Join(s.root, "offline")
	if err := os.Mkdir(offline, 0o700); err != nil {
		t.Fatal(err)
	}
	s.primary, s.breakGlass, s.other = devtest.FileKey(t, offline, "primary"), devtest.FileKey(t, offline, "break-glass"), devtest.FileKey(t, offline, "foreign")
	s.dir = filepath.Join(s.root, "ceremony")
	r := mustCeremony(t, nil, "init", "--signer", s.uri, "--policy-authority", s.primary+","+s.breakGlass, "--cluster", "signed", "--out", s.dir)
	if !strings.Contains(r.stdout, "initial-") {
		t.Fatalf("init did not approve today's PCR values:\n%s", r)
	}
	s.wc = workerConfig(t, filepath.Join(s.dir, certdir.FileWorkerPatch))
	s.health = fmt.Sprintf("127.0.0.1:%d", devtest.FreePort(t))
	s.d = startDaemon(t, s.dir, s.uri, "TRUSTD_HEALTH_ADDR="+s.health, "TRUSTD_PEER_RATE=-1")
	return s
}

func (s *signedPolicySetup) ready(t *testing.T) bool {
	code, _ := httpGet(t, "http://"+s.health+"/readyz")
	return code == http.StatusOK
}

// TestSignedPolicyWithDaemon runs the whole upgrade story against swtpm
// with the daemon running: approved → signs; PCR 7 extended →
// Unavailable and not ready; a foreign approval and a malformed file
// change nothing (one log line each); a quote with a wrong nonce is
// refused; the break-glass authority's approval of the quoted values
// makes the same CA key sign again, without a restart.
func TestSignedPolicyWithDaemon(t *testing.T) {
	s := newSignedPolicySetup(t)
	if c := requestCode(t, s.d.Addr, s.wc); c != codes.OK {
		t.Fatalf("approved state: %v\n%s", c, s.d.Logs())
	}
	st := fullStatus(t, s.uri, filepath.Join(s.dir, certdir.FileCACert))
	if st.SignedPolicy == nil || len(st.SignedPolicy.Authorities) != 2 || st.SignedPolicy.Matching == "" {
		t.Fatalf("status: %+v", st.SignedPolicy)
	}

	s.sw.ExtendPCR(t, 7, []byte("dbx update"))
	if c := requestCode(t, s.d.Addr, s.wc); c != codes.Unavailable {
		t.Fatalf("after PCR 7 changed: %v, want Unavailable", c)
	}
	eventually(t, "not ready", func() bool { return !s.ready(t) })
	if !strings.Contains(s.d.Logs(), "--pcr 7=") {
		t.Errorf("the daemon's log does not tell the approver the PCR values:\n%s", s.d.Logs())
	}
	_, metrics := httpGet(t, "http://"+s.health+"/metrics")
	if !strings.Contains(metrics, `trustd_signer_errors_total{backend="tpm",kind="policy"}`) {
		t.Errorf("no policy error metric")
	}

	mustCeremony(t, nil, "policy", "approve", "--authority", s.other, "--signer", s.uri, "--out", filepath.Join(s.approvals, "foreign.json"), "--dir", s.dir)
	if err := os.WriteFile(filepath.Join(s.approvals, "broken.json"), []byte(`{"sha256": [`), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // past the approvals reload interval
	if c := requestCode(t, s.d.Addr, s.wc); c != codes.Unavailable {
		t.Fatalf("with a foreign approval: %v, want Unavailable", c)
	}

	ak, quote := filepath.Join(s.root, "ak.pem"), filepath.Join(s.root, "quote.json")
	mustCeremony(t, nil, "policy", "quote", "--signer", s.uri, "--ak-out", ak)
	mustCeremony(t, nil, "policy", "quote", "--signer", s.uri, "--nonce", "0011223344556677", "--out", quote)
	r := ceremony(t, nil, "policy", "approve", "--authority", s.breakGlass, "--signer", s.uri, "--from-quote", quote, "--ak", ak, "--nonce", "8899aabbccddeeff", "--approvals", s.approvals, "--dir", s.dir)
	if r.code != 1 || !strings.Contains(r.stderr, "nonce") {
		t.Fatalf("approve with a wrong nonce: %s", r)
	}
	checkApproveSelection(t, s)
	mustCeremony(t, nil, "policy", "approve", "--authority", s.breakGlass, "--signer", s.uri, "--from-quote", quote, "--ak", ak, "--nonce", "0011223344556677", "--approvals", s.approvals, "--dir", s.dir, "--note", "dbx 2026-12")
	eventually(t, "signing after the approval", func() bool { return requestCode(t, s.d.Addr, s.wc) == codes.OK })
	eventually(t, "ready", func() bool { return s.ready(t) })

	checkIgnoredOnce(t, s.d.Logs(), "foreign.json", "broken.json")
	rs := fullStatus(t, s.uri, filepath.Join(s.dir, certdir.FileCACert))
	n := 0
	for _, r := range rs.Receipts {
		if r.Operation == "policy.approve" {
			n++
		}
	}
	if n != 3 {
		t.Errorf("%d policy.approve receipts, want 3 (init, foreign, quote)", n)
	}
	if rs.SignedPolicy == nil || !strings.HasPrefix(filepath.Base(rs.SignedPolicy.Matching), "2") {
		t.Errorf("status does not name the quote's approval as the match: %+v", rs.SignedPolicy)
	}
	text := mustCeremony(t, nil, "status", "--signer", s.uri, "--ca", filepath.Join(s.dir, certdir.FileCACert))
	for _, want := range []string{"authority:    sha256 " + rs.SignedPolicy.Authorities[1].Fingerprint, "approved by:  " + rs.SignedPolicy.Matching, "PCR state:    7=",
		`key policy:   v2, policyRef "steward-trustd/os-ca/v2:000080", PCR selection sha256:7`} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text status lacks %q:\n%s", want, text.stdout)
		}
	}
}

// checkIgnoredOnce checks that each file got exactly one "ignored" line.
func checkIgnoredOnce(t *testing.T, logs string, files ...string) {
	t.Helper()
	for _, f := range files {
		n := 0
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, "approval file ignored") && strings.Contains(l, f) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d log lines for the ignored %s, want 1:\n%s", n, f, logs)
		}
	}
}

// fullStatus is status --output json with the signed-policy part.
func fullStatus(t *testing.T, uri, ca string) keystore.Status {
	t.Helper()
	r := mustCeremony(t, nil, "status", "--signer", uri, "--ca", ca, "--output", "json")
	var st keystore.Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status json: %v\n%s", err, r)
	}
	return st
}

// checkApproveSelection: policy approve reads the key's bound PCR
// selection from its blob (--key) and prints it first; an approval over
// another selection (7,11) or a resettable PCR (16) is refused and
// nothing is written.
func checkApproveSelection(t *testing.T, s *signedPolicySetup) {
	t.Helper()
	u, err := tpm.ParseURI(s.uri)
	if err != nil {
		t.Fatal(err)
	}
	v := strings.Repeat("ab", 32)
	out := filepath.Join(s.root, "refused.json")
	r := ceremony(t, nil, "policy", "approve", "--authority", s.primary, "--key", u.Path, "--pcr", "7="+v, "--pcr", "11="+v, "--out", out)
	if r.code != 1 || !strings.HasPrefix(r.stdout, `key policy: v2 (policyRef "steward-trustd/os-ca/v2:000080", PCR selection sha256:7)`) || !strings.Contains(r.stderr, "accepts only 7") {
		t.Errorf("approve over pcrs 7,11 for a key bound to 7: %s", r)
	}
	if r := ceremony(t, nil, "policy", "approve", "--authority", s.primary, "--key", u.Path, "--pcr", "16="+v, "--out", out); r.code != 2 || !strings.Contains(r.stderr, "debug PCR") {
		t.Errorf("approve over PCR 16: %s", r)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a refused approval left a file")
	}
}

// TestSignedPolicyQuoteRefusals: a quote checked against another TPM's
// attestation key, or with altered values, approves nothing.
func TestSignedPolicyQuoteRefusals(t *testing.T) {
	requireScheme(t, "tpm")
	sw, other := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{}), tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	root := t.TempDir()
	auth := devtest.FileKey(t, root, "auth")
	uri := func(s *tpmsim.Swtpm) string { return "tpm:path=/unused/ca.tpmkey;" + s.URIAttrs() }
	ak, otherAK, quote := filepath.Join(root, "ak.pem"), filepath.Join(root, "other-ak.pem"), filepath.Join(root, "q.json")
	mustCeremony(t, nil, "policy", "quote", "--signer", uri(sw), "--ak-out", ak)
	mustCeremony(t, nil, "policy", "quote", "--signer", uri(other), "--ak-out", otherAK)
	mustCeremony(t, nil, "policy", "quote", "--signer", uri(sw), "--nonce", "abcd", "--out", quote)
	approve := func(akFile string) result {
		return ceremony(t, nil, "policy", "approve", "--authority", auth, "--signer", "tpm:handle=0x81000100;"+sw.URIAttrs(), "--from-quote", quote, "--ak", akFile, "--nonce", "abcd", "--out", filepath.Join(root, "a.json"))
	}
	if r := approve(otherAK); r.code != 1 || !strings.Contains(r.stderr, "attestation key") {
		t.Errorf("quote checked against another TPM's AK: %s", r)
	}
	var q tpmpolicy.Quote
	if err := json.Unmarshal(readFile(t, quote), &q); err != nil {
		t.Fatal(err)
	}
	q.PCRValues["7"] = strings.Repeat("ab", 32)
	data, err := json.Marshal(q)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(quote, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := approve(ak); r.code != 1 {
		t.Errorf("altered quote: %s", r)
	}
	if _, err := os.Stat(filepath.Join(root, "a.json")); err == nil {
		t.Error("a refused quote left an approval file")
	}
}

// TestMigrateToSignedPolicy is the migration of a PCR-bound key (whose
// authPolicy is immutable) to one under a policy authority: rotate to a
// new key created with --policy-authority, then finish the rotation.
func TestMigrateToSignedPolicy(t *testing.T) {
	requireScheme(t, "tpm")
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	root := t.TempDir()
	dir := filepath.Join(root, "ceremony")
	old := "tpm:path=" + filepath.Join(root, "old.tpmkey") + ";" + sw.URIAttrs()
	mustCeremony(t, nil, "init", "--signer", old, "--pcrs", "7", "--cluster", "m", "--out", dir)
	auth := devtest.FileKey(t, root, "authority")
	next := "tpm:path=" + filepath.Join(root, "new.tpmkey") + ";" + sw.URIAttrs() + ";approvals=" + filepath.Join(root, "approvals")
	mustCeremony(t, nil, "rotate", "--signer", old, "--new-signer", next, "--policy-authority", auth, "--out", dir)
	if r := ceremony(t, nil, "rotate", "--finish", "--new-signer", next, "--policy-authority", auth, "--out", dir); r.code != 2 {
		t.Errorf("--policy-authority with --finish: %s", r)
	}
	mustCeremony(t, nil, "rotate", "--finish", "--new-signer", next, "--out", dir)
	st := fullStatus(t, next, filepath.Join(dir, certdir.FileCACert))
	if st.CA == nil || !st.CA.KeyMatches || st.SignedPolicy == nil || st.SignedPolicy.Matching == "" {
		t.Fatalf("after the migration: %+v %+v", st.CA, st.SignedPolicy)
	}
	sw.ExtendPCR(t, 7, []byte("update"))
	mustCeremony(t, nil, "policy", "approve", "--authority", auth, "--signer", next, "--dir", dir)
	if st := fullStatus(t, next, filepath.Join(dir, certdir.FileCACert)); !st.PolicySatisfied {
		t.Fatalf("the migrated key does not survive a PCR change: %s", st.PolicyError)
	}
}

// TestSystemdCompatibleInit: the authority is made with policy authority
// create (RSA, to share with systemd-measure); init --systemd-compatible
// creates a key whose policy names the empty policyRef and PCR 11,
// approves today's PCR 11 with it and self-signs the CA through it;
// status shows the binding with its warning and the authority's
// systemd-measure pkfp. Approvals over PCR 7 are refused for that key.
func TestSystemdCompatibleInit(t *testing.T) {
	requireScheme(t, "tpm")
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	root := t.TempDir()
	auth := "file:" + filepath.Join(root, "pcr-signing.key")
	created := mustCeremony(t, nil, "policy", "authority", "create", "--key", auth, "--algorithm", "rsa2048", "--public-out", filepath.Join(root, "pcr-signing.pub"))
	if !strings.Contains(created.stdout, "systemd pkfp: ") {
		t.Fatalf("authority create: %s", created)
	}
	dir := filepath.Join(root, "ceremony")
	uri := "tpm:path=" + filepath.Join(root, "ca.tpmkey") + ";" + sw.URIAttrs() + ";approvals=" + filepath.Join(root, "approvals")
	r := mustCeremony(t, nil, "init", "--signer", uri, "--policy-authority", auth, "--systemd-compatible", "--cluster", "sd", "--out", dir)
	if !strings.Contains(r.stdout, `key policy: systemd (policyRef "", PCR selection sha256:11)`) {
		t.Errorf("init does not print the key's binding first:\n%s", r.stdout)
	}
	text := mustCeremony(t, nil, "status", "--signer", uri, "--ca", filepath.Join(dir, certdir.FileCACert))
	for _, want := range []string{`key policy:   systemd, policyRef "", PCR selection sha256:11`, "WARNING:      systemd-compatible key", "systemd-measure pkfp ", "PCR state:    11="} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("status lacks %q:\n%s", want, text.stdout)
		}
	}
	if r := ceremony(t, nil, "policy", "approve", "--authority", auth, "--key", filepath.Join(root, "ca.tpmkey"), "--pcr", "7="+strings.Repeat("ab", 32), "--out", filepath.Join(root, "p7.json")); r.code != 1 || !strings.Contains(r.stderr, "accepts only 11") {
		t.Errorf("approve over PCR 7 for a systemd key: %s", r)
	}
}
