package keystore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

func TestApprove(t *testing.T) {
	c := newCeremony(t)
	dir := t.TempDir()
	authURI := "file:" + filepath.Join(dir, "authority.key")
	auth, err := c.Keys.Generate(context.Background(), authURI, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	auth.Close()
	approvals, receipts := keystore.OSDir{Root: filepath.Join(dir, "approvals")}, keystore.OSDir{Root: filepath.Join(dir, "ceremony")}
	for _, d := range []string{approvals.Root, receipts.Root} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	b := pcr7Binding(t)
	o := keystore.ApproveOptions{
		AuthorityURI: authURI, Binding: b, PCRs: []int{7}, Values: [][]byte{bytes.Repeat([]byte{7}, 32)},
		Source: "pcr", Note: "BIOS 1.2.3", Out: keystore.Target{Dir: approvals, Name: "bios.json"},
	}
	out, err := c.Approve(context.Background(), receipts, o)
	if err != nil {
		t.Fatal(err)
	}
	var f tpmpolicy.ApprovalFile
	if err := json.Unmarshal(readFile(t, filepath.Join(approvals.Root, "bios.json")), &f); err != nil || len(f.SHA256) != 1 {
		t.Fatalf("approval file: %v", err)
	}
	a := f.SHA256[0]
	if a.Note != "BIOS 1.2.3" || a.Ref != b.Ref() || a.ApprovedBy != out.Receipt.KeyFingerprint || a.PKFP != out.Receipt.KeyFingerprint {
		t.Errorf("approval %+v", a)
	}
	rs, err := keystore.ReadReceipts(receipts)
	if err != nil || len(rs) != 1 || rs[0].Operation != "policy.approve" || rs[0].Details["pol"] != a.Pol || rs[0].Details["source"] != "pcr" || rs[0].Details["binding"] != b.String() {
		t.Fatalf("receipts %+v, %v", rs, err)
	}
	if _, err := c.Approve(context.Background(), receipts, o); err == nil {
		t.Fatal("an existing approval was overwritten without Force")
	}
	o.Force = true
	if _, err := c.Approve(context.Background(), receipts, o); err != nil {
		t.Fatalf("with Force: %v", err)
	}
	checkApproveRefusesOtherSelection(t, c, receipts, o)
	o.AuthorityURI = "file:" + filepath.Join(dir, "missing.key")
	if _, err := c.Approve(context.Background(), receipts, o); !errors.Is(err, signer.ErrKeyNotFound) {
		t.Fatalf("missing authority: %v", err)
	}
}

// checkApproveRefusesOtherSelection: the key's binding fixes the PCR
// selection; an approval over another one is refused before signing.
func checkApproveRefusesOtherSelection(t *testing.T, c *keystore.Ceremony, receipts keystore.Dir, o keystore.ApproveOptions) {
	t.Helper()
	o.PCRs, o.Values, o.Out.Name = []int{7, 11}, [][]byte{bytes.Repeat([]byte{7}, 32), bytes.Repeat([]byte{11}, 32)}, "wide.json"
	if _, err := c.Approve(context.Background(), receipts, o); err == nil || !strings.Contains(err.Error(), "not the key's") {
		t.Fatalf("an approval over another selection than the key's: %v", err)
	}
}

func pcr7Binding(t *testing.T) tpmpolicy.Binding {
	t.Helper()
	b, err := tpmpolicy.BindingForPCRs([]int{7})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
