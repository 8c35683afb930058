"""Build the container runtime the local cluster can run real pods on.

The sources are the Go modules under ``runtimebin/``: one nested module per
upstream (``containerd/``, ``runc/``, ``cni/``), each pinning exactly the
dependency versions its upstream selects, and the parent module with the
project's own ``cmd/probe`` (pause process and report probe); the containerd module
also holds ``cmd/cdicheck``, which checks CDI specs with containerd's own CDI
library (see :mod:`devtools.cluster.cdicheck`). The binaries are
cached outside the work tree in
``<cache>/runtime/<versions>-<digest>/bin``, where ``<cache>`` is
``DRADRIVER_CACHE_DIR`` or ``~/.cache/dradriver`` and the digest covers every
go.mod, go.sum and Go source file of ``runtimebin/`` plus the build flags, so
another checkout of the same sources reuses them.

runc needs cgo and libseccomp (a runc without seccomp fails every sandbox the
kubelet creates); on Debian, ``libseccomp-dev`` is installed with apt-get when
it is missing. Everything else is built with ``CGO_ENABLED=0``.

``python -m devtools.cluster.runtimebin`` builds (or finds) them and prints the
bin dir. :func:`ensure_binary` builds a single component on a miss, for a
caller that needs one tool (the CDI checker) and not the whole runtime.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devtools.cluster.gomodule import hash_go_sources
from devtools.cluster.progress import Progress, count_go_packages, run_go_build
from dradriver.log import configure, get_logger

log = get_logger("cluster.runtimebin")


class RuntimeBuildError(RuntimeError):
    """The runtime binaries cannot be built; the message says what to do."""


@dataclass(frozen=True)
class Component:
    """One `go build` invocation: its module dir, packages and flags."""

    name: str
    module: str  # directory under runtimebin/
    packages: tuple[str, ...]
    outputs: tuple[str, ...]  # binary names it leaves in bin/
    cgo: bool = False
    tags: tuple[str, ...] = ()
    ldflags: str = "-s -w"


CONTAINERD_PKG = "github.com/containerd/containerd/v2"
_CONTAINERD_LDFLAGS = (
    f"-s -w -X {CONTAINERD_PKG}/version.Version={{containerd}}"
    f" -X {CONTAINERD_PKG}/version.Package={CONTAINERD_PKG}"
)
_CNI_LDFLAGS = (
    "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion={cni}"
)

# Build order: the small probe first, then the CDI checker (a few of
# containerd's dependencies), then runc (the one cgo build), then the
# containerd binaries (they share most packages, so ctr and the shim are quick
# once containerd is built), then the CNI plugins.
COMPONENTS: tuple[Component, ...] = (
    Component("probe", ".", ("./cmd/probe",), ("probe",)),
    Component("cdicheck", "containerd", ("./cmd/cdicheck",), ("cdicheck",)),
    Component(
        "runc",
        "runc",
        ("github.com/opencontainers/runc",),
        ("runc",),
        cgo=True,
        # Upstream's default tags less libpathrs (a Rust library): runc then
        # uses its pure-Go pathrs-lite, as upstream does without it.
        tags=("seccomp", "urfave_cli_no_docs"),
    ),
    Component(
        "containerd",
        "containerd",
        (f"{CONTAINERD_PKG}/cmd/containerd",),
        ("containerd",),
        tags=("urfave_cli_no_docs",),
        ldflags=_CONTAINERD_LDFLAGS,
    ),
    Component(
        "ctr",
        "containerd",
        (f"{CONTAINERD_PKG}/cmd/ctr",),
        ("ctr",),
        tags=("urfave_cli_no_docs",),
        ldflags=_CONTAINERD_LDFLAGS,
    ),
    Component(
        "containerd-shim-runc-v2",
        "containerd",
        (f"{CONTAINERD_PKG}/cmd/containerd-shim-runc-v2",),
        ("containerd-shim-runc-v2",),
        tags=("urfave_cli_no_docs",),
        ldflags=_CONTAINERD_LDFLAGS,
    ),
    Component(
        "cni-plugins",
        "cni",
        (
            "github.com/containernetworking/plugins/plugins/main/loopback",
            "github.com/containernetworking/plugins/plugins/main/tap",
            "github.com/containernetworking/plugins/plugins/ipam/host-local",
        ),
        ("loopback", "tap", "host-local"),
        ldflags=_CNI_LDFLAGS,
    ),
)

BINARIES: tuple[str, ...] = tuple(name for c in COMPONENTS for name in c.outputs)

# The upstream module each nested module pins, by version-key name.
_PINNED = {
    "containerd": ("containerd", CONTAINERD_PKG),
    "runc": ("runc", "github.com/opencontainers/runc"),
    "cni": ("cni", "github.com/containernetworking/plugins"),
}


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def source_dir() -> Path:
    return repo_root() / "runtimebin"


def cache_root() -> Path:
    base = os.environ.get("DRADRIVER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dradriver"
    )
    return Path(base)


def pinned_versions(source: Path | None = None) -> dict[str, str]:
    """The upstream versions the nested go.mod files require, e.g. {"runc": "v1.5.3"}."""
    source = source or source_dir()
    versions: dict[str, str] = {}
    for key, (module, path) in _PINNED.items():
        gomod = (source / module / "go.mod").read_text()
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(path)}\s+(v\S+)", gomod, re.M)
        if match is None:
            raise RuntimeBuildError(f"{source / module / 'go.mod'} does not require {path}")
        versions[key] = match.group(1)
    return versions


def _ldflags(component: Component, versions: dict[str, str]) -> str:
    return component.ldflags.format(**versions)


def source_key(source: Path | None = None) -> str:
    """A digest of everything that determines the binaries' content."""
    source = source or source_dir()
    versions = pinned_versions(source)
    digest = hashlib.sha256()
    for c in COMPONENTS:
        settings = [c.name, c.module, *c.packages, str(c.cgo), *c.tags, _ldflags(c, versions)]
        digest.update("\0".join(settings).encode() + b"\n")
    hash_go_sources(digest, source)
    return digest.hexdigest()[:16]


def build_dir() -> Path:
    """The cache entry for the current sources (its bin/ holds the binaries)."""
    v = pinned_versions()
    name = "-".join(f"{key}{v[key].removeprefix('v')}" for key in ("containerd", "runc", "cni"))
    return cache_root() / "runtime" / f"{name}-{source_key()}"


def ensure_runtime_binaries() -> Path:
    """Return the bin dir with every runtime binary, building it on a cache miss."""
    target = build_dir()
    if not (target / ".complete").exists():
        _build(target)
    return target / "bin"


def ensure_binary(binary: str) -> Path:
    """The path of one runtime binary, building only its component on a cache miss."""
    component = next((c for c in COMPONENTS if binary in c.outputs), None)
    if component is None:
        raise RuntimeBuildError(f"no runtime component builds {binary!r} (one of {BINARIES})")
    target = build_dir()
    if not _built(target, component):
        _build(target, only=component)
    return target / "bin" / binary


def build_times() -> dict[str, float] | None:
    """Seconds each component took when this cache entry was built, if known."""
    try:
        data = json.loads((build_dir() / ".complete").read_text())
    except (OSError, ValueError):
        return None
    times = data.get("seconds") if isinstance(data, dict) else None
    if not isinstance(times, dict):
        return None
    return {str(k): float(v) for k, v in times.items() if isinstance(v, (int, float))}


def component_build_seconds(name: str) -> float | None:
    """Seconds the named component took when it was built into this cache entry, if known."""
    return _marker_seconds(build_dir(), name)


def _marker(target: Path, name: str) -> Path:
    """Written after one component's build succeeded, so a later build skips it."""
    return target / f".built-{name}"


def _marker_seconds(target: Path, name: str) -> float | None:
    try:
        data = json.loads(_marker(target, name).read_text())
    except (OSError, ValueError):
        return None
    seconds = data.get("seconds") if isinstance(data, dict) else None
    return float(seconds) if isinstance(seconds, (int, float)) else None


def _built(target: Path, component: Component) -> bool:
    return (target / ".complete").exists() or _marker(target, component.name).exists()


def _build(target: Path, only: Component | None = None) -> None:
    """Build every component not yet built (or just ``only``) into ``target``."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeBuildError(
            "the Go toolchain is not on PATH; install Go 1.26.8 or newer (the runtime "
            "binaries are built from the Go module proxy), or put prebuilt binaries "
            f"({', '.join(BINARIES)}) in {target / 'bin'} and create {target / '.complete'}"
        )
    target.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock:
        # A parallel test run or CI job may be building the same key.
        fcntl.flock(lock, fcntl.LOCK_EX)
        wanted = COMPONENTS if only is None else (only,)
        todo = [c for c in wanted if not _built(target, c)]
        if not todo:
            return
        if any(c.cgo for c in todo):
            _ensure_libseccomp()
        bin_dir = target / "bin"
        bin_dir.mkdir(exist_ok=True)
        versions = pinned_versions()
        log.info(
            "building runtime binaries",
            into=str(bin_dir),
            components=",".join(c.name for c in todo),
            **versions,
        )
        started = time.monotonic()
        for index, component in enumerate(todo, 1):
            took = _build_one(
                go, component, versions, bin_dir, target / "build.log", index, len(todo), started
            )
            _marker(target, component.name).write_text(json.dumps({"seconds": took}) + "\n")
        if only is not None:
            return
        _check_runc(bin_dir / "runc")
        total = time.monotonic() - started
        seconds = {c.name: _marker_seconds(target, c.name) for c in COMPONENTS}
        record = {"seconds": seconds, "total": round(total, 1), "versions": versions}
        (target / ".complete").write_text(json.dumps(record, indent=1) + "\n")
        log.info(f"built runtime binaries in {total:.0f} s", bin=str(bin_dir))


def _build_one(
    go: str,
    component: Component,
    versions: dict[str, str],
    bin_dir: Path,
    log_path: Path,
    index: int,
    count: int,
    started: float,
) -> float:
    step = f"{component.name} ({index}/{count})"
    log.info(f"building {step}, {time.monotonic() - started:.0f} s elapsed")
    out = str(bin_dir / component.outputs[0]) if len(component.outputs) == 1 else f"{bin_dir}/"
    cmd = [go, "build", "-v", "-trimpath"]
    flags = ["-tags", ",".join(component.tags)] if component.tags else []
    cmd += [*flags, "-ldflags", _ldflags(component, versions), "-o", out, *component.packages]
    env = dict(os.environ, CGO_ENABLED="1" if component.cgo else "0")
    cwd = source_dir() / component.module
    total = count_go_packages(go, component.packages, cwd, env, flags)
    progress = Progress(f"runtime {step}", total, "packages")
    one_started = time.monotonic()
    with open(log_path, "a") as build_log:
        build_log.write(f"$ CGO_ENABLED={env['CGO_ENABLED']} {' '.join(cmd)}\n")
        build_log.flush()
        code = run_go_build(cmd, cwd=cwd, env=env, log=build_log, progress=progress)
    took = time.monotonic() - one_started
    if code != 0:
        raise RuntimeBuildError(
            f"go build of {component.name} failed (exit {code}); last lines of "
            f"{log_path}:\n{_tail(log_path)}"
        )
    missing = [n for n in component.outputs if not os.access(bin_dir / n, os.X_OK)]
    if missing:
        raise RuntimeBuildError(f"go build of {component.name} left no {', '.join(missing)}")
    log.info(f"built {step} in {took:.0f} s")
    return round(took, 1)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _check_runc(runc: Path) -> None:
    """A runc without seccomp support would fail every pod sandbox: refuse it here."""
    proc = subprocess.run(
        [str(runc), "--version"], capture_output=True, text=True, check=False, timeout=30
    )
    if proc.returncode != 0 or "libseccomp" not in proc.stdout:
        raise RuntimeBuildError(
            f"{runc} --version shows no libseccomp (built without seccomp?):\n"
            f"{proc.stdout}{proc.stderr}"
        )


# --- libseccomp ---------------------------------------------------------------


def _libseccomp_usable() -> bool:
    pkg_config = shutil.which("pkg-config")
    if pkg_config is None:
        return False
    proc = subprocess.run([pkg_config, "--exists", "libseccomp"], check=False)
    return proc.returncode == 0


def _ensure_libseccomp() -> None:
    """runc's cgo build needs libseccomp's headers; install Debian's libseccomp-dev if missing."""
    for tool in ("pkg-config", "gcc"):
        if shutil.which(tool) is None:
            raise RuntimeBuildError(
                f"{tool} is not on PATH; runc is built with cgo against libseccomp "
                "(Debian: apt-get install pkg-config gcc libseccomp-dev)"
            )
    if _libseccomp_usable():
        return
    apt_get = shutil.which("apt-get")
    if apt_get is None:
        raise RuntimeBuildError(
            "libseccomp development files are missing (pkg-config finds no libseccomp) "
            "and there is no apt-get here: install them (Debian: libseccomp-dev)"
        )
    if os.geteuid() != 0:
        raise RuntimeBuildError(
            "libseccomp development files are missing; install them as root: "
            "apt-get install libseccomp-dev"
        )
    log.info("installing libseccomp-dev with apt-get (runc is built with seccomp)")
    install = [apt_get, "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q"]
    install += ["--no-install-recommends", "libseccomp-dev"]
    output = _apt(install)
    if output is not None:
        # A fresh machine has no package lists yet: update once and retry.
        log.info("apt-get install failed; running apt-get update and retrying")
        _apt([apt_get, "-o", "DPkg::Lock::Timeout=300", "update", "-q"])
        output = _apt(install)
    if output is not None or not _libseccomp_usable():
        raise RuntimeBuildError(
            "could not install libseccomp-dev with apt-get (runc needs it for seccomp); "
            f"install it by hand. apt-get said:\n{output or '(nothing)'}"
        )


def _apt(cmd: Sequence[str]) -> str | None:
    """Run an apt-get command; None on success, else the tail of its output."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    proc = subprocess.run(
        list(cmd),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode == 0:
        return None
    return "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.cluster.runtimebin",
        description="Build (or find cached) containerd, runc, CNI plugins and the probe; "
        "print their bin dir.",
    )
    parser.add_argument("--times", action="store_true", help="also print each build time")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    configure(args.log_level)
    try:
        bin_dir = ensure_runtime_binaries()
    except RuntimeBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(bin_dir)
    if args.times:
        for name, seconds in (build_times() or {}).items():
            print(f"{name}\t{seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
