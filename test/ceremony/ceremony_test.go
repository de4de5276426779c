package ceremony_test

import (
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-trustd/steward-trustd/internal/apidtest"
	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/pki"
	"github.com/steward-trustd/steward-trustd/keystore"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/softhsm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// backend provisions a signing device for one test.
type backend struct {
	name string
	// setup returns a key URI maker, the environment subprocesses need,
	// extra flags for init/rotate, and secrets that must appear in no
	// output.
	setup       func(t *testing.T) (uri func(name string) string, env, initArgs, secrets []string)
	extractable bool
	policy      bool
	ed25519     bool
}

var backends = []backend{
	{
		name: "file",
		setup: func(t *testing.T) (func(string) string, []string, []string, []string) {
			dir := t.TempDir()
			return func(n string) string { return "file:" + filepath.Join(dir, n+".key") }, nil, nil, nil
		},
		extractable: true,
		ed25519:     true,
	},
	{
		name: "pkcs11",
		setup: func(t *testing.T) (func(string) string, []string, []string, []string) {
			tok, err := softhsm.New(t.TempDir(), "ceremony")
			if err != nil {
				if softhsm.Required() {
					t.Fatalf("SoftHSMv2 is required (CI=true or STEWARD_REQUIRE_DEVICES=1): %v", err)
				}
				t.Skipf("SoftHSMv2 not available and not required: %v", err)
			}
			return func(n string) string { return tok.URI(n, nil) }, []string{tok.Env()}, nil, []string{tok.PIN, tok.SOPIN}
		},
		ed25519: true,
	},
	{
		name: "tpm",
		setup: func(t *testing.T) (func(string) string, []string, []string, []string) {
			requireScheme(t, "tpm")
			sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
			dir := t.TempDir()
			return func(n string) string {
				return "tpm:path=" + filepath.Join(dir, n+".tpmkey") + ";" + sw.URIAttrs()
			}, nil, []string{"--pcrs", "7"}, nil
		},
		policy: true,
	},
}

// requireScheme skips (or, when devices are required, fails) a test whose
// backend is not linked into this build of the binaries.
func requireScheme(t *testing.T, scheme string) {
	t.Helper()
	r := ceremony(t, nil, "status", "--signer", scheme+":probe")
	if strings.Contains(r.stderr, "unknown scheme") {
		if tpmsim.DevicesRequired() {
			t.Fatalf("the %s backend is not registered in cmd/internal/backends: %s", scheme, r.stderr)
		}
		t.Skipf("the %s backend is not registered in this build", scheme)
	}
}

type statusJSON struct {
	Key struct {
		Backend      string `json:"backend"`
		Extractable  bool   `json:"extractable"`
		Policy       string `json:"policy"`
		PolicyDigest string `json:"policyDigest"`
		Fingerprint  string `json:"fingerprint"`
	} `json:"key"`
	PolicyChecked   bool `json:"policyChecked"`
	PolicySatisfied bool `json:"policySatisfied"`
	CA              *struct {
		KeyMatches bool   `json:"keyMatches"`
		Subject    string `json:"subject"`
	} `json:"ca"`
	Receipts []keystore.Receipt `json:"receipts"`
}

func status(t *testing.T, env []string, uri, ca string) statusJSON {
	t.Helper()
	r := mustCeremony(t, env, "status", "--signer", uri, "--ca", ca, "--output", "json")
	var st statusJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status json: %v\n%s", err, r)
	}
	return st
}

func TestLifecycle(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { lifecycle(t, b) })
	}
}

// lifecycle runs every ceremony command against one backend, with the
// daemon serving the ceremony directory, through a full CA rotation.
func lifecycle(t *testing.T, b backend) {
	uri, env, initArgs, secrets := b.setup(t)
	root := t.TempDir()
	dir := filepath.Join(root, "ceremony")
	caCrt := filepath.Join(dir, certdir.FileCACert)
	patch := filepath.Join(dir, certdir.FileWorkerPatch)
	oldURI, newURI := uri("os-ca"), uri("os-ca-next")
	var outputs []string

	// init, and a re-run that finds it done.
	outputs = append(outputs, mustCeremony(t, env, append([]string{"init", "--signer", oldURI, "--cluster", "e2e", "--out", dir}, initArgs...)...).stdout)
	if r := mustCeremony(t, env, append([]string{"init", "--signer", oldURI, "--cluster", "e2e", "--out", dir}, initArgs...)...); !strings.Contains(r.stdout, "already completed") {
		t.Errorf("init re-run did not detect the completed init:\n%s", r)
	}
	st := status(t, env, oldURI, caCrt)
	if st.Key.Backend != b.name || st.Key.Extractable != b.extractable || st.CA == nil || !st.CA.KeyMatches {
		t.Errorf("status after init: %+v", st)
	}
	if b.policy && (!st.PolicyChecked || !st.PolicySatisfied || !strings.Contains(st.Key.Policy, "7") || st.Key.PolicyDigest == "") {
		t.Errorf("TPM policy status: checked %v satisfied %v policy %q digest %q", st.PolicyChecked, st.PolicySatisfied, st.Key.Policy, st.Key.PolicyDigest)
	}

	// The daemon serves the ceremony directory with the device key.
	outputs = append(outputs, mustCeremony(t, env, "server-cert", "--signer", oldURI, "--ca", caCrt, "--san", "127.0.0.1,localhost", "--out", dir).stdout)
	d := startDaemon(t, dir, oldURI, env...)
	if r := ceremony(t, env, "doctor", "--machineconfig", patch, "--endpoint", d.Addr); r.code != 0 {
		t.Fatalf("doctor against a healthy daemon: %s", r)
	}

	// talosconfig and sign-csr, checked the way apid checks clients.
	oldTC := filepath.Join(root, "old.talosconfig")
	outputs = append(outputs, mustCeremony(t, env, "talosconfig", "--signer", oldURI, "--ca", caCrt, "--context", "e2e", "--endpoints", "127.0.0.1", "--out", oldTC).stdout)
	if st, err := os.Stat(oldTC); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("talosconfig mode: %v %v", st, err)
	}
	srv, n := apid(t, d, workerConfig(t, patch))
	if n != 1 {
		t.Errorf("bundle before rotation has %d CAs", n)
	}
	login(t, readFile(t, oldTC), srv, true, "os:admin")
	csr, userCrt := filepath.Join(root, "user.csr"), filepath.Join(root, "user.crt")
	writeCSR(t, csr, "alice")
	outputs = append(outputs, mustCeremony(t, env, "sign-csr", "--signer", oldURI, "--ca", caCrt, "--csr", csr, "--roles", "os:reader,os:etcd:backup", "--out", userCrt).stdout)
	user, err := pki.ParseCertificate(readFile(t, userCrt))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := apidtest.VerifyClient(user); err != nil || user.Subject.CommonName != "alice" {
		t.Errorf("sign-csr certificate: %v %v", err, user.Subject)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(readFile(t, caCrt))
	if _, err := user.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("sign-csr certificate does not chain to os-ca.crt: %v", err)
	}

	// Rotation: both CAs' clients work during the overlap.
	outputs = append(outputs, mustCeremony(t, env, append([]string{"rotate", "--new-signer", newURI, "--out", dir}, initArgs...)...).stdout)
	d.Stop(t)
	d = startDaemon(t, dir, oldURI, env...)
	newTC := filepath.Join(root, "new.talosconfig")
	outputs = append(outputs, mustCeremony(t, env, "talosconfig", "--signer", newURI, "--ca", filepath.Join(dir, certdir.FileNextCACert), "--context", "e2e", "--endpoints", "127.0.0.1", "--out", newTC).stdout)
	srv, n = apid(t, d, workerConfig(t, patch))
	if n != 2 {
		t.Errorf("bundle during rotation has %d CAs, want 2", n)
	}
	login(t, readFile(t, oldTC), srv, true, "os:admin")
	login(t, readFile(t, newTC), srv, true, "os:admin")

	// Finish: the daemon signs with the new key; old-CA clients are out.
	outputs = append(outputs, mustCeremony(t, env, "rotate", "--finish", "--new-signer", newURI, "--out", dir).stdout)
	d.Stop(t)
	d = startDaemon(t, dir, newURI, env...)
	if r := ceremony(t, env, "doctor", "--machineconfig", patch, "--endpoint", d.Addr); r.code != 0 {
		t.Fatalf("doctor after the rotation: %s", r)
	}
	srv, n = apid(t, d, workerConfig(t, patch))
	if n != 1 {
		t.Errorf("bundle after rotation has %d CAs, want 1", n)
	}
	login(t, readFile(t, newTC), srv, true, "os:admin")
	login(t, readFile(t, oldTC), srv, false, "")

	st = status(t, env, newURI, caCrt)
	var ops []string
	for _, r := range st.Receipts {
		ops = append(ops, r.Operation)
		if r.Backend != b.name || r.KeyFingerprint == "" || r.ToolVersion == "" {
			t.Errorf("receipt %+v", r)
		}
	}
	if got, want := strings.Join(ops, " "), "init.key init server-cert talosconfig sign-csr rotate.key rotate talosconfig rotate.finish"; got != want {
		t.Errorf("receipts %q, want %q", got, want)
	}
	// No secret in any receipt or output.
	token := strings.TrimSpace(string(readFile(t, filepath.Join(dir, certdir.FileToken))))
	receipts, _ := os.ReadDir(filepath.Join(dir, certdir.DirReceipts))
	for _, e := range receipts {
		outputs = append(outputs, string(readFile(t, filepath.Join(dir, certdir.DirReceipts, e.Name()))))
	}
	for _, s := range append(secrets, token) {
		for _, o := range outputs {
			if strings.Contains(o, s) {
				t.Errorf("a secret appears in a receipt or output: %.40s", o)
			}
		}
	}
}

func login(t *testing.T, tc []byte, srv *apidtest.Server, want bool, roles string) {
	t.Helper()
	got, err := apidtest.Login(tc, srv.Addr(), "127.0.0.1")
	switch {
	case want && err != nil:
		t.Errorf("client refused: %v", err)
	case want && got != roles:
		t.Errorf("roles %q, want %q", got, roles)
	case !want && err == nil:
		t.Errorf("client accepted with roles %q, want refused", got)
	}
}

func TestImport(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			uri, env, _, _ := b.setup(t)
			root := t.TempDir()
			src := filepath.Join(root, "src")
			gc := runTool(t, filepath.Join(binDir, "steward-trustd-gencreds"), "-cluster", "imp", "-output", src)
			if gc != "" {
				t.Fatal(gc)
			}
			out := filepath.Join(root, "p256")
			r := mustCeremony(t, env, "import", "--signer", uri("imported"), "--key", filepath.Join(src, "os-ca.key"), "--cert", filepath.Join(src, "os-ca.crt"), "--out", out)
			if !strings.Contains(r.stdout, "shred -u "+filepath.Join(src, "os-ca.key")) {
				t.Errorf("import does not tell to destroy the source:\n%s", r)
			}
			st := status(t, env, uri("imported"), filepath.Join(out, certdir.FileCACert))
			if st.Key.Extractable != b.extractable || !st.CA.KeyMatches {
				t.Errorf("imported key status %+v", st)
			}
			csr := filepath.Join(root, "u.csr")
			writeCSR(t, csr, "bob")
			mustCeremony(t, env, "sign-csr", "--signer", uri("imported"), "--ca", filepath.Join(out, certdir.FileCACert), "--csr", csr, "--roles", "os:reader", "--out", filepath.Join(root, "u.crt"))

			// Talos's default OS CA is Ed25519.
			secrets := filepath.Join("..", "..", "keystore", "testdata", "talos-secrets.yaml")
			edOut := filepath.Join(root, "ed")
			r = ceremony(t, env, "import", "--signer", uri("talos-ed25519"), "--talos-secrets", secrets, "--out", edOut)
			if b.ed25519 {
				if r.code != 0 {
					t.Fatalf("Ed25519 import: %s", r)
				}
				if tok := strings.TrimSpace(string(readFile(t, filepath.Join(edOut, certdir.FileToken)))); tok != "oamejv.9tk1nhuwnlc2nghf" {
					t.Errorf("the cluster's trustd token was not kept: %q", tok)
				}
				return
			}
			if r.code != 1 || !strings.Contains(r.stderr, "cannot hold Ed25519") || !strings.Contains(r.stderr, "init --algorithm p256") || !strings.Contains(r.stderr, "EdDSA") {
				t.Errorf("Ed25519 into %s: want exit 1 with the alternatives:\n%s", b.name, r)
			}
			if _, err := os.Stat(edOut); err == nil {
				if entries, _ := os.ReadDir(edOut); len(entries) != 0 {
					t.Errorf("refused import left files: %v", entries)
				}
			}
		})
	}
}
