package deploy

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11"
	"github.com/steward-trustd/steward-trustd/signer/pkcs11/softhsm"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// served is a layout's daemon running as its pod would, and what a worker
// of that cluster holds: machine.token and the CA it trusts (os-ca.crt;
// the offline root in the tiered layouts).
type served struct {
	p     *podRun
	addr  string
	token string
	caPEM []byte
	logs  func() string
}

// layoutSetup makes a layout's credentials the way its recipe says, lays
// its Secrets out as kubelet would and starts the daemon.
type layoutSetup func(t *testing.T, bins string) *served

// fileLayout: overlays/file with the Secret from its own recipe line
// (`steward-trustd-gencreds ... -san ...`), site values replaced.
func fileLayout(t *testing.T, bins string) *served {
	t.Helper()
	p := newPodRun(t, bins, "overlays/file")
	p.setSiteSANs()
	args := append([]string{"-cluster"}, recipeArgs(t, "overlays/file/kustomization.yaml", "steward-trustd-gencreds -cluster")...)
	creds := filepath.Join(t.TempDir(), "creds")
	args = siteArgs(t, args, map[string]string{"-output": creds, "-san": p.site["TRUSTD_CERT_SANS"], "-cluster": env(p.c, "TRUSTD_TENANT")})
	if out, err := exec.Command(filepath.Join(p.bins, "steward-trustd-gencreds"), args...).CombinedOutput(); err != nil {
		t.Fatalf("gencreds %v: %v\n%s", args, err, out)
	}
	p.secretVolume(t, "certs", decodeSecret(t, filepath.Join(creds, "kubernetes-secret.yaml")))
	d := p.start(t)
	if !strings.Contains(d.Logs(), "Kubernetes Secret mount") {
		t.Fatalf("the file signer did not report accepting the Secret mount\n%s", d.Logs())
	}
	return newServed(t, p, d, creds)
}

// pkcs11Layout: the pkcs11 overlay (or ha-pkcs11) exactly as shipped —
// its token, object, module file name, PIN path and LD_LIBRARY_PATH —
// with SoftHSMv2 as the vendor's module (libvendor.so in the module
// volume), the ceremony Secret and the PIN Secret as kubelet mounts them.
func pkcs11Layout(dir string) layoutSetup {
	return func(t *testing.T, bins string) *served {
		t.Helper()
		p := newPodRun(t, bins, dir)
		p.setSiteSANs()
		devtest.NeedTool(t, "softhsm2-util")
		uri, err := pkcs11.ParseURI(env(p.c, "TRUSTD_SIGNER"))
		check(t, err)
		tok, err := softhsm.New(podReadableDir(t), uri.Token)
		check(t, err)
		modMount, _ := p.mount(t, "hsm-module")
		p.mounts[modMount.MountPath] = podReadableDir(t)
		check(t, os.MkdirAll(filepath.Dir(p.remap(uri.ModulePath)), 0o755))
		b, err := os.ReadFile(tok.ModulePath)
		check(t, err)
		check(t, os.WriteFile(p.remap(uri.ModulePath), b, 0o755))

		ceremonyURI := strings.NewReplacer(uri.ModulePath, tok.ModulePath, uri.PINSource, tok.PINFile).Replace(env(p.c, "TRUSTD_SIGNER"))
		certs := p.ceremony(t, []string{tok.Env()}, "init", "--signer", ceremonyURI, "--cluster", env(p.c, "TRUSTD_TENANT"))
		chownTree(t, tok.Dir, int(*p.pod.SecurityContext.RunAsUser))
		p.secretVolume(t, "certs", decodeSecret(t, filepath.Join(certs, "kubernetes-secret.yaml")))
		pinMount, pinVol := p.mount(t, "hsm-pin")
		if filepath.Dir(uri.PINSource) != pinMount.MountPath {
			t.Fatalf("pin-source %s is not a file of the PIN Secret's mount %s", uri.PINSource, pinMount.MountPath)
		}
		pinSecret := &corev1.Secret{Data: map[string][]byte{filepath.Base(uri.PINSource): []byte(tok.PIN + "\n")}}
		pinSecret.Name = pinVol.Secret.SecretName
		p.secretVolume(t, "hsm-pin", pinSecret)
		d := p.start(t, tok.Env())
		if !strings.Contains(d.Logs(), `"backend":"pkcs11"`) || strings.Contains(d.Logs(), tok.PIN) {
			t.Fatalf("want the pkcs11 key opened and the PIN never logged\n%s", d.Logs())
		}
		return newServed(t, p, d, certs)
	}
}

// tpmLayout: overlays/tpm, its ceremony run on "the node" (swtpm stands
// in for the node's /dev/tpmrm0), the ceremony Secret and the key blob
// Secret as kubelet mounts them.
func tpmLayout(t *testing.T, bins string) *served {
	t.Helper()
	p := newPodRun(t, bins, "overlays/tpm")
	p.setSiteSANs()
	p.attachTPM(t)
	shipped := env(p.c, "TRUSTD_SIGNER")
	blob := filepath.Join(t.TempDir(), "os-ca.tpmkey")
	blobMount, blobVol := p.mount(t, "tpmkey")
	onNode := p.remap(strings.Replace(shipped, blobMount.MountPath+"/os-ca.tpmkey", blob, 1))
	certs := p.ceremony(t, nil, "init", "--signer", onNode, "--cluster", env(p.c, "TRUSTD_TENANT"))
	p.secretVolume(t, "certs", decodeSecret(t, filepath.Join(certs, "kubernetes-secret.yaml")))
	blobSecret := &corev1.Secret{Data: map[string][]byte{"os-ca.tpmkey": readFile(t, blob)}}
	blobSecret.Name = blobVol.Secret.SecretName
	p.secretVolume(t, "tpmkey", blobSecret)
	return newServed(t, p, p.start(t), certs)
}

// tieredTPMLayout: overlays/ha-tpm or the Kamaji sidecar: an offline
// root, this node's intermediate made in its TPM (swtpm) and signed with
// the recipe's --permitted-ip-ranges, the root's Secret and the nodes
// Secret (<node>.tpmkey, <node>.crt) as kubelet mounts them.
func tieredTPMLayout(newPod func(t *testing.T, bins string) *podRun, recipe string) layoutSetup {
	return func(t *testing.T, bins string) *served {
		t.Helper()
		p := newPod(t, bins)
		p.setSiteSANs()
		p.attachTPM(t)
		rootKey := "file:" + filepath.Join(t.TempDir(), "root.key")
		root := p.ceremony(t, nil, "init", "--signer", rootKey, "--cluster", env(p.c, "TRUSTD_TENANT"))
		blob := filepath.Join(t.TempDir(), sampleNode+".tpmkey")
		nodeURI := p.remap(strings.Replace(expandNode(env(p.c, "TRUSTD_SIGNER")), "/etc/steward-trustd/nodes/"+sampleNode+".tpmkey", blob, 1))
		csr := filepath.Join(t.TempDir(), sampleNode+".csr")
		p.ceremony(t, nil, "intermediate", "request", "--name", sampleNode, "--out", csr, "--signer", nodeURI)
		chain := filepath.Join(t.TempDir(), sampleNode+".crt")
		ranges := flagValue(t, recipeArgs(t, recipe, "intermediate sign"), "--permitted-ip-ranges")
		p.ceremony(t, nil, "intermediate", "sign", "--signer", rootKey, "--ca", filepath.Join(root, certdir.FileCACert),
			"--csr", csr, "--out", chain, "--permitted-ip-ranges", ranges)
		p.secretVolume(t, "trustd-certs", decodeSecret(t, filepath.Join(root, "kubernetes-secret.yaml")))
		nodes := &corev1.Secret{Data: map[string][]byte{sampleNode + ".tpmkey": readFile(t, blob), sampleNode + ".crt": readFile(t, chain)}}
		nodes.Name = "steward-trustd-nodes"
		p.secretVolume(t, "trustd-nodes", nodes)
		return newServed(t, p, p.start(t), root)
	}
}

// haTPMPod is overlays/ha-tpm's pod with its volumes named as Kamaji's are
// (trustd-certs, trustd-nodes), so one setup serves both layouts.
func haTPMPod(t *testing.T, bins string) *podRun {
	t.Helper()
	p := newPodRun(t, bins, "overlays/ha-tpm")
	renameVolume(p, "certs", "trustd-certs")
	renameVolume(p, "nodes", "trustd-nodes")
	return p
}

// kamajiPod is the Kamaji example's trustd sidecar as the tenant's pod
// runs it (no pod securityContext: Kamaji sets none).
func kamajiPod(t *testing.T, bins string) *podRun {
	t.Helper()
	tcp, _ := renderKamaji(t)
	dep := tcp.Spec.ControlPlane.Deployment
	return newPodRunOf(bins, &corev1.PodSpec{Containers: dep.AdditionalContainers, Volumes: dep.AdditionalVolumes})
}

func renameVolume(p *podRun, from, to string) {
	for i := range p.pod.Volumes {
		if p.pod.Volumes[i].Name == from {
			p.pod.Volumes[i].Name = to
		}
	}
	if m := mountNamed(p.c, from); m != nil {
		m.Name = to
	}
}

// attachTPM stands swtpm in for the node's /dev/tpmrm0 (through a TCP
// relay the pod's uid can reach).
func (p *podRun) attachTPM(t *testing.T) {
	t.Helper()
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{TCP: true})
	p.devices["device=/dev/tpmrm0"] = sw.URIAttrs()
}

// setSiteSANs sets TRUSTD_CERT_SANS the documented way for this test's
// site: the address workers dial (the LoadBalancer's, here 127.0.0.1, in
// place of the shipped placeholder address) and the endpoint's hostname
// as shipped.
func (p *podRun) setSiteSANs() {
	var out []string
	for _, v := range strings.Split(env(p.c, "TRUSTD_CERT_SANS"), ",") {
		if isIP(v) {
			v = "127.0.0.1"
		}
		out = append(out, v)
	}
	p.site["TRUSTD_CERT_SANS"] = strings.Join(out, ",")
}

// ceremony runs steward-trustd-ceremony as root (the operator on the
// node) with args and, for init, a fresh --out directory it returns.
func (p *podRun) ceremony(t *testing.T, environ []string, args ...string) string {
	t.Helper()
	out := ""
	if args[0] == "init" {
		out = filepath.Join(t.TempDir(), "ceremony")
		args = append(args, "--out", out)
	}
	cmd := exec.Command(filepath.Join(p.bins, "steward-trustd-ceremony"), args...)
	cmd.Env = append(os.Environ(), environ...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ceremony %v: %v\n%s", args, err, b)
	}
	return out
}

func newServed(t *testing.T, p *podRun, d *devtest.Daemon, certs string) *served {
	t.Helper()
	return &served{p: p, addr: d.Addr, logs: d.Logs,
		token: strings.TrimSpace(string(readFile(t, filepath.Join(certs, certdir.FileToken)))),
		caPEM: readFile(t, filepath.Join(certs, certdir.FileCACert))}
}

// recipeArgs is the command line after marker in a layout's comment
// recipe (continuation lines joined), split on blanks.
func recipeArgs(t *testing.T, file, marker string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(manifests, file))
	check(t, err)
	defer f.Close()
	var cmd string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "#"))
		if cmd != "" {
			cmd += " " + strings.TrimSuffix(line, "\\")
		} else if i := strings.Index(line, marker); i >= 0 {
			cmd = strings.TrimSuffix(line[i+len(marker):], "\\")
		}
		if cmd != "" && !strings.HasSuffix(line, "\\") {
			break
		}
	}
	if cmd == "" {
		t.Fatalf("%s has no recipe line with %q", file, marker)
	}
	return strings.Fields(cmd)
}

// siteArgs replaces the values of the flags in site (each must be in the
// recipe) with this test's.
func siteArgs(t *testing.T, args []string, site map[string]string) []string {
	t.Helper()
	for flag, v := range site {
		flagValue(t, args, flag)
		for i := range args[:len(args)-1] {
			if args[i] == flag {
				args[i+1] = v
			}
		}
	}
	return args
}

// flagValue is the value following flag in args; a missing flag fails t.
func flagValue(t *testing.T, args []string, flag string) string {
	t.Helper()
	for i := range args[:len(args)-1] {
		if args[i] == flag {
			return args[i+1]
		}
	}
	t.Fatalf("the recipe %v lacks %s", args, flag)
	return ""
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	check(t, err)
	return b
}
