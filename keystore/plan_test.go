package keystore

import (
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/keyutil"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/signer"
)

// The plans are pure: these tests build states in memory and never touch
// a device or a file.

func testCA(t *testing.T) (*signer.Description, []byte) {
	t.Helper()
	key, err := keyutil.GenerateKey(rand.Reader, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCACertificate(key, pki.CAOptions{Cluster: "plan"}, time.Now(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	fp, _ := signer.Fingerprint(key.Public())
	desc := &signer.Description{Backend: "file", Algorithm: "ECDSA-P256", Fingerprint: fp}
	return desc, pki.EncodeCertificates(ca)
}

func emptyState() *state {
	return &state{dir: OSDir{Root: "/plan"}, files: map[string][]byte{}, intents: map[Operation]*intent{}}
}

// withFiles returns a state holding files (parsed as readState does).
func withFiles(t *testing.T, files []File, receipts ...Receipt) *state {
	t.Helper()
	st := emptyState()
	for _, f := range files {
		if !f.Remove {
			st.files[f.Name] = f.Data
		}
	}
	if err := st.parse(); err != nil {
		t.Fatal(err)
	}
	st.receipts = receipts
	return st
}

func TestPlanInit(t *testing.T) {
	key, caPEM := testCA(t)
	ca, err := pki.ParseCertificate(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	done, err := clusterFiles("plan", ca, nil, "oldtoken", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	initReceipt := Receipt{Operation: "init", KeyFingerprint: key.Fingerprint, CertificateFingerprint: pki.CertFingerprint(ca)}
	resumedKey := []string{"key was created by an earlier run"}
	tests := []struct {
		name      string
		st        *state
		resumed   []string
		force     bool
		wantErr   error
		wantDone  bool
		wantToken string
	}{
		{"fresh directory", emptyState(), nil, false, nil, false, "newtoken"},
		{"complete earlier run", withFiles(t, done, initReceipt), resumedKey, false, nil, true, ""},
		{"files written, receipt missing", withFiles(t, done), resumedKey, false, nil, false, "oldtoken"},
		// done[0] removes a trust statement, done[1] is os-ca.crt, done[2] the token.
		{"only os-ca.crt written keeps no token", withFiles(t, done[:2]), resumedKey, false, nil, false, "newtoken"},
		{"another init's files", withFiles(t, done[2:3]), nil, false, ErrExists, false, ""},
		{"another init's files, --force", withFiles(t, done[2:3]), nil, true, nil, false, "newtoken"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := planInit(tt.st, InitOptions{Cluster: "plan", Force: tt.force}, initResults{key: *key, keyResumed: tt.resumed, ca: ca, newToken: "newtoken"})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if p.alreadyDone != tt.wantDone {
				t.Fatalf("alreadyDone = %v", p.alreadyDone)
			}
			if tt.wantDone {
				return
			}
			if got := string(fileData(p.files, certdir.FileToken)); got != tt.wantToken+"\n" {
				t.Errorf("token %q, want %q", got, tt.wantToken)
			}
			if p.receipt.Operation != "init" || p.receipt.CertificateFingerprint != pki.CertFingerprint(ca) || p.receipt.KeyFingerprint != key.Fingerprint {
				t.Errorf("receipt %+v", p.receipt)
			}
		})
	}
}

func fileData(files []File, name string) []byte {
	for _, f := range files {
		if f.Name == name {
			return f.Data
		}
	}
	return nil
}

func TestFinishing(t *testing.T) {
	_, oldPEM := testCA(t)
	key, nextPEM := testCA(t)
	old, _ := pki.ParseCertificate(oldPEM)
	next, _ := pki.ParseCertificate(nextPEM)
	tok := File{Name: certdir.FileToken, Data: []byte("tok")}
	rotated := Receipt{Operation: "rotate", CertificateFingerprint: pki.CertFingerprint(next), Details: map[string]string{"currentCAFingerprint": pki.CertFingerprint(old)}}
	finished := Receipt{Operation: "rotate.finish", KeyFingerprint: key.Fingerprint, CertificateFingerprint: pki.CertFingerprint(next)}
	caFile := func(pem []byte) File { return File{Name: certdir.FileCACert, Data: pem} }
	nextFile := File{Name: certdir.FileNextCACert, Data: nextPEM}
	tests := []struct {
		name         string
		st           *state
		wantErr      error
		wantSwitched bool
		wantDone     bool
		wantRetired  string
		wantFiles    int // 0: not checked; else only removals are left (statement, accepted-cas.crt, os-ca.next.crt)
	}{
		{"no rotation", withFiles(t, []File{caFile(oldPEM), tok}), ErrNoRotation, false, false, "", 0},
		{"rotation in progress", withFiles(t, []File{caFile(oldPEM), nextFile, tok}, rotated), nil, false, false, pki.CertFingerprint(old), 0},
		{"killed after os-ca.crt was switched", withFiles(t, []File{caFile(nextPEM), nextFile, tok}, rotated), nil, true, false, pki.CertFingerprint(old), 0},
		{"killed after the receipt", withFiles(t, []File{caFile(nextPEM), nextFile, tok}, rotated, finished), nil, true, false, pki.CertFingerprint(old), 3},
		{"finished", withFiles(t, []File{caFile(nextPEM), tok}, rotated, finished), nil, true, true, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := finishing(tt.st)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if f.switched != tt.wantSwitched || f.done != tt.wantDone || f.retired != tt.wantRetired {
				t.Fatalf("finish %+v", f)
			}
			p, err := planFinish(tt.st, f, *key, nil, vouched{})
			if err != nil {
				t.Fatal(err)
			}
			if p.alreadyDone != tt.wantDone {
				t.Errorf("alreadyDone = %v", p.alreadyDone)
			}
			if tt.wantDone {
				return
			}
			if last := p.files[len(p.files)-1]; last.Name != certdir.FileNextCACert || !last.Remove {
				t.Errorf("the last step is %+v, want the removal of %s", last, certdir.FileNextCACert)
			}
			if tt.wantFiles > 0 && (len(p.files) != tt.wantFiles || !p.unrecorded) {
				t.Errorf("after a recorded finish: files %v, unrecorded %v", fileNames(OSDir{Root: "/nowhere"}, p.files), p.unrecorded)
			}
		})
	}
}

func TestPlanIssue(t *testing.T) {
	desc, caPEM := testCA(t)
	ca, err := pki.ParseCertificate(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	dir := OSDir{Root: "/nowhere"}
	is := issuance{
		op: "server-cert", key: *desc, cert: ca,
		details: map[string]string{"sans": "10.0.0.1"},
		outputs: []placement{
			{Dir: dir, File: File{Name: certdir.FileServerKey}},
			{Dir: dir, File: File{Name: certdir.FileServerCert}},
		},
	}
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.FixedZone("x", 3600))
	p := is.plan()
	stampReceipt(p, dir, now, "v1")
	r := p.receipt
	want := []string{"/nowhere/" + certdir.FileServerKey, "/nowhere/" + certdir.FileServerCert}
	switch {
	case r.Operation != "server-cert" || r.ToolVersion != "v1" || !r.Time.Equal(now) || r.Time.Location() != time.UTC:
		t.Errorf("receipt header %+v", r)
	case r.KeyFingerprint != desc.Fingerprint || r.CertificateFingerprint != pki.CertFingerprint(ca):
		t.Errorf("receipt fingerprints %q %q", r.KeyFingerprint, r.CertificateFingerprint)
	case len(r.Files) != 2 || r.Files[0] != want[0] || r.Files[1] != want[1]:
		t.Errorf("receipt files %v, want %v (outputs in order)", r.Files, want)
	case r.Details["sans"] != "10.0.0.1":
		t.Errorf("receipt details %v", r.Details)
	}
}

func TestTalosconfigFile(t *testing.T) {
	_, caPEM := testCA(t)
	ca, err := pki.ParseCertificate(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		nodes     []string
		wantNodes string
	}{
		{"nodes default to the endpoints", nil, "10.0.0.1"},
		{"nodes given", []string{"10.0.0.7"}, "10.0.0.7"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := TalosconfigOptions{CA: ca, Context: "prod", Endpoints: []string{"10.0.0.1"}, Nodes: c.nodes}
			data, err := talosconfigFile(o, ca, []byte("KEY"))
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := clientconfig.FromBytes(data)
			if err != nil {
				t.Fatal(err)
			}
			ctx := cfg.Contexts["prod"]
			if cfg.Context != "prod" || ctx == nil || strings.Join(ctx.Nodes, ",") != c.wantNodes || strings.Join(ctx.Endpoints, ",") != "10.0.0.1" {
				t.Errorf("talosconfig:\n%s", data)
			}
		})
	}
}
