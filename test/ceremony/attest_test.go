package ceremony_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// attestedNode is a swtpm with a vendor-style EK certificate chain and a
// single-tier CA made by init on it.
type attestedNode struct {
	sw                  *tpmsim.Swtpm
	root, uri, ca, dir  string
	ekRoots, otherRoots string
}

func newAttestedNode(t *testing.T) *attestedNode {
	t.Helper()
	requireScheme(t, "tpm")
	ek := tpmsim.ProvisionEK(t)
	n := &attestedNode{sw: tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{StateDir: ek.StateDir}), root: t.TempDir()}
	n.uri = "tpm:path=" + filepath.Join(n.root, "ca.tpmkey") + ";" + n.sw.URIAttrs()
	n.dir = filepath.Join(n.root, "ceremony")
	mustCeremony(t, nil, "init", "--signer", n.uri, "--cluster", "attest", "--out", n.dir)
	n.ca = filepath.Join(n.dir, certdir.FileCACert)
	n.ekRoots = filepath.Join(n.root, "ek-roots.pem")
	if err := os.WriteFile(n.ekRoots, append(append([]byte{}, ek.RootPEM...), ek.IssuerPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	// Only the issuing root of the chain, without the intermediate: the
	// EK certificate does not chain to it.
	n.otherRoots = filepath.Join(n.root, "root-only.pem")
	if err := os.WriteFile(n.otherRoots, ek.RootPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *attestedNode) file(name string) string { return filepath.Join(n.root, name) }

// TestAttestSingleTier: an auditor proves that init's CA key lives in the
// TPM holding a genuine EK, with the activation round trip; the same
// evidence is refused with another EK root or another nonce, and a
// different TPM cannot answer the challenge.
func TestAttestSingleTier(t *testing.T) {
	n := newAttestedNode(t)
	if st := fullStatus(t, n.uri, n.ca); !st.Attestable {
		t.Fatalf("status: key made by init not attestable: %s", st.Attestation)
	}
	const nonce = "00112233445566778899aabbccddeeff"
	ev, ch, resp := n.file("ev.json"), n.file("challenge.json"), n.file("response")
	mustCeremony(t, nil, "attest", "--signer", n.uri, "--ca", n.ca, "--nonce", nonce, "--out", ev)
	verify := []string{"verify-attestation", "--in", ev, "--ca", n.ca, "--nonce", nonce, "--ek-roots", n.ekRoots}
	r := mustCeremony(t, nil, append(verify, "--challenge-out", ch)...)
	if !strings.Contains(r.stdout, "attestation:  verified") || !strings.Contains(r.stdout, "swtpm-localca-rootca") {
		t.Errorf("verify-attestation output:\n%s", r)
	}

	t.Run("another TPM cannot answer", func(t *testing.T) {
		other := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
		r := ceremony(t, nil, "attest", "--signer", "tpm:path="+n.file("none.tpmkey")+";"+other.URIAttrs(), "--challenge", ch, "--out", n.file("bad-response"), "--dir", n.file("other"))
		if r.code != 1 || !strings.Contains(r.stderr, "another TPM") {
			t.Fatalf("want exit 1 naming another TPM:\n%s", r)
		}
	})
	mustCeremony(t, nil, "attest", "--signer", n.uri, "--challenge", ch, "--out", resp)
	mustCeremony(t, nil, append(verify, "--challenge", ch, "--response", resp)...)

	refusals := []struct {
		name, check string
		args        []string
	}{
		{"another EK root", "ek-certificate", []string{"verify-attestation", "--in", ev, "--ca", n.ca, "--nonce", nonce, "--ek-roots", n.otherRoots, "--challenge-out", n.file("c2")}},
		{"another nonce", "qualifying-data", []string{"verify-attestation", "--in", ev, "--ca", n.ca, "--nonce", "ff", "--ek-roots", n.ekRoots, "--challenge-out", n.file("c3")}},
		{"wrong golden PCRs", "pcr-digest", append(verify, "--challenge-out", n.file("c4"), "--pcr-digest", strings.Repeat("ab", 32))},
		{"wrong response", "credential", append(verify, "--challenge", ch, "--response", n.ekRoots)},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			r := ceremony(t, nil, tc.args...)
			if r.code != 1 || !strings.Contains(r.stderr, tc.check) {
				t.Fatalf("want exit 1 naming %s:\n%s", tc.check, r)
			}
			if _, err := os.Stat(n.file("c2")); err == nil {
				t.Fatal("a refused verification wrote its challenge")
			}
		})
	}
	checkAttestReceipts(t, n.dir)
}

// checkAttestReceipts: every attempt left a receipt with its outcome.
func checkAttestReceipts(t *testing.T, dir string) {
	t.Helper()
	rs, err := keystore.ReadReceipts(keystore.OSDir{Root: dir})
	if err != nil {
		t.Fatal(err)
	}
	var outcomes []string
	for _, r := range rs {
		if strings.HasPrefix(string(r.Operation), "verify-attestation") || r.Operation == "attest" {
			outcomes = append(outcomes, string(r.Operation)+":"+r.Details["outcome"]+":"+r.Details["check"])
		}
	}
	want := []string{"attest::", "verify-attestation:verified; activation challenge written:",
		"verify-attestation.activation:activated: the CA key is in the TPM holding this EK:",
		"verify-attestation:refused:ek-certificate", "verify-attestation:refused:qualifying-data",
		"verify-attestation:refused:pcr-digest", "verify-attestation.activation:refused:"}
	got, _ := json.Marshal(outcomes)
	if len(outcomes) != len(want) {
		t.Fatalf("receipts %s, want %d", got, len(want))
	}
	for i := range want {
		if !strings.HasPrefix(outcomes[i], want[i]) {
			t.Errorf("receipt %d: %q, want %q", i, outcomes[i], want[i])
		}
	}
}

// TestAttestImportedKeyRefused: an imported key (its private half was
// outside the TPM) is not attestable, and attest says so.
func TestAttestImportedKeyRefused(t *testing.T) {
	requireScheme(t, "tpm")
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	root := t.TempDir()
	fileDir := filepath.Join(root, "file")
	mustCeremony(t, nil, "init", "--signer", "file:"+filepath.Join(fileDir, "os-ca.key"), "--cluster", "imp", "--out", fileDir)
	uri := "tpm:path=" + filepath.Join(root, "imp.tpmkey") + ";" + sw.URIAttrs()
	dir := filepath.Join(root, "ceremony")
	mustCeremony(t, nil, "import", "--signer", uri, "--key", filepath.Join(fileDir, "os-ca.key"), "--cert", filepath.Join(fileDir, certdir.FileCACert), "--out", dir)
	ca := filepath.Join(dir, certdir.FileCACert)
	if st := fullStatus(t, uri, ca); st.Attestable || !strings.Contains(st.Attestation, "imported") {
		t.Fatalf("imported key: attestable=%v %q", st.Attestable, st.Attestation)
	}
	r := ceremony(t, nil, "attest", "--signer", uri, "--ca", ca, "--nonce", "01", "--out", filepath.Join(root, "ev.json"))
	if r.code != 1 || !strings.Contains(r.stderr, "not attestable") {
		t.Fatalf("attest of an imported key: %s", r)
	}
}

// TestAttestWhileDaemonServes: the ceremony must not take the TPM from
// the daemon. attest and attest
// --challenge share the TPM (through the relay, as on make run-local)
// with the daemon serving from it; the daemon's key and sessions are not
// touched, so worker requests before, between and after all succeed.
func TestAttestWhileDaemonServes(t *testing.T) {
	n := newAttestedNode(t)
	d := startDaemon(t, n.dir, n.uri)
	wc := workerConfig(t, filepath.Join(n.dir, certdir.FileWorkerPatch))
	workerCertificate(t, d.Addr, wc)
	const nonce = "0123456789abcdef"
	ev, ch := n.file("ev.json"), n.file("challenge.json")
	mustCeremony(t, nil, "attest", "--signer", n.uri, "--ca", n.ca, "--nonce", nonce, "--out", ev)
	workerCertificate(t, d.Addr, wc)
	mustCeremony(t, nil, "verify-attestation", "--in", ev, "--ca", n.ca, "--nonce", nonce, "--ek-roots", n.ekRoots, "--challenge-out", ch)
	mustCeremony(t, nil, "attest", "--signer", n.uri, "--challenge", ch, "--out", n.file("response"))
	workerCertificate(t, d.Addr, wc)
}

// TestRehearseUpgradeWithTPM2Tools is the README's run-local rehearsal:
// tpm2-tools reach the daemon's TPM through the relay; flushing "every"
// transient object leaves the daemon's key alone, and extending PCR 7
// (the update) makes the PCR 7-bound key refuse to sign, as the firmware
// update would.
func TestRehearseUpgradeWithTPM2Tools(t *testing.T) {
	requireScheme(t, "tpm")
	tools := map[string]string{}
	for _, name := range []string{"tpm2_pcrextend", "tpm2_flushcontext"} {
		tools[name] = tpmsim.RequireTool(t, name)
	}
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{Tools: true})
	root := t.TempDir()
	uri := "tpm:path=" + filepath.Join(root, "os-ca.tpmkey") + ";" + sw.URIAttrs() + ";pcrs=7"
	dir := filepath.Join(root, "certs")
	mustCeremony(t, nil, "init", "--signer", uri, "--cluster", "local", "--out", dir)
	d := startDaemon(t, dir, uri)
	wc := workerConfig(t, filepath.Join(dir, certdir.FileWorkerPatch))
	tpm2Tools := func(args ...string) {
		t.Helper()
		cmd := exec.Command(tools[args[0]], args[1:]...)
		cmd.Env = append(os.Environ(), "TPM2TOOLS_TCTI="+sw.TCTI())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	workerCertificate(t, d.Addr, wc)
	tpm2Tools("tpm2_flushcontext", "--transient-object")
	workerCertificate(t, d.Addr, wc)
	tpm2Tools("tpm2_pcrextend", "7:sha256="+strings.Repeat("ab", 32))
	if _, _, err := workerRequest(t, d.Addr, wc); grpcstatus.Code(err) != codes.Unavailable {
		t.Fatalf("after PCR 7 changed: %v, want Unavailable (the PCR 7-bound key no longer signs)", err)
	}
	for i := 0; !strings.Contains(d.Logs(), "PCR policy not satisfied"); i++ {
		if i == 100 {
			t.Fatalf("the daemon did not log why:\n%s", d.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
