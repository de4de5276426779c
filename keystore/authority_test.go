package keystore

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/file"
)

// fixedPCRs reads the same PCR values every time, as a TPM at rest does.
type fixedPCRs struct{ reads int }

func (f *fixedPCRs) ReadPCRValues(context.Context, string) ([]int, [][]byte, error) {
	f.reads++
	return []int{7}, [][]byte{make([]byte, 32)}, nil
}

func (f *fixedPCRs) RevocationCounter(context.Context, string) (uint64, error) {
	return 0, errors.New("fixedPCRs: no revocation counter (these keys are not revocable)")
}

// TestUnderAuthorities: the approval of today's PCR values is written
// once with its receipt; a re-run finds both and signs nothing; an
// approval without its receipt (a run killed between the two writes) is
// approved again and recorded; a key URI without approvals= is refused
// before anything is signed.
func TestUnderAuthorities(t *testing.T) {
	root := t.TempDir()
	reg, err := signer.NewRegistry(&file.Backend{})
	if err != nil {
		t.Fatal(err)
	}
	c := &Ceremony{Keys: reg, Rand: rand.Reader}
	auth := Authorities{URIs: []string{devtest.FileKey(t, root, "authority")}, PCRs: &fixedPCRs{}}
	approvals := filepath.Join(root, "approvals")
	uri := "tpm:path=" + filepath.Join(root, "ca.tpmkey") + ";approvals=" + approvals
	d := OSDir{Root: filepath.Join(root, "ceremony")}

	first := approveOnce(t, c, d, uri, auth)
	if len(first.Written) != 2 || len(first.Resumed) != 0 || !strings.Contains(first.Notes[0], "key policy: ") {
		t.Fatalf("first run: %+v", first)
	}
	if again := approveOnce(t, c, d, uri, auth); len(again.Written) != 0 || !strings.Contains(strings.Join(again.Resumed, "\n"), "written by an earlier run") {
		t.Fatalf("re-run: %+v", again)
	}
	if err := os.RemoveAll(filepath.Join(d.Root, "receipts")); err != nil {
		t.Fatal(err)
	}
	if unrecorded := approveOnce(t, c, d, uri, auth); len(unrecorded.Written) != 2 || !strings.Contains(strings.Join(unrecorded.Resumed, "\n"), "approved again") {
		t.Fatalf("approval without a receipt: %+v", unrecorded)
	}
	names, err := os.ReadDir(approvals)
	if err != nil || len(names) != 1 {
		t.Fatalf("approvals %v, %v: want one file", names, err)
	}

	st, err := readState(d)
	if err != nil {
		t.Fatal(err)
	}
	pcrs := auth.PCRs.(*fixedPCRs)
	before := pcrs.reads
	if _, err := c.underAuthorities(context.Background(), st, "tpm:path="+filepath.Join(root, "other.tpmkey"), auth); !errors.Is(err, signer.ErrInvalidURI) || pcrs.reads != before {
		t.Fatalf("no approvals=: %v (PCR reads %d -> %d), want ErrInvalidURI before any read", err, before, pcrs.reads)
	}
}

// approveOnce runs underAuthorities on a fresh read of d and returns what
// it reports.
func approveOnce(t *testing.T, c *Ceremony, d OSDir, uri string, a Authorities) Outcome {
	t.Helper()
	st, err := readState(d)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.underAuthorities(context.Background(), st, uri, a)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, ";authority=") {
		t.Fatalf("URI %q does not name the authority", out)
	}
	return st.earlier
}
