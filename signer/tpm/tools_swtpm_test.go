package tpm_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/steward-trustd/steward-trustd/signer"
	"github.com/steward-trustd/steward-trustd/signer/tpm"
	"github.com/steward-trustd/steward-trustd/signer/tpm/tpmpolicy"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// toolSwtpm is a swtpm on loopback TCP with its control channel on the
// next port, the layout the tpm2-tss swtpm TCTI expects
// (swtpm:host=127.0.0.1,port=P), so that tools nobody on this project
// wrote — tpm2-tools, systemd-measure — use the same TPM as the signer.
// swtpm serves one connection at a time: close the signer before a tool
// runs.
type toolSwtpm struct {
	port int
}

func startToolSwtpm(t *testing.T) *toolSwtpm {
	t.Helper()
	bin := tpmsim.RequireTool(t, "swtpm")
	port := twoFreePorts(t)
	cmd := exec.Command(bin, "socket", "--tpm2", "--tpmstate", "dir="+t.TempDir(),
		"--server", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", port),
		"--ctrl", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", port+1),
		"--flags", "not-need-init,startup-clear")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	s := &toolSwtpm{port: port}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", s.addr()); err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatal("swtpm did not accept connections within 10s")
		}
	}
}

// twoFreePorts finds a loopback port P with P+1 free too.
func twoFreePorts(t *testing.T) int {
	t.Helper()
	for range 20 {
		a, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := a.Addr().(*net.TCPAddr).Port
		b, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+1))
		a.Close()
		if err == nil {
			b.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free loopback ports")
	return 0
}

func (s *toolSwtpm) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// tcti is the tpm2-tss TCTI configuration naming this swtpm.
func (s *toolSwtpm) tcti() string { return fmt.Sprintf("swtpm:host=127.0.0.1,port=%d", s.port) }

func (s *toolSwtpm) backend() *tpm.Backend { return &tpm.Backend{Dial: tpmsim.Dial} }

// tool runs a tpm2-tools command against this swtpm.
func (s *toolSwtpm) tool(t *testing.T, name string, args ...string) error {
	t.Helper()
	cmd := exec.Command(tpmsim.RequireTool(t, name), args...)
	cmd.Env = append(os.Environ(), "TPM2TOOLS_TCTI="+s.tcti())
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// readPCRs reads sha256 PCRs through a connection of its own.
func (s *toolSwtpm) readPCRs(t *testing.T, pcrs ...int) [][]byte {
	t.Helper()
	c, err := tpmsim.Dial(context.Background(), tpm.Device{Kind: tpm.DeviceTCP, Addr: s.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	v, err := tpm.ReadPCRs(c, pcrs)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestPCRResetWithTPM2ToolsCannotUnlock: with Debian's tpm2-tools against
// swtpm, an attacker who changed the boot state (PCR 7 extended) and holds
// an approval by the key's own authority over pcrs=7,16 with PCR 16 = 0
// resets PCR 16 (tpm2_pcrreset 16, allowed from locality 0) to match it:
// the v2 key bound to pcrs=7 still does not sign — the signer ignores the
// approval, and the TPM refuses it even with every software check skipped.
// tpm2_pcrreset 7 is refused by the TPM (TPM_RC_LOCALITY).
func TestPCRResetWithTPM2ToolsCannotUnlock(t *testing.T) {
	sw := startToolSwtpm(t)
	auth := newP256(t)
	dir := t.TempDir()
	approvals := filepath.Join(dir, "approvals")
	if err := os.Mkdir(approvals, 0o755); err != nil {
		t.Fatal(err)
	}
	uri, err := tpm.WithAuthorities("tpm:path="+filepath.Join(dir, "ca.tpmkey")+";swtpm="+sw.addr()+";approvals="+approvals, []crypto.PublicKey{auth.Public()})
	if err != nil {
		t.Fatal(err)
	}
	b := sw.backend()
	writeApproval(t, filepath.Join(approvals, "boot.json"), auth, mustBindingRef(t, 7), []int{7}, sw.readPCRs(t, 7))
	s, err := b.Generate(ctx, uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	mustSign(t, s)
	s.Close()
	if err := os.Remove(filepath.Join(approvals, "boot.json")); err != nil {
		t.Fatal(err)
	}

	if err := sw.tool(t, "tpm2_pcrextend", "7:sha256="+strings.Repeat("ab", 32)); err != nil {
		t.Fatal(err)
	}
	if err := sw.tool(t, "tpm2_pcrextend", "16:sha256="+strings.Repeat("cd", 32)); err != nil {
		t.Fatal(err)
	}
	if err := sw.tool(t, "tpm2_pcrreset", "16"); err != nil {
		t.Fatalf("PCR 16 is not resettable from software here, so this test shows nothing: %v", err)
	}
	if err := sw.tool(t, "tpm2_pcrreset", "7"); err == nil {
		t.Fatal("tpm2_pcrreset 7 succeeded: PCR 7 must not be resettable")
	}
	vals := sw.readPCRs(t, 7, 16)
	a := writeApproval(t, filepath.Join(approvals, "attack.json"), auth, "steward-trustd/os-ca/v2:010080", []int{7, 16}, vals)

	s, err = b.Open(ctx, uri)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustRefuse(t, s)
	d := sha256.Sum256([]byte("csr"))
	if err := tpm.TPMSignWithApproval(s.(*tpm.Signer), a, d[:]); !errors.Is(err, tpm2.TPMRCPolicyFail) {
		t.Fatalf("TPM signing after tpm2_pcrreset 16 with an approval over 7,16 = %v, want TPM_RC_POLICY_FAIL", err)
	}
}

// writeApproval writes an approval signed with ref over pcrs = vals,
// without SignApproval's checks (UncheckedApproval).
func writeApproval(t *testing.T, path string, auth crypto.Signer, ref string, pcrs []int, vals [][]byte) *tpmpolicy.Approval {
	t.Helper()
	a, err := tpm.UncheckedApproval(auth, ref, pcrs, vals)
	if err != nil {
		t.Fatal(err)
	}
	writeApprovalFile(t, path, a)
	return a
}

// writeApprovalFile writes a as an approval file at path.
func writeApprovalFile(t testing.TB, path string, a *tpmpolicy.Approval) {
	t.Helper()
	data, err := tpmpolicy.MarshalApprovals(a)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestSystemdMeasureApprovalUnlocksSystemdKey: Debian's systemd-measure
// (systemd 252) signs the PCR 11 a UKI of a kernel and os-release gives
// in the enter-initrd phase, against swtpm, with an RSA key; its
// tpm2-pcr-signature.json, dropped unchanged into the approvals directory
// (empty policyRef, raw RSA signature, its own pkfp), unlocks a key
// created with systemd=true under the same RSA key once swtpm's PCR 11
// holds that value — the test replays the measurements and checks it
// reaches the value systemd-measure calculate prints. One more phase
// (leave-initrd) and the key is refused again.
func TestSystemdMeasureApprovalUnlocksSystemdKey(t *testing.T) {
	measure := tpmsim.RequireTool(t, "/usr/lib/systemd/systemd-measure")
	sw := startToolSwtpm(t)
	dir := t.TempDir()
	priv, pub := writeRSAKeyPair(t, dir)
	approvals := filepath.Join(dir, "approvals")
	if err := os.Mkdir(approvals, 0o755); err != nil {
		t.Fatal(err)
	}
	sections := map[string][]byte{".linux": []byte("not really a kernel\n"), ".osrel": []byte("ID=steward-test\n")}
	args := []string{"--linux=" + writeFile(t, dir, "linux", sections[".linux"]), "--osrel=" + writeFile(t, dir, "osrel", sections[".osrel"]),
		"--bank=sha256", "--phase=enter-initrd"}
	sig := runTool(t, measure, append([]string{"sign", "--private-key=" + priv, "--public-key=" + pub, "--tpm2-device=" + sw.tcti()}, args...)...)
	writeFile(t, approvals, "tpm2-pcr-signature.json", sig)
	want := systemdPCR11(t, runTool(t, measure, append([]string{"calculate", "--json=short"}, args...)...))

	uri, err := tpm.WithAuthorities("tpm:path="+filepath.Join(dir, "ca.tpmkey")+";swtpm="+sw.addr()+";approvals="+approvals+";systemd=true", []crypto.PublicKey{readRSAPublic(t, pub)})
	if err != nil {
		t.Fatal(err)
	}
	b := sw.backend()
	s, err := b.Generate(ctx, uri, signer.ECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustRefuse(t, s) // PCR 11 is still zero
	sd := s.(*tpm.Signer)
	for _, name := range []string{".linux", ".osrel"} { // sd-stub's order: the section's name with its NUL, then its contents
		extendOn(t, sd, 11, append([]byte(name), 0))
		extendOn(t, sd, 11, sections[name])
	}
	extendOn(t, sd, 11, []byte("enter-initrd"))
	got, err := sd.PCRValues(ctx)
	if err != nil || fmt.Sprintf("%x", got[11]) != want {
		t.Fatalf("replayed PCR 11 = %x (%v), systemd-measure calculate says %s", got[11], err, want)
	}
	mustSign(t, s)
	checkSystemdReport(t, sd, sig)
	extendOn(t, sd, 11, []byte("leave-initrd"))
	mustRefuse(t, s)
}

// checkSystemdReport: status names the key's binding with its warning,
// and the authority's systemd fingerprint is the pkfp systemd-measure
// wrote.
func checkSystemdReport(t *testing.T, s *tpm.Signer, sigJSON []byte) {
	t.Helper()
	var f tpmpolicy.ApprovalFile
	if err := json.Unmarshal(sigJSON, &f); err != nil || len(f.SHA256) != 1 {
		t.Fatalf("systemd-measure's file: %s (%v)", sigJSON, err)
	}
	r, err := s.PolicyReport(ctx)
	if err != nil || r.Binding != "systemd" || r.PolicyRef != "" || r.Warning == "" || len(r.Authorities) != 1 {
		t.Fatalf("PolicyReport = %+v, %v", r, err)
	}
	if a := r.Authorities[0]; a.SystemdFingerprint != f.SHA256[0].PKFP || a.Fingerprint == a.SystemdFingerprint {
		t.Fatalf("authority fingerprints %q / systemd %q, systemd-measure's pkfp %q", a.Fingerprint, a.SystemdFingerprint, f.SHA256[0].PKFP)
	}
}

func extendOn(t *testing.T, s *tpm.Signer, idx int, data []byte) {
	t.Helper()
	if err := tpm.ExtendPCR(s, idx, data); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// runTool runs a tool nobody on this project wrote and returns its stdout.
func runTool(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", bin, strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// writeRSAKeyPair writes an RSA-2048 key as systemd-measure reads it:
// PKCS#8 private key PEM and SubjectPublicKeyInfo PEM.
func writeRSAKeyPair(t *testing.T, dir string) (priv, pub string) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p8, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	spki, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	priv = writeFile(t, dir, "pcr-private.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}))
	pub = writeFile(t, dir, "pcr-public.pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki}))
	return priv, pub
}

func readRSAPublic(t *testing.T, path string) crypto.PublicKey {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatal("no PEM")
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// systemdPCR11 is the sha256 PCR 11 value of systemd-measure calculate's
// JSON output.
func systemdPCR11(t *testing.T, out []byte) string {
	t.Helper()
	var r struct {
		SHA256 []struct {
			PCR  int    `json:"pcr"`
			Hash string `json:"hash"`
		} `json:"sha256"`
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.SHA256) != 1 || r.SHA256[0].PCR != 11 {
		t.Fatalf("systemd-measure calculate: %s (%v)", out, err)
	}
	return r.SHA256[0].Hash
}
