package tpm_test

import (
	"testing"

	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
)

// TestRevokeDoesNotOvershootAnotherRevoke: two runs of policy revoke
// --before E on one node (an operator's retry while the first still runs,
// two ceremony directories) must leave the counter at E, not advance it
// once per run: a counter past E kills the approvals just written at E,
// and every node stops signing. The second run here happens between the
// first run's increments (its progress callback).
func TestRevokeDoesNotOvershootAnotherRevoke(t *testing.T) {
	f := newRevocableFixture(t, tpmpolicy.DefaultRevocationIndex)
	s := f.generate(t)
	e0 := epochOf(t, s)
	before := e0 + 3
	other := false
	from, to, err := s.Revoke(ctx, before, func(uint64) {
		if other {
			return
		}
		other = true
		if _, _, err := s.Revoke(ctx, before, nil); err != nil {
			t.Errorf("the other revoke: %v", err)
		}
	})
	if err != nil || from != e0 {
		t.Fatalf("Revoke(%d) = %d, %d, %v", before, from, to, err)
	}
	if got := epochOf(t, s); got != before || to != before {
		t.Errorf("after two revokes --before %d the counter is at %d (reported %d), want exactly %d", before, got, to, before)
	}
}
