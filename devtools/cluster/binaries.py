"""Build and locate the real Kubernetes binaries the local cluster runs.

The binaries come from the Go module in ``kubebin/`` (k8s.io/kubernetes as a
module dependency). They are cached outside the work tree under a key derived
from that module's sources, so a second build, a CI run on the same machine or
another checkout of the same sources reuses them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from devtools import paths
from devtools.cluster.progress import Progress, count_go_packages, run_go_build
from dradriver.log import get_logger

log = get_logger("cluster.binaries")

KUBE_VERSION = "v1.36.3"
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "fakecri",
)
# The envtest convention: a directory holding kube-apiserver and etcd.
ENVTEST_COMPONENTS = ("etcd", "kube-apiserver")


class BinaryError(RuntimeError):
    """The kube binaries cannot be built or found; the message says what to do."""


def repo_root() -> Path:
    return paths.REPO


def module_dir() -> Path:
    return repo_root() / "kubebin"


def cache_root() -> Path:
    base = os.environ.get("DRADRIVER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dradriver"
    )
    return Path(base)


def _ldflags() -> str:
    major, minor = KUBE_VERSION.lstrip("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    return (
        f"-s -w -X {pkg}.gitVersion={KUBE_VERSION} -X {pkg}.gitMajor={major}"
        f" -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean"
    )


def source_key(module: Path | None = None) -> str:
    """A digest of everything that determines the binaries' content."""
    module = module or module_dir()
    digest = hashlib.sha256()
    digest.update(_ldflags().encode())
    files = [module / "go.mod", module / "go.sum", *sorted(module.glob("cmd/*/*.go"))]
    for path in files:
        digest.update(str(path.relative_to(module)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class KubeBinaries:
    """Paths of every component binary, by component name."""

    paths: dict[str, Path]

    def __getitem__(self, component: str) -> Path:
        return self.paths[component]


def _envtest_overrides() -> dict[str, Path]:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        return {}
    found = {c: Path(assets) / c for c in ENVTEST_COMPONENTS}
    missing = [c for c, p in found.items() if not os.access(p, os.X_OK)]
    if missing:
        raise BinaryError(
            f"KUBEBUILDER_ASSETS={assets} lacks executable {', '.join(missing)}; "
            "point it at a directory with kube-apiserver and etcd, or unset it"
        )
    return found


def build_dir() -> Path:
    return cache_root() / "kube" / f"{KUBE_VERSION}-{source_key()}"


def ensure_binaries() -> KubeBinaries:
    """Return the binaries, building them first if the cache has none for this source."""
    target = build_dir()
    done = target / ".complete"
    if not done.exists():
        _build(target)
    paths = {c: target / c for c in COMPONENTS}
    paths.update(_envtest_overrides())
    return KubeBinaries(paths)


def _build(target: Path) -> None:
    go = shutil.which("go")
    if go is None:
        raise BinaryError(
            "the Go toolchain is not on PATH; install Go 1.26 or newer (the kube "
            "binaries are built from the Go module proxy), or put prebuilt "
            f"binaries for {KUBE_VERSION} in {target}"
        )
    target.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock:
        # Another process (a parallel test run, CI) may be building the same key.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return
        log.info("building kube binaries", version=KUBE_VERSION, into=str(target))
        started = time.monotonic()
        cmd = [
            go,
            "build",
            "-v",
            "-tags",
            "providerless",
            "-trimpath",
            "-ldflags",
            _ldflags(),
            "-o",
            str(target) + "/",
            "./cmd/...",
        ]
        env = dict(os.environ, CGO_ENABLED=os.environ.get("CGO_ENABLED", "1"))
        # -v names each package as it is compiled: the progress counts them against
        # the package set go list gives for the same targets and tags.
        total = count_go_packages(go, ["./cmd/..."], module_dir(), env, ["-tags", "providerless"])
        progress = Progress("kube binaries", total, "packages")
        log_path = target / "build.log"
        with open(log_path, "w") as build_log:
            code = run_go_build(cmd, cwd=module_dir(), env=env, log=build_log, progress=progress)
        if code != 0:
            tail = "\n".join(log_path.read_text().splitlines()[-30:])
            raise BinaryError(f"go build of the kube binaries failed (log {log_path}):\n{tail}")
        missing = [c for c in COMPONENTS if not (target / c).exists()]
        if missing:
            raise BinaryError(f"go build produced no {', '.join(missing)} in {target}")
        (target / ".complete").write_text(f"{time.monotonic() - started:.1f}\n")
        log.info("built kube binaries", seconds=round(time.monotonic() - started, 1))


def build_seconds() -> float | None:
    """How long the cached build took, if this cache entry was built here."""
    done = build_dir() / ".complete"
    try:
        return float(done.read_text().strip())
    except (OSError, ValueError):
        return None
