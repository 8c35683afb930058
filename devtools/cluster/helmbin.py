"""Build (or find) the ``helm`` the chart tests and ``dradriver cluster up`` users run.

The source is the Go module in ``helmbin/``: it requires only helm.sh/helm/v3, so its
go.mod and go.sum hold exactly the dependency versions helm's own go.mod selects. Helm
3 (v3.22.0), not 4: the chart is ``apiVersion: v2``, which both read, and v3 is the
helm that most users and CI systems (kind-based tests of the reference drivers) run
today; a chart tested with v3 is what they install. Helm 4's server-side apply default
and kstatus waits are not needed by anything here.

The binary is cached outside the work tree in ``<cache>/helm/<version>-<digest>/helm``,
where ``<cache>`` is ``DRADRIVER_CACHE_DIR`` or ``~/.cache/dradriver`` and the digest
covers helmbin/'s go.mod, go.sum and Go files plus the build flags, so another checkout
of the same sources reuses it. ``DRADRIVER_HELM`` names a helm binary to use instead
(no build).

``python -m devtools.cluster.helmbin`` (``make helm``) builds or finds it and prints its
path.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from devtools import paths
from devtools.cluster import gotool
from devtools.cluster.gomodule import hash_go_sources
from devtools.cluster.runtimebin import cache_root
from dradriver.log import configure, get_logger

log = get_logger("cluster.helmbin")

HELM_MODULE = "helm.sh/helm/v3"
PACKAGE = f"{HELM_MODULE}/cmd/helm"
# How often a long `go build` reports that it is still running.
HEARTBEAT_SECONDS = 30.0
OVERRIDE_ENV = "DRADRIVER_HELM"


class HelmBuildError(RuntimeError):
    """helm cannot be built or found; the message says what to do."""


def source_dir() -> Path:
    return paths.REPO / "helmbin"


def pinned_version(source: Path | None = None) -> str:
    """The helm version helmbin/go.mod requires, e.g. ``v3.22.0``."""
    gomod = ((source or source_dir()) / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(HELM_MODULE)}\s+(v\S+)", gomod, re.M)
    if match is None:
        raise HelmBuildError(f"{source or source_dir()}/go.mod does not require {HELM_MODULE}")
    return match.group(1)


def client_go_minor(source: Path | None = None) -> str:
    """The Kubernetes minor of the client-go helm is built with (``v0.37.0`` -> ``37``)."""
    gomod = ((source or source_dir()) / "go.mod").read_text()
    match = re.search(r"^\s*k8s\.io/client-go\s+v0\.(\d+)\.", gomod, re.M)
    if match is None:
        raise HelmBuildError(f"{source or source_dir()}/go.mod does not require k8s.io/client-go")
    return match.group(1)


def ldflags(version: str, kube_minor: str) -> str:
    """As helm's own Makefile sets them: the version ``helm version`` reports, and the
    Kubernetes version ``helm template`` and ``helm lint`` assume without a cluster (that
    of its client-go; unset, helm assumes 1.20 and refuses a chart's ``kubeVersion:
    >=1.34``)."""
    flags = [f"-s -w -X {HELM_MODULE}/internal/version.version={version}"]
    for package in ("pkg/lint/rules", "pkg/chartutil"):
        flags.append(f"-X {HELM_MODULE}/{package}.k8sVersionMajor=1")
        flags.append(f"-X {HELM_MODULE}/{package}.k8sVersionMinor={kube_minor}")
    return " ".join(flags)


def source_key(source: Path | None = None) -> str:
    """A digest of everything that determines the binary's content."""
    source = source or source_dir()
    flags = ldflags(pinned_version(source), client_go_minor(source))
    digest = hashlib.sha256(f"{PACKAGE}\0{flags}\n".encode())
    hash_go_sources(digest, source)
    return digest.hexdigest()[:16]


def build_dir() -> Path:
    return cache_root() / "helm" / f"{pinned_version()}-{source_key()}"


def ensure_helm() -> Path:
    """The path of helm, building it on a cache miss (or ``$DRADRIVER_HELM``)."""
    return gotool.ensure(OVERRIDE_ENV, build_dir(), "helm", _build, HelmBuildError)


def cached_helm() -> Path | None:
    """helm if it is already built (or named by ``$DRADRIVER_HELM``), else None."""
    return gotool.cached(OVERRIDE_ENV, build_dir(), "helm")


def _build(target: Path) -> None:
    go = shutil.which("go")
    if go is None:
        raise HelmBuildError(
            "the Go toolchain is not on PATH; install Go 1.26 or newer (helm is built from "
            f"the Go module proxy), or set {OVERRIDE_ENV} to a helm v3 binary"
        )
    with gotool.build_lock(target) as to_build:
        if not to_build:
            return
        version = pinned_version()
        out = target / "helm"
        flags = ldflags(version, client_go_minor())
        cmd = [go, "build", "-trimpath", "-ldflags", flags, "-o", str(out), PACKAGE]
        log_path = target / "build.log"
        log.info(f"building helm {version} (1/1)", into=str(target))
        started = time.monotonic()
        with open(log_path, "a") as build_log:
            build_log.write(f"$ CGO_ENABLED=0 {' '.join(cmd)}\n")
            build_log.flush()
            proc = subprocess.Popen(
                cmd,
                cwd=source_dir(),
                env=dict(os.environ, CGO_ENABLED="0"),
                stdin=subprocess.DEVNULL,
                stdout=build_log,
                stderr=subprocess.STDOUT,
            )
            while True:
                try:
                    code = proc.wait(timeout=HEARTBEAT_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    log.info(f"still building helm {version} (1/1), {elapsed:.0f} s elapsed")
        took = time.monotonic() - started
        if code != 0 or not os.access(out, os.X_OK):
            tail = gotool.log_tail(log_path)
            raise HelmBuildError(f"go build of helm failed (exit {code}); {log_path}:\n{tail}")
        gotool.record_complete(target, took, version)
        log.info(f"built helm {version} in {took:.0f} s", path=str(out))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.cluster.helmbin",
        description="Build (or find cached) helm from the Go module proxy; print its path.",
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    configure(args.log_level)
    try:
        helm = ensure_helm()
    except HelmBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(helm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
