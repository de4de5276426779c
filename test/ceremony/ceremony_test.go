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
	lr := &lifecycleRun{
		t: t, b: b, env: env, initArgs: initArgs, root: root, dir: dir,
		caCrt: filepath.Join(dir, certdir.FileCACert), patch: filepath.Join(dir, certdir.FileWorkerPatch),
	}
	oldURI, newURI := uri("os-ca"), uri("os-ca-next")

	lr.init(oldURI)
	// The daemon serves the ceremony directory with the device key.
	lr.run("server-cert", "--signer", oldURI, "--ca", lr.caCrt, "--san", "127.0.0.1,localhost", "--out", dir)
	d := startDaemon(t, dir, oldURI, env...)
	if r := ceremony(t, env, "doctor", "--machineconfig", lr.patch, "--endpoint", d.Addr); r.code != 0 {
		t.Fatalf("doctor against a healthy daemon: %s", r)
	}
	oldTC := lr.clients(d, oldURI)

	// Rotation: both CAs' clients work during the overlap.
	lr.run(append([]string{"rotate", "--signer", oldURI, "--new-signer", newURI, "--out", dir}, initArgs...)...)
	d.Stop(t)
	d = startDaemon(t, dir, oldURI, env...)
	newTC := filepath.Join(root, "new.talosconfig")
	lr.run("talosconfig", "--signer", newURI, "--ca", filepath.Join(dir, certdir.FileNextCACert), "--context", "e2e", "--endpoints", "127.0.0.1", "--out", newTC)
	srv, n := apid(t, d, workerConfig(t, lr.patch))
	if n != 2 {
		t.Errorf("bundle during rotation has %d CAs, want 2", n)
	}
	login(t, readFile(t, oldTC), srv, true, "os:admin")
	login(t, readFile(t, newTC), srv, true, "os:admin")

	lr.finishRotation(d, newURI, oldTC, newTC)
	lr.checkReceipts(newURI)
	lr.checkNoSecrets(secrets)
}

// lifecycleRun is the state one lifecycle run shares between its steps:
// the backend's environment, the ceremony directory and every command
// output, which must hold no secret.
type lifecycleRun struct {
	t             *testing.T
	b             backend
	env, initArgs []string
	root, dir     string
	caCrt, patch  string
	outputs       []string
}

// run runs a ceremony command that must succeed and keeps its output.
func (lr *lifecycleRun) run(args ...string) {
	lr.t.Helper()
	lr.outputs = append(lr.outputs, mustCeremony(lr.t, lr.env, args...).stdout)
}

// init creates the CA with uri, checks that a re-run finds it done and
// that status reports the key and, on a TPM, its PCR policy.
func (lr *lifecycleRun) init(uri string) {
	t := lr.t
	t.Helper()
	args := append([]string{"init", "--signer", uri, "--cluster", "e2e", "--out", lr.dir}, lr.initArgs...)
	lr.run(args...)
	if r := mustCeremony(t, lr.env, args...); !strings.Contains(r.stdout, "already completed") {
		t.Errorf("init re-run did not detect the completed init:\n%s", r)
	}
	st := status(t, lr.env, uri, lr.caCrt)
	if st.Key.Backend != lr.b.name || st.Key.Extractable != lr.b.extractable || st.CA == nil || !st.CA.KeyMatches {
		t.Errorf("status after init: %+v", st)
	}
	if lr.b.policy && (!st.PolicyChecked || !st.PolicySatisfied || !strings.Contains(st.Key.Policy, "7") || st.Key.PolicyDigest == "") {
		t.Errorf("TPM policy status: checked %v satisfied %v policy %q digest %q", st.PolicyChecked, st.PolicySatisfied, st.Key.Policy, st.Key.PolicyDigest)
	}
}

// clients issues a talosconfig and signs a CSR with uri, checks both the
// way apid checks clients against daemon d, and returns the talosconfig's
// path.
func (lr *lifecycleRun) clients(d *daemon, uri string) string {
	t := lr.t
	t.Helper()
	tc := filepath.Join(lr.root, "old.talosconfig")
	lr.run("talosconfig", "--signer", uri, "--ca", lr.caCrt, "--context", "e2e", "--endpoints", "127.0.0.1", "--out", tc)
	if st, err := os.Stat(tc); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("talosconfig mode: %v %v", st, err)
	}
	srv, n := apid(t, d, workerConfig(t, lr.patch))
	if n != 1 {
		t.Errorf("bundle before rotation has %d CAs", n)
	}
	login(t, readFile(t, tc), srv, true, "os:admin")
	csr, userCrt := filepath.Join(lr.root, "user.csr"), filepath.Join(lr.root, "user.crt")
	writeCSR(t, csr, "alice")
	lr.run("sign-csr", "--signer", uri, "--ca", lr.caCrt, "--csr", csr, "--roles", "os:reader,os:etcd:backup", "--out", userCrt)
	lr.checkUserCert(userCrt)
	return tc
}

// checkUserCert checks that the certificate sign-csr wrote to path is a
// client certificate for alice that chains to os-ca.crt.
func (lr *lifecycleRun) checkUserCert(path string) {
	t := lr.t
	t.Helper()
	user, err := pki.ParseCertificate(readFile(t, path))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := apidtest.VerifyClient(user); err != nil || user.Subject.CommonName != "alice" {
		t.Errorf("sign-csr certificate: %v %v", err, user.Subject)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(readFile(t, lr.caCrt))
	if _, err := user.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("sign-csr certificate does not chain to os-ca.crt: %v", err)
	}
}

// finishRotation finishes the rotation to newURI, restarts daemon d with
// the new key and checks that only the new CA's clients (newTC) get in.
func (lr *lifecycleRun) finishRotation(d *daemon, newURI, oldTC, newTC string) {
	t := lr.t
	t.Helper()
	lr.run("rotate", "--finish", "--new-signer", newURI, "--out", lr.dir)
	d.Stop(t)
	d = startDaemon(t, lr.dir, newURI, lr.env...)
	if r := ceremony(t, lr.env, "doctor", "--machineconfig", lr.patch, "--endpoint", d.Addr); r.code != 0 {
		t.Fatalf("doctor after the rotation: %s", r)
	}
	srv, n := apid(t, d, workerConfig(t, lr.patch))
	if n != 1 {
		t.Errorf("bundle after rotation has %d CAs, want 1", n)
	}
	login(t, readFile(t, newTC), srv, true, "os:admin")
	login(t, readFile(t, oldTC), srv, false, "")
}

// checkReceipts checks, through status with uri, that every command left
// a complete receipt, in order.
func (lr *lifecycleRun) checkReceipts(uri string) {
	t := lr.t
	t.Helper()
	st := status(t, lr.env, uri, lr.caCrt)
	var ops []string
	for _, r := range st.Receipts {
		ops = append(ops, string(r.Operation))
		if r.Backend != lr.b.name || r.KeyFingerprint == "" || r.ToolVersion == "" {
			t.Errorf("receipt %+v", r)
		}
	}
	if got, want := strings.Join(ops, " "), "init.key init server-cert talosconfig sign-csr rotate.key rotate talosconfig rotate.finish"; got != want {
		t.Errorf("receipts %q, want %q", got, want)
	}
}

// checkNoSecrets checks that neither the token nor any of secrets appears
// in a receipt or a command output.
func (lr *lifecycleRun) checkNoSecrets(secrets []string) {
	t := lr.t
	t.Helper()
	token := strings.TrimSpace(string(readFile(t, filepath.Join(lr.dir, certdir.FileToken))))
	outputs := lr.outputs
	receipts, _ := os.ReadDir(filepath.Join(lr.dir, certdir.DirReceipts))
	for _, e := range receipts {
		outputs = append(outputs, string(readFile(t, filepath.Join(lr.dir, certdir.DirReceipts, e.Name()))))
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
			importGenerated(t, b, env, uri("imported"), root)
			importTalosEd25519(t, b, env, uri("talos-ed25519"), filepath.Join(root, "ed"))
		})
	}
}

// importGenerated imports the CA that gencreds makes into uri, checks that
// import tells to destroy the source and that the imported key signs.
func importGenerated(t *testing.T, b backend, env []string, uri, root string) {
	t.Helper()
	src := filepath.Join(root, "src")
	gc := runTool(t, filepath.Join(binDir, "steward-trustd-gencreds"), "-cluster", "imp", "-output", src)
	if gc != "" {
		t.Fatal(gc)
	}
	out := filepath.Join(root, "p256")
	r := mustCeremony(t, env, "import", "--signer", uri, "--key", filepath.Join(src, "os-ca.key"), "--cert", filepath.Join(src, "os-ca.crt"), "--out", out)
	if !strings.Contains(r.stdout, "shred -u "+filepath.Join(src, "os-ca.key")) {
		t.Errorf("import does not tell to destroy the source:\n%s", r)
	}
	st := status(t, env, uri, filepath.Join(out, certdir.FileCACert))
	if st.Key.Extractable != b.extractable || !st.CA.KeyMatches {
		t.Errorf("imported key status %+v", st)
	}
	csr := filepath.Join(root, "u.csr")
	writeCSR(t, csr, "bob")
	mustCeremony(t, env, "sign-csr", "--signer", uri, "--ca", filepath.Join(out, certdir.FileCACert), "--csr", csr, "--roles", "os:reader", "--out", filepath.Join(root, "u.crt"))
}

// importTalosEd25519 imports Talos's default OS CA, which is Ed25519, into
// uri: a backend that holds Ed25519 keeps the cluster's token, any other
// refuses with the alternatives and writes nothing to out.
func importTalosEd25519(t *testing.T, b backend, env []string, uri, out string) {
	t.Helper()
	secrets := filepath.Join("..", "..", "keystore", "testdata", "talos-secrets.yaml")
	forWorkers := filepath.Join(t.TempDir(), "secrets-for-workers.yaml")
	r := ceremony(t, env, "import", "--signer", uri, "--talos-secrets", secrets, "--talos-secrets-out", forWorkers, "--out", out)
	if b.ed25519 {
		if r.code != 0 {
			t.Fatalf("Ed25519 import: %s", r)
		}
		if tok := strings.TrimSpace(string(readFile(t, filepath.Join(out, certdir.FileToken)))); tok != "oamejv.9tk1nhuwnlc2nghf" {
			t.Errorf("the cluster's trustd token was not kept: %q", tok)
		}
		if !keystore.IsTalosWorkerSecrets(readFile(t, forWorkers), readFile(t, secrets)) || !strings.Contains(r.stdout, "--with-secrets "+forWorkers+" --config-patch-worker @") {
			t.Errorf("no worker secrets file, or no talosctl command naming it:\n%s", r)
		}
		return
	}
	if r.code != 1 || !strings.Contains(r.stderr, "cannot hold Ed25519") || !strings.Contains(r.stderr, "init --algorithm p256") || !strings.Contains(r.stderr, "EdDSA") {
		t.Errorf("Ed25519 into %s: want exit 1 with the alternatives:\n%s", b.name, r)
	}
	if _, err := os.Stat(out); err == nil {
		if entries, _ := os.ReadDir(out); len(entries) != 0 {
			t.Errorf("refused import left files: %v", entries)
		}
	}
}
