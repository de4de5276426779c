package keystore_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/attestation"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer"
)

// TestIntermediate: a node's key and request, the root's signature, the
// checks the daemon applies, and the refusal of a key of unknown origin.
func TestIntermediate(t *testing.T) {
	c := newCeremony(t)
	ctx := context.Background()
	root := t.TempDir()
	rootURI, rd := initCA(t, c, root)
	node := keystore.OSDir{Root: filepath.Join(root, "node")}
	if err := os.MkdirAll(node.Root, 0o700); err != nil {
		t.Fatal(err)
	}
	nodeURI := "file:" + filepath.Join(root, "node", "intermediate.key")
	req := keystore.IntermediateRequestOptions{SignerURI: nodeURI, Name: "node-a", Out: keystore.Target{Dir: node, Name: "node.csr"}}
	if _, err := c.IntermediateRequest(ctx, node, req); err != nil {
		t.Fatal(err)
	}
	out, err := c.IntermediateRequest(ctx, node, req)
	if err != nil || len(out.Resumed) == 0 {
		t.Fatalf("a re-run did not find its own key: %v %+v", err, out)
	}
	_, ranges, _ := net.ParseCIDR("10.0.0.0/8")
	sign := keystore.IntermediateSignOptions{SignerURI: rootURI, CA: mustCA(t, rd, certdir.FileCACert), CSR: readFile(t, filepath.Join(node.Root, "node.csr")),
		PermittedIPRanges: []*net.IPNet{ranges}, Out: keystore.Target{Dir: node, Name: certdir.FileIssuerChain}}
	cert, _, err := c.IntermediateSign(ctx, rd, sign)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "node-a" || pki.DescribeEKU(cert) != "[ServerAuth]" || !cert.MaxPathLenZero || len(cert.PermittedIPRanges) != 1 {
		t.Errorf("intermediate %s eku %s ranges %v", cert.Subject, pki.DescribeEKU(cert), cert.PermittedIPRanges)
	}
	if _, _, err := c.IntermediateSign(ctx, rd, sign); err == nil {
		t.Error("issuer.crt replaced without Force")
	}
	st, err := c.Status(ctx, nodeURI, sign.CA, node, cert)
	if err != nil || !st.KeyMatches() || st.ChainError != "" || st.Chain[0].EKU != "[ServerAuth]" {
		t.Errorf("status: %+v %v", st, err)
	}
	ops := strings.Join(receiptOps(t, node), ",")
	if !strings.Contains(ops, "intermediate.key") || !strings.Contains(ops, "intermediate.request") {
		t.Errorf("node receipts %s", ops)
	}
	if !strings.Contains(strings.Join(receiptOps(t, rd), ","), "intermediate.sign") {
		t.Error("no intermediate.sign receipt in the root's directory")
	}
	checkForeignKey(t, c, rootURI, node)
	tc := keystore.TalosconfigOptions{SignerURI: nodeURI, CA: cert, Context: "rogue", Endpoints: []string{"127.0.0.1"}, Roles: []string{"os:admin"},
		Out: keystore.Target{Dir: node, Name: "rogue.talosconfig"}}
	if out, err := c.Talosconfig(ctx, node, tc); err != nil || !strings.Contains(strings.Join(out.Notes, "\n"), "without ClientAuth") {
		t.Errorf("a talosconfig under the ServerAuth-only intermediate gave no warning: %v", err)
	}
}

// checkForeignKey: a key nobody recorded is refused unless reused on
// purpose.
func checkForeignKey(t *testing.T, c *keystore.Ceremony, foreignURI string, node keystore.OSDir) {
	t.Helper()
	req := keystore.IntermediateRequestOptions{SignerURI: foreignURI, Name: "x", Out: keystore.Target{Dir: node, Name: "x.csr"}}
	if _, err := c.IntermediateRequest(context.Background(), node, req); !errors.Is(err, keystore.ErrForeignKey) || !strings.Contains(err.Error(), "--reuse-key") {
		t.Errorf("foreign key: %v", err)
	}
	req.ReuseKey = true
	if _, err := c.IntermediateRequest(context.Background(), node, req); err != nil {
		t.Errorf("--reuse-key: %v", err)
	}
	csr, err := pki.ParseCSR(readFile(t, filepath.Join(node.Root, "x.csr")), 0)
	if err != nil || csr.Subject.CommonName != "x" {
		t.Errorf("reused key's request: %v", err)
	}
}

// TestReceiptSequenceAfterResume: an interrupted run's intent record sits
// in the receipts directory; resuming it must not give two receipts the
// same sequence number (they list in the order they were written).
func TestReceiptSequenceAfterResume(t *testing.T) {
	c := newCeremony(t)
	root := t.TempDir()
	node := keystore.OSDir{Root: root}
	uri := "file:" + filepath.Join(root, "intermediate.key")
	if err := os.MkdirAll(filepath.Join(root, certdir.DirReceipts), 0o700); err != nil {
		t.Fatal(err)
	}
	intent := `{"operation":"intermediate.key","address":"` + uri + `","algorithm":"p256","time":"2026-01-01T00:00:00Z","toolVersion":"test"}`
	if err := os.WriteFile(filepath.Join(root, certdir.DirReceipts, "intermediate.key.intent"), []byte(intent), 0o644); err != nil {
		t.Fatal(err)
	}
	req := keystore.IntermediateRequestOptions{SignerURI: uri, Name: "node-a", Out: keystore.Target{Dir: node, Name: "node.csr"}}
	if _, err := c.IntermediateRequest(context.Background(), node, req); err != nil {
		t.Fatal(err)
	}
	names, err := node.List(certdir.DirReceipts)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, n := range names {
		seq, _, _ := strings.Cut(n, "-")
		if prev, ok := seen[seq]; ok {
			t.Errorf("receipts %s and %s share sequence number %s", prev, n, seq)
		}
		seen[seq] = n
	}
}

// requestedNode is a root (its key URI and ceremony directory) and a
// node directory holding node.csr for a file key at nodeURI.
func requestedNode(t *testing.T, c *keystore.Ceremony) (rootURI string, rd, node keystore.OSDir, nodeURI string) {
	t.Helper()
	root := t.TempDir()
	rootURI, rd = initCA(t, c, root)
	node = keystore.OSDir{Root: filepath.Join(root, "node")}
	nodeURI = "file:" + filepath.Join(root, "intermediate.key")
	req := keystore.IntermediateRequestOptions{SignerURI: nodeURI, Name: "node-a", Out: keystore.Target{Dir: node, Name: "node.csr"}}
	if _, err := c.IntermediateRequest(context.Background(), node, req); err != nil {
		t.Fatal(err)
	}
	return rootURI, rd, node, nodeURI
}

// TestIntermediateRotateRefusesCurrentKey: a rotation to the key that
// issuer.crt already certifies is no rotation; it is refused before any
// request is written, as the root's rotation refuses the current CA key.
func TestIntermediateRotateRefusesCurrentKey(t *testing.T) {
	c := newCeremony(t)
	ctx := context.Background()
	rootURI, rd, node, nodeURI := requestedNode(t, c)
	sign := keystore.IntermediateSignOptions{SignerURI: rootURI, CA: mustCA(t, rd, certdir.FileCACert), CSR: readFile(t, filepath.Join(node.Root, "node.csr")),
		Out: keystore.Target{Dir: node, Name: certdir.FileIssuerChain}}
	if _, _, err := c.IntermediateSign(ctx, rd, sign); err != nil {
		t.Fatal(err)
	}
	_, err := c.IntermediateRotate(ctx, node, keystore.IntermediateRequestOptions{SignerURI: nodeURI, Name: "node-a"})
	if !errors.Is(err, signer.ErrKeyExists) || !strings.Contains(err.Error(), "current intermediate") {
		t.Errorf("rotation to the current key: %v", err)
	}
	if _, err := os.Stat(filepath.Join(node.Root, certdir.FileNextIssuerCSR)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s written for the current key: %v", certdir.FileNextIssuerCSR, err)
	}
}

// TestIntermediateRequestKeepsOtherFiles: --out is replaced only when it
// holds a certificate request; a key there (even the one the request is
// for) stays, and the refusal says to pick another file.
func TestIntermediateRequestKeepsOtherFiles(t *testing.T) {
	c := newCeremony(t)
	ctx := context.Background()
	for name, existing := range map[string]bool{"the new key itself": false, "another file": true} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			node := keystore.OSDir{Root: root}
			keyPath := filepath.Join(root, "intermediate.key")
			out := keyPath
			if existing {
				out = filepath.Join(root, "server.key")
				if err := os.WriteFile(out, []byte("-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			before, _ := os.ReadFile(out)
			req := keystore.IntermediateRequestOptions{SignerURI: "file:" + keyPath, Name: "node-a", Out: keystore.Target{Dir: node, Name: filepath.Base(out)}}
			if _, err := c.IntermediateRequest(ctx, node, req); err == nil || !strings.Contains(err.Error(), "not a certificate request") {
				t.Errorf("request over %s: %v", out, err)
			}
			if after, _ := os.ReadFile(out); existing && string(after) != string(before) || strings.Contains(string(after), "REQUEST") {
				t.Errorf("%s was replaced by the request", out)
			}
			req.Out.Name = "node.csr"
			if _, err := c.IntermediateRequest(ctx, node, req); err != nil {
				t.Errorf("request to a fresh file: %v", err)
			}
			if _, err := c.IntermediateRequest(ctx, node, req); err != nil {
				t.Errorf("a request replacing the previous request: %v", err)
			}
		})
	}
}

// refuseAttester fails every call: a refused output must be refused
// before the TPM is asked.
type refuseAttester struct{ t *testing.T }

func (a refuseAttester) Attest(context.Context, string, []byte) (*attestation.Evidence, error) {
	a.t.Error("Attest called although --attest names a key file")
	return &attestation.Evidence{}, nil
}

func (a refuseAttester) ActivateCredential(context.Context, string, *attestation.Sealed) ([]byte, error) {
	return nil, errors.New("not used")
}

// TestIntermediateAttestKeepsOtherFiles: --attest replaces an attested
// request, never a key.
func TestIntermediateAttestKeepsOtherFiles(t *testing.T) {
	c := newCeremony(t)
	root := t.TempDir()
	node := keystore.OSDir{Root: root}
	keyURI := "file:" + filepath.Join(root, "intermediate.key")
	req := keystore.IntermediateRequestOptions{SignerURI: keyURI, Name: "node-a", Out: keystore.Target{Dir: node, Name: "node.csr"}}
	if _, err := c.IntermediateRequest(context.Background(), node, req); err != nil {
		t.Fatal(err)
	}
	before := readFile(t, filepath.Join(root, "intermediate.key"))
	o := keystore.IntermediateAttestOptions{SignerURI: keyURI, CSR: readFile(t, filepath.Join(root, "node.csr")), TPM: refuseAttester{t}, Out: keystore.Target{Dir: node, Name: "intermediate.key"}}
	if _, err := c.IntermediateAttest(context.Background(), node, o); err == nil || !strings.Contains(err.Error(), "not an attested request") {
		t.Errorf("--attest over a key: %v", err)
	}
	if string(readFile(t, filepath.Join(root, "intermediate.key"))) != string(before) {
		t.Error("the key was replaced by the attested request")
	}
}

// payloadAttester "activates" any sealed file to a fixed payload.
type payloadAttester struct{ payload []byte }

func (a payloadAttester) Attest(context.Context, string, []byte) (*attestation.Evidence, error) {
	return nil, errors.New("not used")
}

func (a payloadAttester) ActivateCredential(context.Context, string, *attestation.Sealed) ([]byte, error) {
	return a.payload, nil
}

// TestIntermediateInstallChecksProfile: install writes issuer.crt only
// if it is an intermediate the daemon would accept, as intermediate sign
// and rotate --intermediate --finish check it; a client certificate for
// the node's key (EKU ClientAuth, not a CA) is refused.
func TestIntermediateInstallChecksProfile(t *testing.T) {
	c := newCeremony(t)
	ctx := context.Background()
	rootURI, rd, node, nodeURI := requestedNode(t, c)
	rootKey, err := c.Keys.Open(ctx, rootURI)
	if err != nil {
		t.Fatal(err)
	}
	defer rootKey.Close()
	csr, err := pki.ParseCSR(readFile(t, filepath.Join(node.Root, "node.csr")), 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := pki.NewClientCertificate(mustCA(t, rd, certdir.FileCACert), rootKey, csr.PublicKey, "node-a", []string{"os:admin"}, 0, testNow, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := (&attestation.Sealed{Version: attestation.SealedVersion, AKName: []byte{1}, IDObject: []byte{1}, EncryptedSecret: []byte{1}}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	o := keystore.IntermediateInstallOptions{SignerURI: nodeURI, TPM: payloadAttester{pki.EncodeCertificates(leaf)}, Sealed: sealed, Out: keystore.Target{Dir: node, Name: certdir.FileIssuerChain}}
	if _, _, err := c.IntermediateInstall(ctx, node, o); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Errorf("install of a client certificate as issuer.crt: %v", err)
	}
	if err := os.WriteFile(filepath.Join(node.Root, certdir.FileCACert), readFile(t, filepath.Join(rd.Root, certdir.FileCACert)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.IntermediateInstall(ctx, node, o); err == nil || !strings.Contains(err.Error(), "would be refused by the daemon") {
		t.Errorf("install into a cert dir with os-ca.crt: %v", err)
	}
	if _, err := os.Stat(filepath.Join(node.Root, certdir.FileIssuerChain)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("issuer.crt written: %v", err)
	}
}

// TestIntermediateSignTellsTheNextStep: a first enrolment's intermediate
// goes in as issuer.crt; a rotation's (its request was issuer.next.csr,
// or it is written as issuer.next.crt) as issuer.next.crt, followed by
// rotate --intermediate --finish — never as issuer.crt, which the daemon
// on the old key would refuse.
func TestIntermediateSignTellsTheNextStep(t *testing.T) {
	c := newCeremony(t)
	rootURI, rd, node, _ := requestedNode(t, c)
	tests := []struct {
		name     string
		out      string
		rotation bool
		want     string
	}{
		{"enrolment", certdir.FileIssuerChain, false, "as issuer.crt (or $TRUSTD_ISSUER_CRT)"},
		{"rotation by output name", certdir.FileNextIssuerChain, false, "rotate --intermediate --finish"},
		{"rotation by request name", "node-a.crt", true, "as issuer.next.crt (not issuer.crt"},
	}
	for _, tt := range tests {
		sign := keystore.IntermediateSignOptions{SignerURI: rootURI, CA: mustCA(t, rd, certdir.FileCACert), CSR: readFile(t, filepath.Join(node.Root, "node.csr")),
			Out: keystore.Target{Dir: keystore.OSDir{Root: t.TempDir()}, Name: tt.out}, Rotation: tt.rotation}
		_, res, err := c.IntermediateSign(context.Background(), rd, sign)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if notes := strings.Join(res.Notes, "\n"); !strings.Contains(notes, tt.want) {
			t.Errorf("%s: notes %q, want %q", tt.name, notes, tt.want)
		}
	}
}
