package k8s

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// tpmResource is the extended resource squat/generic-device-plugin
// (deploy/kubernetes/tpm-device-plugin) advertises for /dev/tpmrm0.
const tpmResource = "squat.ai/tpmrm"

// tpmLayoutUnplaced: this node has no TPM and no way to make one (no CUSE,
// no vTPM proxy: README "A real node"), so overlays/tpm cannot run here.
// What the node can show is that the layout never starts without the
// device: deployed as shipped with its one node-level site value (the
// nodeSelector naming this node), the scheduler must keep the pod
// Pending for want of squat.ai/tpmrm rather than start it on a node
// without a TPM.
func (e *nodeEnv) tpmLayoutUnplaced(t *testing.T) {
	s := site{overlay: "overlays/tpm", namespace: "e2e-tpm", serviceIP: "10.0.0.53", patches: podSpecPatch(`            nodeSelector:
              kubernetes.io/hostname: e2e-node
`)}
	ns := e.deploy(t, s)
	msg := waitUnschedulable(t, e.cp.client, ns, time.Minute)
	if !strings.Contains(msg, "Insufficient "+tpmResource) {
		dumpPods(t, e.cp.client, ns)
		t.Fatalf("the tpm pod is unschedulable for another reason: %q; want Insufficient %s", msg, tpmResource)
	}
	t.Logf("overlays/tpm stays Pending without a TPM device plugin: %s", msg)
}

// waitUnschedulable waits for a trustd pod in ns whose PodScheduled
// condition is False with reason Unschedulable and returns its message;
// a pod that gets scheduled fails the test.
func waitUnschedulable(t *testing.T, c kubernetes.Interface, ns string, timeout time.Duration) string {
	t.Helper()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(time.Second) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: trustdSelector})
		cancel()
		if err != nil {
			t.Logf("list pods: %v", err)
			continue
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" {
				t.Fatalf("pod %s was scheduled to %s although no node offers %s", p.Name, p.Spec.NodeName, tpmResource)
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
					return cond.Message
				}
			}
		}
	}
	dumpPods(t, c, ns)
	t.Fatalf("no trustd pod in %s marked Unschedulable within %v", ns, timeout)
	return ""
}
