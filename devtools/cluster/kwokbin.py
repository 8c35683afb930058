"""Build (or find) ``kwok``, which keeps simulated Nodes alive for the scale bench.

The source is the Go module in ``kwokbin/``: it requires only sigs.k8s.io/kwok, so its
go.mod and go.sum hold exactly the dependency versions kwok's own go.mod selects (v0.8.0:
Go 1.26, client-go v0.36). kwok's ``cmd/kwok`` is built directly (no wrapper main): its
entry point is a cobra command with flags only, nothing to adapt.

The binary is cached outside the work tree in ``<cache>/kwok/<version>-<digest>/kwok``,
where ``<cache>`` is ``DRADRIVER_CACHE_DIR`` or ``~/.cache/dradriver`` and the digest
covers kwokbin/'s go.mod, go.sum and Go files plus the build flags, so another checkout
of the same sources reuses it. ``DRADRIVER_KWOK`` names a kwok binary to use instead (no
build). A cold build prints its progress (packages compiled of the total ``go list``
names), like the kube binaries.

``python -m devtools.cluster.kwokbin`` builds or finds it and prints its path.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from devtools import paths
from devtools.cluster import gotool
from devtools.cluster.gomodule import hash_go_sources
from devtools.cluster.progress import Progress, count_go_packages, run_go_build
from devtools.cluster.runtimebin import cache_root
from dradriver.log import configure, get_logger

log = get_logger("cluster.kwokbin")

KWOK_MODULE = "sigs.k8s.io/kwok"
PACKAGE = f"{KWOK_MODULE}/cmd/kwok"
OVERRIDE_ENV = "DRADRIVER_KWOK"


class KwokBuildError(RuntimeError):
    """kwok cannot be built or found; the message says what to do."""


def source_dir() -> Path:
    return paths.REPO / "kwokbin"


def pinned_version(source: Path | None = None) -> str:
    """The kwok version kwokbin/go.mod requires, e.g. ``v0.8.0``."""
    gomod = ((source or source_dir()) / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(KWOK_MODULE)}\s+(v\S+)", gomod, re.M)
    if match is None:
        raise KwokBuildError(f"{source or source_dir()}/go.mod does not require {KWOK_MODULE}")
    return match.group(1)


def ldflags(version: str) -> str:
    """Stripped, like the kube binaries; kwok's module already carries its own version
    string (pkg/consts.Version), so nothing is stamped in."""
    del version  # part of the signature so a future stamp changes the cache key
    return "-s -w"


def source_key(source: Path | None = None) -> str:
    """A digest of everything that determines the binary's content."""
    source = source or source_dir()
    digest = hashlib.sha256(f"{PACKAGE}\0{ldflags(pinned_version(source))}\n".encode())
    hash_go_sources(digest, source)
    return digest.hexdigest()[:16]


def build_dir() -> Path:
    return cache_root() / "kwok" / f"{pinned_version()}-{source_key()}"


def ensure_kwok() -> Path:
    """The path of kwok, building it on a cache miss (or ``$DRADRIVER_KWOK``)."""
    return gotool.ensure(OVERRIDE_ENV, build_dir(), "kwok", _build, KwokBuildError)


def _build(target: Path) -> None:
    go = shutil.which("go")
    if go is None:
        raise KwokBuildError(
            "the Go toolchain is not on PATH; install Go 1.26 or newer (kwok is built from "
            f"the Go module proxy), or set {OVERRIDE_ENV} to a kwok v0.8 binary"
        )
    with gotool.build_lock(target) as to_build:
        if not to_build:
            return
        version = pinned_version()
        out = target / "kwok"
        cmd = [go, "build", "-v", "-trimpath", "-ldflags", ldflags(version), "-o", str(out)]
        env = dict(os.environ, CGO_ENABLED="0")
        total = count_go_packages(go, [PACKAGE], source_dir(), env)
        progress = Progress(f"kwok {version}", total, "packages")
        log_path = target / "build.log"
        started = time.monotonic()
        with open(log_path, "w") as build_log:
            build_log.write(f"$ CGO_ENABLED=0 {' '.join([*cmd, PACKAGE])}\n")
            build_log.flush()
            code = run_go_build(
                [*cmd, PACKAGE], cwd=source_dir(), env=env, log=build_log, progress=progress
            )
        took = time.monotonic() - started
        if code != 0 or not os.access(out, os.X_OK):
            tail = gotool.log_tail(log_path)
            raise KwokBuildError(f"go build of kwok failed (exit {code}); {log_path}:\n{tail}")
        gotool.record_complete(target, took, version)
        log.info(f"built kwok {version} in {took:.0f} s", path=str(out))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.cluster.kwokbin",
        description="Build (or find cached) kwok from the Go module proxy; print its path.",
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    configure(args.log_level)
    try:
        kwok = ensure_kwok()
    except KwokBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(kwok)
    return 0


if __name__ == "__main__":
    sys.exit(main())
