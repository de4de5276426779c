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

// machineConfigDoc holds the fields of a Talos v1alpha1 machine config
// document a worker uses to reach trustd, with the YAML names of
// pkg/machinery/config/types/v1alpha1 (Config.MachineConfig `machine`,
// MachineConfig.MachineToken `token`, .MachineCA `ca`,
// .MachineAcceptedCAs `acceptedCAs`; Config.ClusterConfig `cluster`,
// ClusterConfig.ControlPlane `controlPlane`, ControlPlaneConfig.Endpoint
// `endpoint`). The certificate types are Talos's own, which decode the
// base64 PEM exactly as machined does.
type machineConfigDoc struct {
	Version string `yaml:"version"`
	Machine *struct {
		Token       string                                 `yaml:"token"`
		CA          *talosx509.PEMEncodedCertificateAndKey `yaml:"ca"`
		AcceptedCAs []*talosx509.PEMEncodedCertificate     `yaml:"acceptedCAs"`
	} `yaml:"machine"`
	Cluster *struct {
		ControlPlane *struct {
			Endpoint string `yaml:"endpoint"`
		} `yaml:"controlPlane"`
	} `yaml:"cluster"`
}

// WorkerConfig is what a Talos worker's machine config says about trustd.
type WorkerConfig struct {
	// Token is machine.token (a secret).
	Token string
	// CA is machine.ca.crt; AcceptedCAs is machine.acceptedCAs.
	CA          *x509.Certificate
	AcceptedCAs []*x509.Certificate
	// Endpoint is cluster.controlPlane.endpoint, e.g. https://api:6443
	// (empty in a bare patch).
	Endpoint string
	// HasCAKey is true if machine.ca.key is set: a worker config should
	// not hold the CA key.
	HasCAKey bool
}

// ParseWorkerConfig reads the v1alpha1 document of a (multi-document)
// machine config or of a worker patch.
func ParseWorkerConfig(data []byte) (*WorkerConfig, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc machineConfigDoc
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return nil, errors.New("machine config: no document with a machine section")
		}
		if err != nil {
			return nil, fmt.Errorf("machine config: %w", err)
		}
		if doc.Machine == nil {
			continue
		}
		wc := &WorkerConfig{Token: doc.Machine.Token}
		if wc.Token == "" {
			return nil, errors.New("machine config: machine.token is empty")
		}
		if doc.Machine.CA == nil || len(doc.Machine.CA.Crt) == 0 {
			return nil, errors.New("machine config: machine.ca.crt is empty")
		}
		wc.HasCAKey = len(doc.Machine.CA.Key) > 0
		if wc.CA, err = pki.ParseCertificate(doc.Machine.CA.Crt); err != nil {
			return nil, fmt.Errorf("machine config: machine.ca.crt: %w", err)
		}
		for i, a := range doc.Machine.AcceptedCAs {
			certs, err := pki.ParseCertificates(a.Crt)
			if err != nil {
				return nil, fmt.Errorf("machine config: machine.acceptedCAs[%d]: %w", i, err)
			}
			wc.AcceptedCAs = append(wc.AcceptedCAs, certs...)
		}
		if doc.Cluster != nil && doc.Cluster.ControlPlane != nil {
			wc.Endpoint = doc.Cluster.ControlPlane.Endpoint
		}
		return wc, nil
	}
}

// EndpointHost returns the host of cluster.controlPlane.endpoint (a URL
// such as https://10.5.0.2:6443), which is what a worker dials at port
// 50001.
func (w *WorkerConfig) EndpointHost() (string, error) {
	if w.Endpoint == "" {
		return "", errors.New("machine config: cluster.controlPlane.endpoint is empty")
	}
	u, err := url.Parse(w.Endpoint)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("machine config: cluster.controlPlane.endpoint %q is not a URL with a host", w.Endpoint)
	}
	return strings.Trim(u.Hostname(), "[]"), nil
}
