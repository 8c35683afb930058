//go:build tools

// Package tools pins github.com/containerd/containerd/v2 v2.4.2.
// This module requires nothing else, so go.mod and go.sum hold exactly the
// dependency versions upstream's own go.mod selects; a shared module would let
// the other runtime parts raise them. The file is never compiled (build tag
// "tools"); devtools/cluster/runtimebin.py builds the packages below.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
