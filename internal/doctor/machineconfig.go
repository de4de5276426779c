package doctor

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	talosx509 "github.com/siderolabs/crypto/x509"
	"go.yaml.in/yaml/v4"

	"github.com/steward-trustd/steward-trustd/internal/pki"
)

// machineConfigDoc holds the fields of one document of a Talos machine
// config that a worker uses to reach trustd, with the YAML names of
// pkg/machinery/config/types: v1alpha1 (Config.MachineConfig `machine`,
// MachineConfig.MachineToken `token`, .MachineCA `ca`,
// .MachineAcceptedCAs `acceptedCAs`; Config.ClusterConfig `cluster`,
// ClusterConfig.ControlPlane `controlPlane`, ControlPlaneConfig.Endpoint
// `endpoint`) and k8s.KubeClusterConfigV1Alpha1 (`endpoint`), which Talos
// 1.14 writes instead of cluster.controlPlane. The certificate types are
// Talos's own, which decode the base64 PEM exactly as machined does.
//
// Talos's own loader (config/configloader) cannot be linked here: its
// config package imports github.com/cosi-project/runtime, which the Go
// module proxy does not serve. The document rules below are the loader's
// (configloader/internal/decoder and container.K8sClusterConfig).
type machineConfigDoc struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Version    string `yaml:"version"`
	Machine    *struct {
		Token       string                                 `yaml:"token"`
		CA          *talosx509.PEMEncodedCertificateAndKey `yaml:"ca"`
		AcceptedCAs []*talosx509.PEMEncodedCertificate     `yaml:"acceptedCAs"`
	} `yaml:"machine"`
	Cluster *struct {
		ControlPlane *struct {
			Endpoint string `yaml:"endpoint"`
		} `yaml:"controlPlane"`
	} `yaml:"cluster"`
	Endpoint string `yaml:"endpoint"`
}

// isV1Alpha1 reports the decoder's rule: a document without a kind whose
// version is v1alpha1, or (a patch) that has a machine or cluster section.
func (d *machineConfigDoc) isV1Alpha1() bool {
	return d.Kind == "" && (d.Version == "v1alpha1" || d.Machine != nil || d.Cluster != nil)
}

// isKubeCluster reports a KubeClusterConfig document (Talos 1.14+).
func (d *machineConfigDoc) isKubeCluster() bool {
	return d.Kind == "KubeClusterConfig" && d.APIVersion == "v1alpha1"
}

// WorkerConfig is what a Talos worker's machine config says about trustd.
type WorkerConfig struct {
	// Token is machine.token (a secret).
	Token string
	// CA is machine.ca.crt; AcceptedCAs is machine.acceptedCAs.
	CA          *x509.Certificate
	AcceptedCAs []*x509.Certificate
	// Endpoint is the cluster endpoint, e.g. https://api:6443: the
	// KubeClusterConfig document's (Talos 1.14 and later) or
	// cluster.controlPlane.endpoint (earlier). Empty in a bare patch.
	Endpoint string
	// HasCAKey is true if machine.ca.key is set: a worker config should
	// not hold the CA key.
	HasCAKey bool
}

// ParseWorkerConfig reads a multi-document Talos machine config (any shape
// Talos 1.9 to 1.14 writes) or a worker patch.
func ParseWorkerConfig(data []byte) (*WorkerConfig, error) {
	v1, kube, err := splitDocuments(data)
	if err != nil {
		return nil, err
	}
	if v1 == nil || v1.Machine == nil {
		return nil, errors.New("machine config: no document with a machine section")
	}
	wc, err := readMachine(v1)
	if err != nil {
		return nil, err
	}
	legacy := ""
	if v1.Cluster != nil && v1.Cluster.ControlPlane != nil {
		legacy = v1.Cluster.ControlPlane.Endpoint
	}
	if kube != nil && legacy != "" {
		// Talos refuses this too (V1Alpha1ConflictValidator).
		return nil, errors.New("machine config: both cluster.controlPlane.endpoint and a KubeClusterConfig document are set; keep one")
	}
	wc.Endpoint = legacy
	if kube != nil {
		wc.Endpoint = kube.Endpoint
	}
	return wc, nil
}

// splitDocuments returns the v1alpha1 and KubeClusterConfig documents of
// a machine config; each may appear once.
func splitDocuments(data []byte) (v1, kube *machineConfigDoc, err error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for i := 0; ; i++ {
		doc := new(machineConfigDoc)
		err := dec.Decode(doc)
		if errors.Is(err, io.EOF) {
			return v1, kube, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("machine config: document %d: %w", i+1, err)
		}
		switch {
		case doc.isV1Alpha1() && v1 != nil:
			return nil, nil, fmt.Errorf("machine config: document %d: a second v1alpha1 document", i+1)
		case doc.isV1Alpha1():
			v1 = doc
		case doc.isKubeCluster() && kube != nil:
			return nil, nil, fmt.Errorf("machine config: document %d: a second KubeClusterConfig document", i+1)
		case doc.isKubeCluster():
			kube = doc
		}
	}
}

// readMachine reads the token and the CA certificates of the v1alpha1
// machine section.
func readMachine(doc *machineConfigDoc) (*WorkerConfig, error) {
	m := doc.Machine
	wc := &WorkerConfig{Token: m.Token}
	if wc.Token == "" {
		return nil, errors.New("machine config: machine.token is empty")
	}
	if m.CA == nil || len(m.CA.Crt) == 0 {
		return nil, errors.New("machine config: machine.ca.crt is empty")
	}
	wc.HasCAKey = len(m.CA.Key) > 0
	var err error
	if wc.CA, err = pki.ParseCertificate(m.CA.Crt); err != nil {
		return nil, fmt.Errorf("machine config: machine.ca.crt: %w", err)
	}
	for i, a := range m.AcceptedCAs {
		certs, err := pki.ParseCertificates(a.Crt)
		if err != nil {
			return nil, fmt.Errorf("machine config: machine.acceptedCAs[%d]: %w", i, err)
		}
		wc.AcceptedCAs = append(wc.AcceptedCAs, certs...)
	}
	return wc, nil
}

// EndpointHost returns the host of the cluster endpoint (a URL such as
// https://10.5.0.2:6443), which is what a worker dials at port 50001.
func (w *WorkerConfig) EndpointHost() (string, error) {
	if w.Endpoint == "" {
		return "", errors.New("machine config: the cluster endpoint is empty (no KubeClusterConfig document, no cluster.controlPlane.endpoint)")
	}
	u, err := url.Parse(w.Endpoint)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("machine config: cluster endpoint %q is not a URL with a host", w.Endpoint)
	}
	return strings.Trim(u.Hostname(), "[]"), nil
}
