package ceremony_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// TestTPMPolicyStatus: after PCR 7 changes, status reports the policy as
// not satisfied and signing operations fail with exit code 1.
func TestTPMPolicyStatus(t *testing.T) {
	requireScheme(t, "tpm")
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	root := t.TempDir()
	uri := "tpm:path=" + filepath.Join(root, "ca.tpmkey") + ";" + sw.URIAttrs()
	dir := filepath.Join(root, "ceremony")
	mustCeremony(t, nil, "init", "--signer", uri, "--cluster", "pcr", "--pcrs", "7,11", "--out", dir)
	caCrt := filepath.Join(dir, certdir.FileCACert)
	st := status(t, nil, uri, caCrt)
	if !st.PolicyChecked || !st.PolicySatisfied || st.Key.Extractable {
		t.Fatalf("fresh key: %+v", st)
	}
	if len(st.Receipts) != 2 || st.Receipts[1].PolicyDigest == "" || st.Receipts[1].PolicyDigest != st.Key.PolicyDigest {
		t.Errorf("init receipt does not record the policy digest: %+v", st.Receipts)
	}

	sw.ExtendPCR(t, 11, []byte("a different boot"))
	r := ceremony(t, nil, "status", "--signer", uri, "--ca", caCrt, "--output", "json")
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != 1 {
		t.Fatalf("json status with the policy failing: want the report and exit 1: %v\n%s", err, r)
	}
	if !st.PolicyChecked || st.PolicySatisfied {
		t.Errorf("after extending PCR 11, status says satisfied=%v", st.PolicySatisfied)
	}
	r = ceremony(t, nil, "status", "--signer", uri, "--ca", caCrt)
	if r.code != 1 || !strings.Contains(r.stdout, "NOT satisfied") || !strings.Contains(r.stderr, "policy is not satisfied") {
		t.Errorf("text status with the policy failing: want the report and exit 1:\n%s", r)
	}
	csr := filepath.Join(root, "u.csr")
	writeCSR(t, csr, "carol")
	r = ceremony(t, nil, "sign-csr", "--signer", uri, "--ca", caCrt, "--csr", csr, "--roles", "os:reader", "--out", filepath.Join(root, "u.crt"))
	if r.code != 1 || !strings.Contains(r.stderr, "policy") {
		t.Errorf("sign-csr with unsatisfied policy: want exit 1 mentioning the policy:\n%s", r)
	}
}

// TestTPMKilledInitLeaksNoSlots kills init on swtpm (no resource manager,
// like /dev/tpm0) right after the CA was signed through the TPM, when the
// process holds its key and a policy session loaded; other dead clients
// fill the rest of swtpm's object memory. A fresh init must still create
// its key (key creation reclaims the dead clients' handles on
// TPM_RC_OBJECT_MEMORY), the killed init must resume, and nothing may
// stay loaded.
func TestTPMKilledInitLeaksNoSlots(t *testing.T) {
	requireScheme(t, "tpm")
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{NoResourceManager: true})
	root := t.TempDir()
	uri := func(n string) string { return "tpm:path=" + filepath.Join(root, n+".tpmkey") + ";" + sw.URIAttrs() }
	args := func(n string) []string {
		return []string{"init", "--signer", uri(n), "--cluster", "tpm", "--out", filepath.Join(root, n)}
	}
	r, _, steps := crashRun(t, root, 0, args("traced"))
	if r.code != 0 {
		t.Fatalf("traced init: %s", r)
	}
	at := slices.Index(steps, "init CA signed") + 1
	if at == 0 {
		t.Fatalf("no crash point %q in %v", "init CA signed", steps)
	}
	if r, ok, _ := crashRun(t, root, at, args("killed")); !ok {
		t.Fatalf("init not killed at %q: %s", steps[at-1], r)
	}
	if n := loadedHandles(t, sw, 0); n == 0 {
		t.Fatal("the killed init left no handle loaded; the test does not test what it should")
	}
	if n := loadedHandles(t, sw, 2); n < 3 {
		t.Fatalf("%d handles loaded; the test needs swtpm's object memory full", n)
	}
	mustCeremony(t, nil, args("fresh")...)
	if r := mustCeremony(t, nil, args("killed")...); !strings.Contains(r.stdout, "resumed: ") {
		t.Errorf("init after the kill did not resume:\n%s", r)
	}
	sw.CheckNoLeaks(t)
}

// loadedHandles has a client that dies without flushing leave extra
// primary keys in swtpm, then counts the transient objects and sessions
// it holds.
func loadedHandles(t *testing.T, sw *tpmsim.Swtpm, extra int) int {
	t.Helper()
	c, err := sw.Dial(context.Background(), sw.Device())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range extra {
		if _, err := (tpm2.CreatePrimary{
			PrimaryHandle: tpm2.AuthHandle{Handle: tpm2.TPMRHOwner, Auth: tpm2.PasswordAuth(nil)},
			InPublic:      tpm2.New2B(tpm2.ECCSRKTemplate),
		}).Execute(c); err != nil {
			t.Fatal(err)
		}
	}
	hs, err := tpm.LoadedHandles(c)
	if err != nil {
		t.Fatal(err)
	}
	return len(hs)
}
