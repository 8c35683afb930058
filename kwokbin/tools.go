//go:build tools

// Package tools pins sigs.k8s.io/kwok v0.8.0.
// The module requires nothing else, so go.mod and go.sum hold exactly the
// dependency versions kwok's own go.mod selects. The file is never compiled
// (build tag "tools"); devtools/cluster/kwokbin.py builds kwok's cmd/kwok.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
