package talos

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/steward-trustd/steward-trustd/internal/certdir"
	"github.com/steward-trustd/steward-trustd/internal/devtest"
	"github.com/steward-trustd/steward-trustd/tpmsim"
)

// TestTPMSignedPolicyTalosWorker: Talos's worker client through a
// firmware update on a CA key under a policy authority. The key signs in
// the approved state; after PCR 7 changes the daemon answers Unavailable
// and turns not ready; an approval by a foreign key changes nothing; the
// authority's approval of the new state (read on the node, as on a canary)
// lets the same CA key sign again, with no restart.
func TestTPMSignedPolicyTalosWorker(t *testing.T) {
	devtest.NeedTool(t, "swtpm")
	sw := tpmsim.StartSwtpm(t, tpmsim.SwtpmOptions{})
	root := t.TempDir()
	approvals := filepath.Join(root, "approvals")
	uri := "tpm:path=" + filepath.Join(root, "os-ca.tpmkey") + ";" + sw.URIAttrs() + ";approvals=" + approvals
	auth, foreign := devtest.FileKey(t, root, "authority"), devtest.FileKey(t, root, "foreign")
	out := filepath.Join(root, "ceremony")
	ceremony(t, nil, "init", "--signer", uri, "--policy-authority", auth, "--cluster", "e2e", "--out", out)
	health := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	d := &deviceDaemon{
		daemon: startDaemon(t, "TRUSTD_CERT_DIR="+out, "TRUSTD_SIGNER="+uri, "TRUSTD_HEALTH_ADDR="+health,
			"TRUSTD_READY_WINDOW=2s", "TRUSTD_PEER_RATE=-1"),
		token:  strings.TrimSpace(string(readFile(t, filepath.Join(out, certdir.FileToken)))),
		caPEM:  readFile(t, filepath.Join(out, certdir.FileCACert)),
		health: "http://" + health,
	}
	t.Run("approved", d.talosWorkers)

	c := d.client(t)
	sw.ExtendPCR(t, 7, []byte("firmware 1.2.3"))
	if code := d.request(c); code != codes.Unavailable {
		t.Fatalf("after the firmware update: %v, want Unavailable", code)
	}
	eventually(t, 10*time.Second, "readyz 503 after the PCR change", func() bool { return get(d.health+"/readyz") == 503 })

	ceremony(t, nil, "policy", "approve", "--authority", foreign, "--signer", uri, "--dir", out)
	time.Sleep(1100 * time.Millisecond) // past the approvals reload interval
	if code := d.request(c); code != codes.Unavailable {
		t.Fatalf("with a foreign approval: %v, want Unavailable", code)
	}

	ceremony(t, nil, "policy", "approve", "--authority", auth, "--signer", uri, "--dir", out, "--note", "firmware 1.2.3")
	eventually(t, 10*time.Second, "issuance after the approval", func() bool { return d.request(c) == codes.OK })
	eventually(t, 10*time.Second, "readyz 200 after the approval", func() bool { return get(d.health+"/readyz") == 200 })
	t.Run("approved again", d.talosWorkers)
}
