//go:build tools

// Package tools pins helm.sh/helm/v3 v3.22.0.
// The module requires nothing else, so go.mod and go.sum hold exactly the
// dependency versions helm's own go.mod selects. The file is never compiled
// (build tag "tools"); devtools/cluster/helmbin.py builds helm's cmd/helm.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
