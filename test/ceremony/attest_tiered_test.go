package ceremony_test

import (
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/attestation"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// enrolNode is a node of the attested tiered setup: its TPM has a
// vendor-style EK chain.
type enrolNode struct {
	sw                      *tpmsim.Swtpm
	dir, uri, csr, req      string
	ekRoots, rootOnly, root string
}

func newEnrolNode(t *testing.T, tr *tierRun) *enrolNode {
	t.Helper()
	ek := tpmsim.ProvisionEK(t)
	n := &enrolNode{sw: tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{StateDir: ek.StateDir}), dir: filepath.Join(tr.dir, "node-a")}
	n.uri = "tpm:path=" + filepath.Join(n.dir, "intermediate.tpmkey") + ";" + n.sw.URIAttrs()
	n.csr, n.req = filepath.Join(n.dir, "node.csr"), filepath.Join(n.dir, "node.attested.json")
	n.root = filepath.Join(tr.dir, "root")
	n.ekRoots, n.rootOnly = filepath.Join(tr.dir, "ek-roots.pem"), filepath.Join(tr.dir, "root-only.pem")
	writeFile(t, n.ekRoots, append(append([]byte{}, ek.RootPEM...), ek.IssuerPEM...))
	writeFile(t, n.rootOnly, ek.RootPEM)
	r := mustCeremony(t, nil, "intermediate", "request", "--signer", n.uri, "--name", "node-a", "--out", n.csr, "--attest", n.req)
	if strings.Contains(r.stdout, "()") || !strings.Contains(r.stdout, "take "+n.req+" (the attested request, not the PEM CSR)") || strings.Contains(r.stdout, "--csr "+n.csr) {
		t.Fatalf("request --attest must send the operator to the attested request, with the key's location:\n%s", r)
	}
	return n
}

// ekCertFile writes the node's EK certificate (from its attested
// request) as PEM, for --ek-pin.
func (n *enrolNode) ekCertFile(t *testing.T) string {
	t.Helper()
	req, err := attestation.ParseRequest(readFile(t, n.req))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(n.dir, "ek.pem")
	writeFile(t, path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: req.Evidence.EKCertificate}))
	return path
}

// sign runs intermediate sign --ek-roots on the root's host.
func (n *enrolNode) sign(t *testing.T, tr *tierRun, req, out string, extra ...string) result {
	t.Helper()
	args := []string{"intermediate", "sign", "--signer", tr.rootURI, "--ca", tr.rootCA, "--csr", req, "--out", out, "--dir", n.root, "--permitted-ip-ranges", "127.0.0.0/8"}
	return ceremony(t, nil, append(args, extra...)...)
}

// TestAttestedEnrolment: request --attest → sign --ek-roots → install →
// the daemon serves with the intermediate and Talos's worker client
// verifies to the root. Refused with another EK root, a tampered
// attestation, a CSR for another key, a wrong policy; install on a
// different TPM fails; plain sign records "not attested".
func TestAttestedEnrolment(t *testing.T) {
	requireScheme(t, "tpm")
	tr := newTierRun(t)
	n := newEnrolNode(t, tr)
	refusals := []struct {
		name, req, check string
		extra            []string
	}{
		{"another EK root", n.req, "ek-certificate", []string{"--ek-roots", n.rootOnly}},
		{"tampered attestation", tamperRequest(t, n, func(r *attestation.Request) { r.Evidence.Attest[len(r.Evidence.Attest)-1] ^= 1 }), "attestation-signature", []string{"--ek-roots", n.ekRoots}},
		{"CSR for another key", tamperRequest(t, n, func(r *attestation.Request) { r.CSR = foreignCSR(t, n.dir) }), "qualifying-data", []string{"--ek-roots", n.ekRoots}},
		{"imported key presented as attested", tamperRequest(t, n, func(r *attestation.Request) {
			r.Evidence.KeyPublic[7] &^= 0x32 /* fixedTPM|fixedParent|sensitiveDataOrigin, as an imported key has */
		}), "certified-name", []string{"--ek-roots", n.ekRoots}},
		{"wrong policy", n.req, "key-policy", []string{"--ek-roots", n.ekRoots, "--policy-authority", devtest.FileKey(t, n.dir, "authority")}},
	}
	sealed := filepath.Join(n.dir, "issuer.sealed.json")
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			r := n.sign(t, tr, tc.req, sealed, tc.extra...)
			if r.code != 1 || !strings.Contains(r.stderr, "check "+tc.check) {
				t.Fatalf("want exit 1 naming %s:\n%s", tc.check, r)
			}
			if _, err := os.Stat(sealed); err == nil {
				t.Fatal("a refused enrolment wrote its output")
			}
		})
	}
	if r := n.sign(t, tr, n.csr, sealed, "--ek-roots", n.ekRoots); r.code != 2 || !strings.Contains(r.stderr, "plain PEM certificate request") || !strings.Contains(r.stderr, ".attested.json") {
		t.Fatalf("the PEM CSR given with --ek-roots: %s", r)
	}
	if r := n.sign(t, tr, n.req, sealed); r.code != 2 || !strings.Contains(r.stderr, "is an attested request") || !strings.Contains(r.stderr, "add --ek-roots") {
		t.Fatalf("the attested request given without --ek-roots: %s", r)
	}
	if r := n.sign(t, tr, n.req, sealed, "--ek-roots", n.ekRoots, "--ek-pin", n.ekCertFile(t)); r.code != 0 || !strings.Contains(r.stdout, "intermediate confirm --proof") {
		t.Fatalf("attested sign: %s", r)
	}
	t.Run("another TPM cannot install", func(t *testing.T) {
		other := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
		r := ceremony(t, nil, "intermediate", "install", "--signer", "tpm:path="+filepath.Join(n.dir, "intermediate.tpmkey")+";"+other.URIAttrs(),
			"--in", sealed, "--out", filepath.Join(n.dir, "stolen.crt"), "--dir", filepath.Join(n.dir, "other"))
		if r.code != 1 || !strings.Contains(r.stderr, "sealed to another TPM (this TPM's EK is ") || strings.Contains(r.stderr, "TPM failure") {
			t.Fatalf("install on another TPM: %s", r)
		}
	})
	certDir := filepath.Join(n.dir, "certs")
	mustCeremony(t, nil, "intermediate", "install", "--signer", n.uri, "--in", sealed, "--out", filepath.Join(certDir, certdir.FileIssuerChain), "--dir", n.dir)
	proof := filepath.Join(n.dir, "issuer.activation.json")
	if r := mustCeremony(t, nil, "intermediate", "confirm", "--proof", proof, "--dir", n.root); !strings.Contains(r.stdout, "attested") {
		t.Fatalf("confirm: %s", r)
	}
	for _, f := range []string{certdir.FileCACert, certdir.FileToken} {
		writeFile(t, filepath.Join(certDir, f), readFile(t, filepath.Join(n.root, f)))
	}
	d := startDaemon(t, certDir, n.uri)
	apid(t, d, workerConfig(t, filepath.Join(n.root, certdir.FileWorkerPatch)))

	mustCeremony(t, nil, "intermediate", "sign", "--signer", tr.rootURI, "--ca", tr.rootCA, "--csr", n.csr, "--out", filepath.Join(n.dir, "plain.crt"), "--dir", n.root)
	checkEnrolReceipts(t, n)
}

// checkEnrolReceipts: the root's receipts record each attempt and its
// outcome; the node's the attested request and the installation.
func checkEnrolReceipts(t *testing.T, n *enrolNode) {
	t.Helper()
	got := outcomes(t, n.root, "intermediate.")
	want := []string{"intermediate.enrol refused ek-certificate", "intermediate.enrol refused attestation-signature",
		"intermediate.enrol refused qualifying-data", "intermediate.enrol refused certified-name", "intermediate.enrol refused key-policy",
		"intermediate.enrol authorized pending activation", "intermediate.confirm attested attested", "intermediate.sign  not attested"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("root receipts:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	node := strings.Join(outcomes(t, n.dir, "intermediate."), "|")
	if !strings.Contains(node, "intermediate.attest") || !strings.Contains(node, "intermediate.install installed") {
		t.Errorf("node receipts: %s", node)
	}
}

// outcomes lists "operation outcome check[ attestation]" of the receipts
// whose operation starts with prefix.
func outcomes(t *testing.T, dir, prefix string) []string {
	t.Helper()
	rs, err := keystore.ReadReceipts(keystore.OSDir{Root: dir})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		if !strings.HasPrefix(string(r.Operation), prefix) || r.Operation == "intermediate.request" || r.Operation == "intermediate.key" {
			continue
		}
		s := string(r.Operation) + " " + r.Details["outcome"] + " " + r.Details["check"]
		for _, a := range []string{"not attested", "pending activation", "attested"} {
			if strings.HasPrefix(r.Details["attestation"], a) {
				s += a
				break
			}
		}
		out = append(out, s)
	}
	return out
}

// tamperRequest writes a copy of the node's attested request changed by edit.
func tamperRequest(t *testing.T, n *enrolNode, edit func(*attestation.Request)) string {
	t.Helper()
	r, err := attestation.ParseRequest(readFile(t, n.req))
	if err != nil {
		t.Fatal(err)
	}
	edit(r)
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(n.dir, "tampered-*.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// foreignCSR is the DER of a CSR for a software key.
func foreignCSR(t *testing.T, dir string) []byte {
	t.Helper()
	path := filepath.Join(dir, "foreign.csr")
	writeCSR(t, path, "node-a")
	block, _ := pem.Decode(readFile(t, path))
	if block == nil {
		t.Fatal("no PEM CSR")
	}
	return block.Bytes
}
