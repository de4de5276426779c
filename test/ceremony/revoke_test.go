package ceremony_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// revocableSetup is an existing signed-policy (v2) key migrated by
// rotate --revocable / rotate --finish to a revocable key, on swtpm.
type revocableSetup struct {
	sw                             *tpmsim.Swtpm
	root, dir, auth, old, uri, key string
	approvals                      string
}

func newRevocableSetup(t *testing.T) *revocableSetup {
	t.Helper()
	requireScheme(t, "tpm")
	s := &revocableSetup{sw: tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{}), root: t.TempDir()}
	s.dir = filepath.Join(s.root, "ceremony")
	s.auth = devtest.FileKey(t, s.root, "authority")
	s.old = "tpm:path=" + filepath.Join(s.root, "old.tpmkey") + ";" + s.sw.URIAttrs() + ";approvals=" + filepath.Join(s.root, "old-approvals")
	mustCeremony(t, nil, "init", "--signer", s.old, "--policy-authority", s.auth, "--cluster", "r", "--out", s.dir)
	s.key = filepath.Join(s.root, "new.tpmkey")
	s.approvals = filepath.Join(s.root, "approvals")
	s.uri = "tpm:path=" + s.key + ";" + s.sw.URIAttrs() + ";approvals=" + s.approvals
	r := mustCeremony(t, nil, "rotate", "--signer", s.old, "--new-signer", s.uri, "--policy-authority", s.auth, "--revocable", "--out", s.dir)
	if !strings.Contains(r.stdout, `r1 (policyRef "steward-trustd/r1:000080:005354"`) {
		t.Fatalf("rotate --revocable did not print the revocable key policy:\n%s", r)
	}
	mustCeremony(t, nil, "rotate", "--finish", "--new-signer", s.uri, "--out", s.dir)
	return s
}

// status is the JSON status of uri, whatever its exit code (1 while the
// key's policy is not satisfied, as after a revoke).
func (s *revocableSetup) status(t *testing.T, uri string) keystore.Status {
	t.Helper()
	r := ceremony(t, nil, "status", "--signer", uri, "--ca", filepath.Join(s.dir, certdir.FileCACert), "--output", "json")
	var st keystore.Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.SignedPolicy == nil || st.SignedPolicy.Revocation == nil && uri == s.uri {
		t.Fatalf("status json: %v\n%s", err, r)
	}
	return st
}

// TestRevocableMigrationRevokeWithDaemon: a v2 key is migrated to a
// revocable one (rotate --revocable, rotate --finish) and the old key
// keeps working; the daemon signs with the initial approval; policy
// revoke --before E+1 makes it refuse (Unavailable, not a restart) with a
// log line naming the dead approval and the exact re-approve command;
// status lists the approval as dead; policy approve --signer writes at
// the new epoch and the daemon signs again without a restart.
func TestRevocableMigrationRevokeWithDaemon(t *testing.T) {
	s := newRevocableSetup(t)
	if st := s.status(t, s.old); !st.PolicySatisfied {
		t.Fatalf("the old signed-policy key stopped working: %s", st.PolicyError)
	}
	st := s.status(t, s.uri)
	rev := st.SignedPolicy.Revocation
	if rev == nil || rev.Index != "0x01005354" || rev.Epoch == 0 || len(rev.Live) != 1 || len(rev.Dead) != 0 || !st.PolicySatisfied {
		t.Fatalf("status of the migrated key: %+v %+v", st.SignedPolicy, rev)
	}
	e := rev.Epoch
	d := startDaemon(t, s.dir, s.uri, "TRUSTD_PEER_RATE=-1")
	wc := workerConfig(t, filepath.Join(s.dir, certdir.FileWorkerPatch))
	if c := requestCode(t, d.Addr, wc); c != codes.OK {
		t.Fatalf("initial approval: %v\n%s", c, d.Logs())
	}

	r := mustCeremony(t, nil, "policy", "revoke", "--signer", s.uri, "--before", strconv.FormatUint(e+1, 10))
	if !strings.Contains(r.stdout, fmt.Sprintf("advanced from %d to %d", e, e+1)) {
		t.Errorf("revoke output:\n%s", r)
	}
	eventually(t, "the revoked approval refused", func() bool { return requestCode(t, d.Addr, wc) == codes.Unavailable })
	want := fmt.Sprintf("policy approve --authority AUTHORITY_URI --key %s --epoch %d --pcr 7=", s.key, e+1)
	eventually(t, "the daemon logs the revocation and "+want, func() bool {
		logs := d.Logs()
		return strings.Contains(logs, "was revoked") && strings.Contains(logs, want)
	})
	if rev := s.status(t, s.uri).SignedPolicy.Revocation; rev.Epoch != e+1 || len(rev.Live) != 0 || len(rev.Dead) != 1 {
		t.Errorf("status after revoke: %+v", rev)
	}
	mustCeremony(t, nil, "policy", "approve", "--authority", s.auth, "--signer", s.uri, "--dir", s.dir)
	eventually(t, "signing at the new epoch", func() bool { return requestCode(t, d.Addr, wc) == codes.OK })
	if rev := s.status(t, s.uri).SignedPolicy.Revocation; len(rev.Live) != 1 || len(rev.Dead) != 1 {
		t.Errorf("status after re-approval: %+v", rev)
	}
	text := mustCeremony(t, nil, "status", "--signer", s.uri, "--ca", filepath.Join(s.dir, certdir.FileCACert)).stdout
	for _, want := range []string{fmt.Sprintf("revocation:   counter NV 0x01005354, epoch %d", e+1), "  dead:       initial-", fmt.Sprintf(".json@%d", e)} {
		if !strings.Contains(text, want) {
			t.Errorf("text status lacks %q:\n%s", want, text)
		}
	}
	checkRevocationRefusals(t, s, e)
}

// checkRevocationRefusals: approve at a revoked epoch, approve --key of a
// revocable key without --epoch, and revoke of a key that is not
// revocable are refused with what to do.
func checkRevocationRefusals(t *testing.T, s *revocableSetup, revoked uint64) {
	t.Helper()
	if r := ceremony(t, nil, "policy", "approve", "--authority", s.auth, "--signer", s.uri, "--epoch", strconv.FormatUint(revoked, 10), "--dir", s.dir); r.code != 1 || !strings.Contains(r.stderr, "not the key's current epoch") {
		t.Errorf("approve at the revoked epoch: %s", r)
	}
	if r := ceremony(t, nil, "policy", "approve", "--authority", s.auth, "--key", s.key, "--pcr", "7="+strings.Repeat("00", 32), "--out", filepath.Join(s.root, "x.json")); r.code != 2 || !strings.Contains(r.stderr, "--epoch") {
		t.Errorf("approve --key of a revocable key without --epoch: %s", r)
	}
	if r := ceremony(t, nil, "policy", "revoke", "--signer", s.old, "--before", "5"); r.code != 1 || !strings.Contains(r.stderr, "not revocable") {
		t.Errorf("revoke of a key that is not revocable: %s", r)
	}
}

// TestPolicyRevokeKilledAtEveryStep: policy revoke killed (SIGKILL) at
// each of its crash points — after each counter increment, around its
// receipt — and run again ends with the counter exactly at --before and
// a complete receipt; a finished revoke run again changes nothing.
func TestPolicyRevokeKilledAtEveryStep(t *testing.T) {
	s := newRevocableSetup(t)
	e := s.status(t, s.uri).SignedPolicy.Revocation.Epoch
	target := e
	for killAt := 1; ; killAt++ {
		target += 2
		args := []string{"policy", "revoke", "--signer", s.uri, "--before", strconv.FormatUint(target, 10)}
		r, killed, steps := crashRun(t, s.root, killAt, args)
		if !killed {
			if r.code != 0 || killAt < 3 {
				t.Fatalf("run with kill at %d finished after %d steps: %s", killAt, len(steps), r)
			}
			break
		}
		mustCeremony(t, nil, args...)
		if got := s.status(t, s.uri).SignedPolicy.Revocation.Epoch; got != target {
			t.Fatalf("killed at step %d (%s), re-run: epoch %d, want %d", killAt, steps[len(steps)-1], got, target)
		}
	}
	again := mustCeremony(t, nil, "policy", "revoke", "--signer", s.uri, "--before", strconv.FormatUint(target, 10))
	if !strings.Contains(again.stdout, "already at") {
		t.Errorf("a finished revoke run again: %s", again)
	}
	checkRevokeReceipts(t, s.approvals)
}

// checkRevokeReceipts checks that every file in dir is a complete receipt.
func checkRevokeReceipts(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, certdir.DirReceipts))
	if err != nil || len(entries) == 0 {
		t.Fatalf("receipts: %v, %v", entries, err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, certdir.DirReceipts, e.Name()))
		var rc keystore.Receipt
		if err != nil || json.Unmarshal(data, &rc) != nil || rc.Operation != "policy.revoke" || rc.Details["epoch"] == "" {
			t.Errorf("receipt %s: %v %s", e.Name(), err, data)
		}
	}
}
