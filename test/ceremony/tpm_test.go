package ceremony_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
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
	st = status(t, nil, uri, caCrt)
	if !st.PolicyChecked || st.PolicySatisfied {
		t.Errorf("after extending PCR 11, status says satisfied=%v", st.PolicySatisfied)
	}
	r := ceremony(t, nil, "status", "--signer", uri, "--ca", caCrt)
	if r.code != 0 || !strings.Contains(r.stdout, "NOT satisfied") {
		t.Errorf("text status:\n%s", r)
	}
	csr := filepath.Join(root, "u.csr")
	writeCSR(t, csr, "carol")
	r = ceremony(t, nil, "sign-csr", "--signer", uri, "--ca", caCrt, "--csr", csr, "--out", filepath.Join(root, "u.crt"))
	if r.code != 1 || !strings.Contains(r.stderr, "policy") {
		t.Errorf("sign-csr with unsatisfied policy: want exit 1 mentioning the policy:\n%s", r)
	}
}
