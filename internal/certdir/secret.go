package certdir

import (
	"encoding/json"
	"errors"
	"fmt"
)

// KubernetesSecretName is the Secret's name for a cluster.
func KubernetesSecretName(cluster string) string { return "steward-trustd-" + cluster }

// kubeSecret is a core/v1 Secret with only the fields we set. encoding/json
// writes []byte as base64, as the API's data field requires, and map keys
// sorted, so the manifest is deterministic.
type kubeSecret struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   kubeMeta          `json:"metadata"`
	Type       string            `json:"type"`
	Data       map[string][]byte `json:"data"`
}

type kubeMeta struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

// KubernetesSecret renders a v1 Secret named steward-trustd-<cluster>,
// label app.kubernetes.io/name=steward-trustd, type Opaque, whose data
// keys are the given file names. Mount it as the daemon's
// TRUSTD_CERT_DIR. The manifest is JSON (valid YAML; `kubectl apply -f`
// takes it as it is).
func KubernetesSecret(cluster string, files map[string][]byte) ([]byte, error) {
	if cluster == "" {
		return nil, errors.New("kubernetes secret: cluster name is empty")
	}
	s := kubeSecret{
		APIVersion: "v1",
		Kind:       "Secret",
		Metadata: kubeMeta{
			Name:   KubernetesSecretName(cluster),
			Labels: map[string]string{"app.kubernetes.io/name": "steward-trustd"},
		},
		Type: "Opaque",
		Data: files,
	}
	if s.Data == nil {
		s.Data = map[string][]byte{} // "data": {}, not null
	}
	out, err := json.MarshalIndent(&s, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("marshal kubernetes secret: %w", err)
	}
	return append(out, '\n'), nil
}
