"""Build and locate the real Kubernetes binaries the local cluster runs, per version.

Each supported Kubernetes release has a Go module of its own in
``kubebin/versions/<version>/`` (``go.mod`` and ``go.sum`` only, pinning
k8s.io/kubernetes and every staging module to that release); the command
sources in ``kubebin/cmd/`` are shared by all of them, since the upstream entry
points they call have kept their signatures from 1.34 on. A build copies the
two into one module dir and runs ``go build`` there.

The binaries are cached outside the work tree under a key derived from the
version and those sources, so a second build, a CI run on the same machine or
another checkout of the same sources reuses them, and versions live side by
side (``~/.cache/dradriver/kube/<version>-<key>/``).

A module for a new release is generated, not written by hand:
``python -m devtools.cluster.binaries pin v1.38.0`` writes its go.mod from the
release's own list of staging modules and lets ``go mod tidy`` fill in go.sum.

Two things a release may need that the machine lacks, both recorded in its go.mod so a
build repeats them:

* a newer Go than the machine's: the release's ``go`` directive names it; ``pin`` then
  takes :data:`NEWER_TOOLCHAIN` (the approved one, fetched through the Go module proxy
  like a module) and writes a ``toolchain`` line, and a build sets ``GOTOOLCHAIN`` to
  that line for this release only (a machine ignores the line on its own);
* a module the proxy refuses: :data:`STUBS` names a stand-in of ours under
  ``kubebin/stubs/`` (each says what it leaves out), put in with a ``replace``.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from devtools import paths
from devtools.cluster.progress import Progress, count_go_packages, run_go_build
from dradriver.log import get_logger

log = get_logger("cluster.binaries")

# The newest stable release: the full test suite runs on it, and it is what a
# cluster runs unless told otherwise.
PRIMARY_VERSION = "v1.37.2"
# Every release the local cluster can run; the compatibility subset runs on the
# others. Oldest first; a pre-release newer than the primary one (the newest the Go
# module proxy serves) is a compatibility column until its final release is served.
SUPPORTED_VERSIONS = ("v1.34.4", "v1.35.4", "v1.36.3", "v1.37.2", "v1.38.0-beta.0")
VERSION_ENV = "DRADRIVER_KUBE_VERSION"
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kubectl",
    "fakecri",
)
# The envtest convention: a directory holding kube-apiserver and etcd.
ENVTEST_COMPONENTS = ("etcd", "kube-apiserver")
# The approved Go toolchain for releases whose go directive is newer than the machine's Go.
NEWER_TOOLCHAIN = "go1.27.3"
# Modules the Go module proxy refuses, and the stand-in of ours (under kubebin/) that a
# release requiring one is built with.
STUBS = {"sigs.k8s.io/iptables-wrappers": "stubs/iptables-wrappers"}
# A release tag as the Go module proxy serves it (pre-releases included).
_VERSION_RE = re.compile(r"^v1\.(\d+)\.(\d+)(-(alpha|beta|rc)\.\d+)?$")


class BinaryError(RuntimeError):
    """The kube binaries cannot be built or found; the message says what to do."""


def repo_root() -> Path:
    return paths.REPO


def module_dir() -> Path:
    return repo_root() / "kubebin"


def version_module(version: str) -> Path:
    """The dir with the go.mod and go.sum of one release."""
    return module_dir() / "versions" / version


def cache_root() -> Path:
    base = os.environ.get("DRADRIVER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dradriver"
    )
    return Path(base)


def minor_of(version: str) -> int:
    match = _VERSION_RE.match(version)
    if match is None:
        raise ValueError(f"{version!r} is not a Kubernetes release tag like v1.37.2")
    return int(match.group(1))


def resolve_version(text: str | None = None) -> str:
    """The release to run: ``text``, else $DRADRIVER_KUBE_VERSION, else the primary one.

    ``v1.35`` or ``1.35`` name the supported patch release of that minor; a
    full tag must be one this checkout has a module for.
    """
    wanted = (text or os.environ.get(VERSION_ENV) or PRIMARY_VERSION).strip()
    if not wanted.startswith("v"):
        wanted = "v" + wanted
    if re.fullmatch(r"v1\.\d+", wanted):
        found = [v for v in SUPPORTED_VERSIONS if v.startswith(wanted + ".")]
        if found:
            return found[-1]
    elif version_module(wanted).joinpath("go.mod").exists():
        return wanted
    raise BinaryError(
        f"Kubernetes {wanted} has no module in {module_dir() / 'versions'}; choose one of "
        f"{', '.join(SUPPORTED_VERSIONS)} (or a minor like v1.35), or generate it with "
        f"`python -m devtools.cluster.binaries pin {wanted}`"
    )


def _ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    return (
        f"-s -w -X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major}"
        f" -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean"
    )


def _command_files(commands: Path) -> list[tuple[str, Path]]:
    """(name in the build module, file) for each shared command source."""
    return [(str(p.relative_to(commands.parent)), p) for p in sorted(commands.glob("*/*.go"))]


def _stub_files(module: Path) -> list[tuple[str, Path]]:
    """(name in the build module, file) for the stand-ins the release's go.mod replaces."""
    return _stub_files_for((module / "go.mod").read_text())


def _stub_files_for(text: str) -> list[tuple[str, Path]]:
    """(name in the build module, file) for the stand-ins go.mod ``text`` replaces."""
    stubs = module_dir() / "stubs"
    out: list[tuple[str, Path]] = []
    for rel in sorted(set(STUBS.values())):
        if f"=> ./{rel}" in text:
            root = module_dir() / rel
            files = sorted(p for p in root.rglob("*") if p.is_file())
            out += [(str(p.relative_to(stubs.parent)), p) for p in files]
    return out


def _source_files(module: Path, commands: Path) -> list[tuple[str, Path]]:
    """(name in the build module, file) for everything that goes into a build."""
    return [
        ("go.mod", module / "go.mod"),
        ("go.sum", module / "go.sum"),
        *_command_files(commands),
        *_stub_files(module),
    ]


_TOOLCHAIN_RE = re.compile(r"^toolchain (go\S+)$", re.MULTILINE)


def toolchain_of(module: Path) -> str | None:
    """The Go toolchain a release's module names (``toolchain`` line), if any."""
    found = _TOOLCHAIN_RE.search((module / "go.mod").read_text())
    return found.group(1) if found else None


def go_env(module: Path) -> dict[str, str]:
    """The environment for ``go`` commands on a release's module: its toolchain, if any."""
    env = dict(os.environ)
    toolchain = toolchain_of(module)
    if toolchain is not None:
        env["GOTOOLCHAIN"] = toolchain
    return env


def source_key(module: Path, version: str, commands: Path | None = None) -> str:
    """A digest of everything that determines one release's binaries."""
    commands = commands or module_dir() / "cmd"
    digest = hashlib.sha256()
    digest.update(_ldflags(version).encode())
    for name, path in _source_files(module, commands):
        digest.update(name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class KubeBinaries:
    """Paths of every component binary, by component name, and their release."""

    paths: dict[str, Path]
    version: str = PRIMARY_VERSION

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


def build_dir(version: str | None = None) -> Path:
    version = resolve_version(version)
    key = source_key(version_module(version), version)
    return cache_root() / "kube" / f"{version}-{key}"


def ensure_binaries(version: str | None = None) -> KubeBinaries:
    """Return one release's binaries, building them first if the cache has none."""
    version = resolve_version(version)
    target = build_dir(version)
    done = target / ".complete"
    if not done.exists():
        _build(target, version)
    found = {c: target / c for c in COMPONENTS}
    found.update(_envtest_overrides())
    return KubeBinaries(found, version)


def _assemble(version: str, into: Path) -> None:
    """Lay out one buildable module: the release's go.mod/go.sum and the shared commands."""
    commands = module_dir() / "cmd"
    for name, path in _source_files(version_module(version), commands):
        dest = into / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)


def _build(target: Path, version: str) -> None:
    go = shutil.which("go")
    if go is None:
        raise BinaryError(
            "the Go toolchain is not on PATH; install Go 1.26 or newer (the kube "
            "binaries are built from the Go module proxy), or put prebuilt "
            f"binaries for {version} in {target}"
        )
    target.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock:
        # Another process (a parallel test run, CI) may be building the same key.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return
        log.info("building kube binaries", version=version, into=str(target))
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f".src-{version}-", dir=target.parent) as src:
            _assemble(version, Path(src))
            cmd = [
                go,
                "build",
                "-v",
                "-tags",
                "providerless",
                "-trimpath",
                "-ldflags",
                _ldflags(version),
                "-o",
                str(target) + "/",
                "./cmd/...",
            ]
            env = go_env(version_module(version))
            env.setdefault("CGO_ENABLED", "1")
            # -v names each package as it is compiled: the progress counts them against
            # the package set go list gives for the same targets and tags.
            total = count_go_packages(go, ["./cmd/..."], Path(src), env, ["-tags", "providerless"])
            progress = Progress(f"kube {version} binaries", total, "packages")
            log_path = target / "build.log"
            with open(log_path, "w") as build_log:
                code = run_go_build(cmd, cwd=Path(src), env=env, log=build_log, progress=progress)
        if code != 0:
            tail = "\n".join(log_path.read_text().splitlines()[-30:])
            raise BinaryError(
                f"go build of the kube {version} binaries failed (log {log_path}):\n{tail}"
            )
        missing = [c for c in COMPONENTS if not (target / c).exists()]
        if missing:
            raise BinaryError(f"go build produced no {', '.join(missing)} in {target}")
        (target / ".complete").write_text(f"{time.monotonic() - started:.1f}\n")
        log.info("built kube binaries", seconds=round(time.monotonic() - started, 1))


def build_seconds(version: str | None = None) -> float | None:
    """How long the cached build took, if this cache entry was built here."""
    done = build_dir(version) / ".complete"
    try:
        return float(done.read_text().strip())
    except (OSError, ValueError):
        return None


# ----- generating a release's module ------------------------------------------

_STAGING_RE = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", re.MULTILINE)


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The staging modules k8s.io/kubernetes replaces with its own ./staging copies."""
    return sorted(set(_STAGING_RE.findall(kubernetes_go_mod)))


def _go_version(text: str) -> tuple[int, ...]:
    """``go1.26.8`` or ``1.27.0`` as a comparable tuple."""
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def module_text(version: str, kubernetes_go_mod: str, local_go: str = "") -> str:
    """The go.mod of a release's module, before ``go mod tidy`` completes it.

    k8s.io/kubernetes points its staging modules at ./staging; a module that
    depends on it must pin each one to the matching release (v1.X.Y -> v0.X.Y).
    A release that needs a newer Go than ``local_go`` (``go1.26.8``) gets a
    ``toolchain`` line naming :data:`NEWER_TOOLCHAIN`; a module of :data:`STUBS`
    it requires is replaced by our stand-in.
    """
    minor_of(version)  # validates the tag
    staging_version = "v0." + version.removeprefix("v1.")
    go_line = re.search(r"^go (\S+)$", kubernetes_go_mod, re.MULTILINE)
    if go_line is None:
        raise BinaryError(f"the go.mod of k8s.io/kubernetes {version} has no go directive")
    replaces = "".join(
        f"\t{m} => {m} {staging_version}\n" for m in staging_modules(kubernetes_go_mod)
    )
    stubs = "".join(
        f"\t{m} => ./{rel}\n"
        for m, rel in sorted(STUBS.items())
        if re.search(rf"^\s*{re.escape(m)}\s", kubernetes_go_mod, re.MULTILINE)
    )
    toolchain = ""
    if local_go and _go_version(go_line.group(1)) > _go_version(local_go):
        toolchain = f"toolchain {NEWER_TOOLCHAIN}\n\n"
    text = (
        "module dradriver.dev/kubebin\n\n"
        f"{go_line.group(0)}\n\n"
        f"{toolchain}"
        f"require k8s.io/kubernetes {version}\n\n"
        "// k8s.io/kubernetes points its staging modules at ./staging; pin each\n"
        "// one to the matching release instead.\n"
        f"replace (\n{replaces})\n"
    )
    if stubs:
        text += (
            "\n// Refused by the Go module proxy: stand-ins of ours (kubebin/stubs/).\n"
            f"replace (\n{stubs})\n"
        )
    return text


def _local_go(go: str) -> str:
    """The machine's own Go version (``go1.26.8``), whatever GOTOOLCHAIN says."""
    env = dict(os.environ, GOTOOLCHAIN="local")
    out = subprocess.run(
        [go, "env", "GOVERSION"], capture_output=True, text=True, check=False, env=env
    )
    return out.stdout.strip()


def pin(version: str) -> Path:
    """Generate ``kubebin/versions/<version>/`` from the Go module proxy."""
    go = shutil.which("go")
    if go is None:
        raise BinaryError("the Go toolchain is not on PATH; install Go 1.26 or newer")
    minor_of(version)
    # The download needs no toolchain of the release's own: GOTOOLCHAIN=local.
    fetched = subprocess.run(
        [go, "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, GOTOOLCHAIN="local"),
    )
    match = re.search(r'"GoMod":\s*"([^"]+)"', fetched.stdout)
    if match is None:
        raise BinaryError(
            f"the Go module proxy has no k8s.io/kubernetes {version}: {fetched.stdout.strip()}"
        )
    text = module_text(version, Path(match.group(1)).read_text(), _local_go(go))
    with tempfile.TemporaryDirectory(prefix="kubebin-pin-") as tmp:
        work = Path(tmp)
        (work / "go.mod").write_text(text)
        files = _command_files(module_dir() / "cmd")
        files += [(n, p) for n, p in _stub_files_for(text)]
        for name, path in files:
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, work / name)
        env = dict(os.environ, GOFLAGS="-mod=mod")
        toolchain = _TOOLCHAIN_RE.search(text)
        if toolchain is not None:
            env["GOTOOLCHAIN"] = toolchain.group(1)
        tidy = subprocess.run(
            [go, "mod", "tidy"],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        )
        if tidy.returncode != 0:
            tail = "\n".join(tidy.stdout.splitlines()[-10:])
            raise BinaryError(f"`go mod tidy` for kube {version} failed:\n{tail}")
        dest = version_module(version)
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("go.mod", "go.sum"):
            shutil.copyfile(work / name, dest / name)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.cluster.binaries")
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("pin", help="generate a release's Go module").add_argument("version")
    build = sub.add_parser("build", help="build (or find cached) binaries; print their dir")
    build.add_argument("version", nargs="?", help=f"default: ${VERSION_ENV} or {PRIMARY_VERSION}")
    args = parser.parse_args(argv)
    try:
        if args.action == "pin":
            print(pin(args.version))
        else:
            print(ensure_binaries(args.version).paths["kubelet"].parent)
    except (BinaryError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
