// Package iptables stands in for sigs.k8s.io/iptables-wrappers/pkg/iptables, which the
// Go module proxy reachable from this project's build machines refuses (403 for every
// version, 2026-12-02). Kubernetes 1.38's kubelet imports it only to create the
// KUBE-IPTABLES-HINT and KUBE-FIREWALL chains for other components; the local test
// cluster wants none of that on the host, so NewBestEffort finds no iptables and the
// kubelet logs "No iptables support on this system" and goes on. Only the names the
// kubelet uses exist here; kube-proxy is not built.
package iptables

import (
	"context"
	"time"
)

// Chain is an iptables chain name.
type Chain string

// Table is an iptables table name.
type Table string

// RulePosition says where EnsureRule puts a rule.
type RulePosition string

// Protocol is the IP family a client manages.
type Protocol string

// Mode selects which iptables binary a client runs.
type Mode int

const (
	TableNAT    Table = "nat"
	TableFilter Table = "filter"
	TableMangle Table = "mangle"

	ChainInput  Chain = "INPUT"
	ChainOutput Chain = "OUTPUT"

	Prepend RulePosition = "-I"
	Append  RulePosition = "-A"

	ProtocolIPv4 Protocol = "IPv4"
	ProtocolIPv6 Protocol = "IPv6"

	// UseInstalledMode asks for whichever iptables the host has installed.
	UseInstalledMode Mode = iota
)

// Interface is the part of an iptables client the kubelet calls.
type Interface interface {
	EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error)
	EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error)
	IsIPv6() bool
	Protocol() Protocol
	Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration)
}

// NewBestEffort returns a client per IP family the host supports: none here.
func NewBestEffort(ctx context.Context, mode Mode) map[Protocol]Interface {
	return map[Protocol]Interface{}
}
