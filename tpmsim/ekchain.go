package tpmsim

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// EKChain is a TPM state manufactured like a TPM vendor does it: an RSA
// (and ECC) EK whose certificates, issued by a private swtpm-localca CA,
// sit in NV, where a verifier reads them as it would from a chip.
type EKChain struct {
	// StateDir is the TPM state; give it to SwtpmOptions.StateDir.
	StateDir string
	// RootPEM is the local CA's self-signed root, IssuerPEM the
	// intermediate that signed the EK certificate.
	RootPEM, IssuerPEM []byte
}

// ProvisionEK runs swtpm_setup --create-ek-cert --create-platform-cert
// with a private swtpm_setup.conf and swtpm-localca configuration in the
// test's temporary directory, offline. It takes about two seconds.
func ProvisionEK(tb testing.TB) *EKChain {
	tb.Helper()
	setup := RequireTool(tb, "swtpm_setup")
	localca := RequireTool(tb, "swtpm_localca")
	RequireTool(tb, "swtpm")
	dir := tb.TempDir()
	state, ca := filepath.Join(dir, "state"), filepath.Join(dir, "ca")
	for _, d := range []string{state, ca} {
		if err := os.Mkdir(d, 0o700); err != nil {
			tb.Fatal(err)
		}
	}
	files := map[string]string{
		"swtpm-localca.conf":    fmt.Sprintf("statedir = %[1]s\nsigningkey = %[1]s/signkey.pem\nissuercert = %[1]s/issuercert.pem\ncertserial = %[1]s/certserial\n", ca),
		"swtpm-localca.options": "--platform-manufacturer steward-trustd-test\n--platform-version 1.0\n--platform-model swtpm\n",
		"swtpm_setup.conf": fmt.Sprintf("create_certs_tool = %s\ncreate_certs_tool_config = %s\ncreate_certs_tool_options = %s\nactive_pcr_banks = sha256\n",
			localca, filepath.Join(dir, "swtpm-localca.conf"), filepath.Join(dir, "swtpm-localca.options")),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	cmd := exec.Command(setup, "--tpm2", "--tpmstate", state, "--config", filepath.Join(dir, "swtpm_setup.conf"),
		"--create-ek-cert", "--create-platform-cert", "--lock-nvram", "--overwrite")
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir, "HOME="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("swtpm_setup: %v\n%s", err, out)
	}
	root, err := os.ReadFile(filepath.Join(ca, "swtpm-localca-rootca-cert.pem"))
	if err != nil {
		tb.Fatal(err)
	}
	issuer, err := os.ReadFile(filepath.Join(ca, "issuercert.pem"))
	if err != nil {
		tb.Fatal(err)
	}
	return &EKChain{StateDir: state, RootPEM: root, IssuerPEM: issuer}
}
