//go:build tools

// Package tools pins github.com/containerd/containerd/v2 v2.4.2.
// This module requires nothing else, so go.mod and go.sum hold exactly the
// dependency versions upstream's own go.mod selects; a shared module would let
// the other runtime parts raise them. The module's one program of its own,
// cmd/cdicheck, imports only packages containerd itself depends on (the CDI
// library and the OCI runtime spec), so it uses them at containerd's versions
// and changes none. The file is never compiled (build tag "tools");
// devtools/cluster/runtimebin.py builds the packages below and cmd/cdicheck.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
