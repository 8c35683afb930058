// Command cdicheck loads CDI spec files and resolves CDI device IDs the way
// containerd does when it creates a container, so a test can show that the
// specs dradriver writes are accepted by the real thing, not by our reading of
// the CDI rules.
//
// It lives in the runtimebin/containerd module on purpose: that module pins
// exactly the dependency versions containerd v2.4.2 selects, so the CDI
// library here (tags.cncf.io/container-device-interface) and the OCI spec
// types are the ones the containerd binary next to it was built with.
// containerd's CRI plugin loads the spec dirs into a CDI cache and calls
// InjectDevices with the container's CDI device names; this does the same with
// a cache of its own (no directory watch: one scan, then the checks).
//
//	cdicheck -spec-dir DIR [-spec-dir DIR]... [-all] [CDI-ID...]
//
// Output is one JSON object per line:
//
//	{"spec":PATH,"kind":KIND,"devices":[NAME...]}  a spec file the cache loaded
//	{"spec":PATH,"error":MSG}                      a spec file it rejected (per error)
//	{"device":ID,"spec":PATH,"linuxDevices":[...],"env":[...],"mounts":[...]}
//	                                               what the device adds to a container
//	{"device":ID,"error":MSG}                      an ID that does not resolve or inject
//	{"together":[ID...]} or {"together":[ID...],"error":MSG}
//	                                               all IDs in one container (2 or more)
//
// -all resolves every device of every loaded spec as well as the IDs given.
// Exit status: 0 when every spec and device is accepted, 1 when any is
// rejected, 2 for a usage error.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type dirList []string

func (d *dirList) String() string     { return fmt.Sprint(*d) }
func (d *dirList) Set(v string) error { *d = append(*d, v); return nil }

type linuxDevice struct {
	Path     string `json:"path"`
	Type     string `json:"type"`
	Major    int64  `json:"major"`
	Minor    int64  `json:"minor"`
	FileMode uint32 `json:"fileMode,omitempty"`
}

type mount struct {
	Destination string   `json:"destination"`
	Source      string   `json:"source"`
	Type        string   `json:"type,omitempty"`
	Options     []string `json:"options,omitempty"`
}

type record struct {
	Spec         string        `json:"spec,omitempty"`
	Kind         string        `json:"kind,omitempty"`
	Devices      []string      `json:"devices,omitempty"`
	Device       string        `json:"device,omitempty"`
	Together     []string      `json:"together,omitempty"`
	LinuxDevices []linuxDevice `json:"linuxDevices,omitempty"`
	Env          []string      `json:"env,omitempty"`
	Mounts       []mount       `json:"mounts,omitempty"`
	Error        string        `json:"error,omitempty"`
}

var out = json.NewEncoder(os.Stdout)

func emit(r record) {
	if err := out.Encode(r); err != nil {
		fmt.Fprintf(os.Stderr, "cdicheck: writing output: %v\n", err)
		os.Exit(2)
	}
}

// containerSpec is a bare container spec like the one containerd starts from:
// a process (as root) and a Linux section; CDI edits are added to it.
func containerSpec() *oci.Spec {
	return &oci.Spec{
		Version: oci.Version,
		Process: &oci.Process{Env: []string{"PATH=/usr/bin:/bin"}},
		Linux:   &oci.Linux{Resources: &oci.LinuxResources{}},
	}
}

// inject resolves ids into a fresh container spec; the record says what they added.
func inject(cache *cdi.Cache, ids []string) (record, bool) {
	spec := containerSpec()
	base := len(spec.Process.Env)
	if _, err := cache.InjectDevices(spec, ids...); err != nil {
		return record{Error: err.Error()}, false
	}
	r := record{Env: spec.Process.Env[base:]}
	for _, d := range spec.Linux.Devices {
		ld := linuxDevice{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor}
		if d.FileMode != nil {
			ld.FileMode = uint32(*d.FileMode)
		}
		r.LinuxDevices = append(r.LinuxDevices, ld)
	}
	for _, m := range spec.Mounts {
		r.Mounts = append(r.Mounts, mount{m.Destination, m.Source, m.Type, m.Options})
	}
	return r, true
}

func main() {
	var dirs dirList
	flag.Var(&dirs, "spec-dir", "CDI spec directory (repeatable; later ones have higher priority)")
	all := flag.Bool("all", false, "also resolve every device of every loaded spec")
	flag.Parse()
	if len(dirs) == 0 {
		fmt.Fprintln(os.Stderr, "cdicheck: at least one -spec-dir is required")
		os.Exit(2)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil { // documented to be always nil
		fmt.Fprintf(os.Stderr, "cdicheck: %v\n", err)
		os.Exit(2)
	}
	ok := true

	specErrors := cache.GetErrors()
	paths := make([]string, 0, len(specErrors))
	for path := range specErrors {
		paths = append(paths, path)
	}
	sort.Strings(paths)
	for _, path := range paths {
		for _, e := range specErrors[path] {
			emit(record{Spec: path, Error: e.Error()})
			ok = false
		}
	}
	for _, vendor := range cache.ListVendors() {
		for _, spec := range cache.GetVendorSpecs(vendor) {
			if len(specErrors[spec.GetPath()]) > 0 {
				continue // a conflict: reported above
			}
			r := record{Spec: spec.GetPath(), Kind: spec.Kind}
			for _, d := range spec.Devices {
				r.Devices = append(r.Devices, d.Name)
			}
			emit(r)
		}
	}

	ids := flag.Args()
	if *all {
		for _, id := range cache.ListDevices() {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	for _, id := range ids {
		r, injected := inject(cache, []string{id})
		r.Device = id
		if injected {
			r.Spec = cache.GetDevice(id).GetSpec().GetPath()
		}
		ok = ok && injected
		emit(r)
	}
	if len(ids) > 1 {
		r, injected := inject(cache, ids)
		emit(record{Together: ids, Error: r.Error})
		ok = ok && injected
	}
	if !ok {
		os.Exit(1)
	}
}
