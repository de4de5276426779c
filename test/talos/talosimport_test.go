package talos

import (
	"bytes"
	stdx509 "crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	talosx509 "github.com/siderolabs/crypto/x509"
	"go.yaml.in/yaml/v4"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/doctor"
	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// talosBundle is secrets.Bundle of Talos v1.14.1
// (pkg/machinery/config/generate/secrets/secrets.go), field for field with
// siderolabs/crypto's own x509 types, decoded as secrets.LoadBundle decodes
// it (go.yaml.in/yaml/v4, no field tags: lowercased names). The machinery's
// config packages themselves cannot be built here: pkg/machinery/config
// imports github.com/cosi-project/runtime (v1.16.3 for Talos v1.14.1), and
// the Go module proxy refuses that module (403, "This module version is not
// available", for v1.16.3 and for its version list).
type talosBundle struct {
	Cluster *struct {
		ID     string
		Secret string
	}
	Secrets *struct {
		BootstrapToken            string
		AESCBCEncryptionSecret    string `yaml:",omitempty"`
		SecretboxEncryptionSecret string `yaml:",omitempty"`
	}
	TrustdInfo *struct {
		Token string
	}
	Certs *struct {
		Etcd              *talosx509.PEMEncodedCertificateAndKey
		K8s               *talosx509.PEMEncodedCertificateAndKey
		K8sAggregator     *talosx509.PEMEncodedCertificateAndKey
		K8sServiceAccount *talosx509.PEMEncodedKey
		OS                *talosx509.PEMEncodedCertificateAndKey
	}
}

// TestTalosImportWorkerConfigs follows the README's Talos import: `import
// --talos-secrets` into a file key, then what `talosctl gen config
// CLUSTER URL --with-secrets SECRETS-for-workers.yaml --config-patch-worker
// @worker-machineconfig-patch.yaml --output-types worker` does with the
// files — load and validate the bundle (Bundle.Validate), sign the
// talosconfig it always generates (NewAdminCertificateAndKey), build the
// worker's machine.ca/machine.token (generate/worker.go) and apply the
// patch — and Talos's worker code, configured from the result, gets its
// certificate. Without the patch the worker refuses the daemon: the
// throwaway pair is no CA of this cluster.
func TestTalosImportWorkerConfigs(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "secrets.yaml")
	if err := os.WriteFile(src, readFile(t, filepath.Join("..", "..", "keystore", "testdata", "talos-secrets.yaml")), 0o600); err != nil {
		t.Fatal(err)
	}
	out, key := filepath.Join(dir, "certs"), filepath.Join(dir, "os-ca.key")
	stdout := ceremony(t, nil, "import", "--signer", "file:"+key, "--talos-secrets", src, "--out", out)
	forWorkers := filepath.Join(dir, "secrets-for-workers.yaml")
	if !strings.Contains(stdout, "--with-secrets "+forWorkers) {
		t.Fatalf("import does not name the worker secrets file %s:\n%s", forWorkers, stdout)
	}
	// The old advice, deleting only certs.os.key, is what talosctl refuses.
	old := loadBundle(t, src)
	old.Certs.OS.Key = nil
	if err := validateBundle(old); err == nil || !strings.Contains(err.Error(), "certs.os is invalid") {
		t.Errorf("a secrets.yaml without certs.os.key passed talosctl's validation: %v", err)
	}
	b := loadBundle(t, forWorkers)
	if err := validateBundle(b); err != nil {
		t.Fatalf("talosctl would refuse %s: %v", forWorkers, err)
	}
	if _, err := adminCertificate(b.Certs.OS); err != nil {
		t.Fatalf("talosctl's talosconfig signature with certs.os: %v", err)
	}
	plain := workerConfig(t, b, nil)
	patched := workerConfig(t, b, readFile(t, filepath.Join(out, certdir.FileWorkerPatch)))

	d := startDaemon(t, "TRUSTD_CERT_DIR="+out, "TRUSTD_SIGNER=file:"+key)
	caPEM := pki.EncodeCertificates(patched.CA)
	ca, crt, id, err := workerRequest(t, d.Addr, patched.Token, caPEM, csrFromCA, 20*time.Second)
	if err != nil {
		t.Fatalf("worker configured from the generated config: %v\n%s", err, d.Logs())
	}
	checkIssued(t, ca, crt, id, [][]byte{readFile(t, filepath.Join(out, certdir.FileCACert))})
	if _, _, _, err := workerRequest(t, d.Addr, plain.Token, pki.EncodeCertificates(plain.CA), csrFromCA, 3*time.Second); err == nil {
		t.Error("a worker config without the patch (machine.ca = the throwaway) got a certificate")
	}
}

// loadBundle decodes path as secrets.LoadBundle does.
func loadBundle(t *testing.T, path string) *talosBundle {
	t.Helper()
	var b talosBundle
	if err := yaml.NewDecoder(bytes.NewReader(readFile(t, path))).Decode(&b); err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	return &b
}

// validateBundle is Bundle.Validate and validateCerts of Talos v1.14.1
// (secrets/bundle.go) for talosctl's default version contract (Kubernetes
// and etcd on): every pair's key and certificate must parse.
func validateBundle(b *talosBundle) error {
	switch {
	case b.Cluster == nil || b.Cluster.ID == "" || b.Cluster.Secret == "":
		return errors.New("cluster.id and cluster.secret are required")
	case b.Secrets == nil || b.Secrets.BootstrapToken == "":
		return errors.New("secrets.bootstraptoken is required")
	case (b.Secrets.AESCBCEncryptionSecret == "") == (b.Secrets.SecretboxEncryptionSecret == ""):
		return errors.New("exactly one of secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret is required")
	case b.TrustdInfo == nil || b.TrustdInfo.Token == "":
		return errors.New("trustdinfo.token is required")
	case b.Certs == nil || b.Certs.K8sServiceAccount == nil:
		return errors.New("certs and certs.k8sserviceaccount are required")
	}
	if _, err := b.Certs.K8sServiceAccount.GetKey(); err != nil {
		return fmt.Errorf("certs.k8sserviceaccount.key is invalid: %w", err)
	}
	for name, p := range map[string]*talosx509.PEMEncodedCertificateAndKey{"etcd": b.Certs.Etcd, "k8s": b.Certs.K8s, "k8saggregator": b.Certs.K8sAggregator, "os": b.Certs.OS} {
		if err := validatePair(p); err != nil {
			return fmt.Errorf("certs.%s is invalid: %w", name, err)
		}
	}
	return nil
}

// validatePair is secrets/utils.go's validatePEMEncodedCertificateAndKey.
func validatePair(p *talosx509.PEMEncodedCertificateAndKey) error {
	if p == nil {
		return errors.New("required")
	}
	if _, err := p.GetKey(); err != nil {
		return err
	}
	_, err := p.GetCert()
	return err
}

// adminCertificate is secrets/ca.go's NewAdminCertificateAndKey, which
// talosctl gen config runs for the talosconfig whatever --output-types say.
func adminCertificate(ca *talosx509.PEMEncodedCertificateAndKey) (*talosx509.PEMEncodedCertificateAndKey, error) {
	now := time.Now()
	talosCA, err := talosx509.NewCertificateAuthorityFromCertificateAndKey(ca)
	if err != nil {
		return nil, err
	}
	kp, err := talosx509.NewKeyPair(talosCA,
		talosx509.Organization("os:admin"), talosx509.NotAfter(now.Add(time.Hour)), talosx509.NotBefore(now),
		talosx509.KeyUsage(stdx509.KeyUsageDigitalSignature), talosx509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth}))
	if err != nil {
		return nil, err
	}
	return talosx509.NewCertificateAndKeyFromKeyPair(kp), nil
}

// workerConfig builds the machine section generate/worker.go writes
// (machine.token from trustdinfo.token, machine.ca.crt from certs.os.crt,
// no key), merges patch over it (maps merged, values replaced, as Talos's
// strategic merge does for these fields) and reads it as a worker would.
func workerConfig(t *testing.T, b *talosBundle, patch []byte) *doctor.WorkerConfig {
	t.Helper()
	cfg := map[string]any{"version": "v1alpha1", "machine": map[string]any{
		"type": "worker", "token": b.TrustdInfo.Token,
		"ca": &talosx509.PEMEncodedCertificateAndKey{Crt: b.Certs.OS.Crt},
	}}
	cfg = roundTrip(t, cfg)
	if patch != nil {
		var p map[string]any
		if err := yaml.Unmarshal(patch, &p); err != nil {
			t.Fatalf("worker patch: %v", err)
		}
		cfg = merge(cfg, p)
	}
	doc, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	wc, err := doctor.ParseWorkerConfig(doc)
	if err != nil {
		t.Fatalf("worker config:\n%s\n%v", doc, err)
	}
	return wc
}

// roundTrip turns m into plain YAML values, through the types' own
// YAML encoding (base64 for the certificate, as Talos writes it).
func roundTrip(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	data, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := yaml.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// merge merges patch into base: nested maps merge, anything else replaces.
func merge(base, patch map[string]any) map[string]any {
	for k, v := range patch {
		bm, ok1 := base[k].(map[string]any)
		pm, ok2 := v.(map[string]any)
		if ok1 && ok2 {
			base[k] = merge(bm, pm)
			continue
		}
		base[k] = v
	}
	return base
}
