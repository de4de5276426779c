package deploy

import (
	_ "k8s.io/api/apps/v1"
	_ "sigs.k8s.io/kustomize/api/krusty"
)
