"""Build the dradriver image without a registry or a container engine.

Two layers, each cached by a digest of what determines it:

1. **base**: ``mmdebstrap`` (Debian's tool, installed with apt-get when
   missing) writes a Debian :data:`~devtools.image.recipe.DEBIAN_SUITE`
   ``minbase`` root filesystem with the recipe's packages and user as a tar,
   fetched from Debian's mirror. Key: the recipe's base settings.
2. **app**: the dradriver wheel (``pip wheel`` of the checkout; setup.py
   generates the gRPC stubs while building it) and its runtime dependencies
   from PyPI are installed into a virtualenv at :data:`~devtools.image.recipe.VENV`
   by the image's own Python (``chroot`` into the unpacked base, pip run from
   its wheel file, so neither pip nor setuptools lands in the image), byte
   code compiled with hash-based invalidation. Key: the base key, the
   dradriver sources and packaging files.

The result is an OCI archive ``<cache>/images/dradriver-<key>.tar`` with a
``.json`` record beside it (name, digest, size, build seconds); a second
build with the same key only reads that record. Building needs root
(mmdebstrap's root mode and chroot), as the local cluster does.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from devtools import paths
from devtools.cluster.images import ImageError, go_arch, images_dir
from devtools.cluster.progress import Progress, run_logged
from devtools.image import recipe
from devtools.image.ociarchive import ContainerConfig, write_archive, write_directory_layer

# Bumped when this module changes what it puts into a layer.
RECIPE_REVISION = "1"
# The packaging inputs of the wheel, besides its packages' sources. README.md (the
# wheel's long description) is left out on purpose: the README changes with most
# commits and nothing runs it, so an edit must not cost every checkout an image build;
# a cached image's METADATA may carry an older description.
PACKAGING_FILES = ("pyproject.toml", "setup.py")
SOURCE_PACKAGES = ("dradriver", "controller", "kubeletplugin")
SOURCE_SUFFIXES = (".py", ".proto", ".typed")
# How many image archives (most recently used first) and base layers the cache keeps.
KEEP_IMAGES = 4
KEEP_BASES = 2
# Every entry's mtime in the base layer (as the small test images use).
SOURCE_DATE_EPOCH = "946684800"


@dataclass(frozen=True)
class BuiltImage:
    """An image archive in the cache and how it came to be."""

    name: str
    path: Path
    manifest_digest: str
    size: int
    base_size: int
    app_size: int
    build_seconds: float
    cached: bool  # this call found it, built nothing

    def record(self) -> dict[str, object]:
        doc = asdict(self)
        doc["path"] = str(self.path)
        del doc["cached"]
        return doc


def version(root: Path | None = None) -> str:
    root = root or paths.REPO
    with open(root / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def default_name(root: Path | None = None) -> str:
    """``docker.io/library/dradriver:<version>``: what ``image: dradriver:<version>`` means."""
    return f"{recipe.CANONICAL_PREFIX}{recipe.REPOSITORY}:{version(root)}"


def _digest(parts: Sequence[bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()[:16]


def base_key() -> str:
    settings = [
        RECIPE_REVISION,
        recipe.DEBIAN_SUITE,
        recipe.DEBIAN_MIRROR,
        go_arch(),
        *recipe.PACKAGES,
        *recipe.DPKG_PATH_EXCLUDES,
        *(" ".join(cmd) for cmd in recipe.ADD_USER),
    ]
    return _digest([s.encode() for s in settings])


def source_files(root: Path) -> list[Path]:
    """The files the wheel is built from (generated stubs excluded: they follow the protos)."""
    found = [root / name for name in PACKAGING_FILES]
    for package in SOURCE_PACKAGES:
        for path in sorted((root / package).rglob("*")):
            rel = path.relative_to(root).parts
            if "__pycache__" in rel or "gen" in rel or not path.is_file():
                continue
            if path.suffix in SOURCE_SUFFIXES:
                found.append(path)
    return found


def image_key(name: str, root: Path | None = None) -> str:
    root = root or paths.REPO
    settings = [RECIPE_REVISION, base_key(), name, *recipe.ENV, *recipe.CMD, recipe.USER]
    parts = [s.encode() for s in (*settings, recipe.VENV, recipe.DISTRIBUTION)]
    for path in source_files(root):
        parts += [path.relative_to(root).as_posix().encode(), path.read_bytes()]
    return _digest(parts)


def image_path(name: str, root: Path | None = None) -> Path:
    return images_dir() / f"{recipe.REPOSITORY}-{image_key(name, root)}.tar"


# --- running the tools ------------------------------------------------------------


def _run(
    cmd: Sequence[str],
    log: Path,
    what: str,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    on_line: Callable[[str], None] | None = None,
) -> None:
    """Run ``cmd`` with its output appended to ``log``; on failure the error has the tail."""
    with open(log, "a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        code = run_logged(cmd, cwd=cwd, env=env, log=out, on_line=on_line)
    if code != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise ImageError(f"{what} failed (exit {code}); the end of {log}:\n{tail}")


def _require_root() -> None:
    if os.geteuid() != 0:
        raise ImageError(
            "building the image needs root (mmdebstrap's root mode and chroot), "
            "as the local cluster does"
        )


def _ensure_mmdebstrap(log: Path) -> str:
    found = shutil.which("mmdebstrap")
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise ImageError("mmdebstrap is not installed and there is no apt-get to install it")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        _run(["apt-get", "install", "-y", "-q", "mmdebstrap"], log, "apt-get install", env=env)
    except ImageError:
        # A fresh machine has no package lists yet.
        _run(["apt-get", "update", "-q"], log, "apt-get update", env=env)
        _run(["apt-get", "install", "-y", "-q", "mmdebstrap"], log, "apt-get install", env=env)
    found = shutil.which("mmdebstrap")
    if not found:
        raise ImageError("apt-get installed mmdebstrap, but it is not on PATH")
    return found


# --- the layers ---------------------------------------------------------------------


def base_layer(log: Path) -> Path:
    """The Debian layer, from the cache or built with mmdebstrap."""
    dest = images_dir() / f"{recipe.REPOSITORY}-base-{base_key()}.tar"
    if dest.exists():
        os.utime(dest)  # used now (see prune)
        return dest
    mmdebstrap = _ensure_mmdebstrap(log)
    add_user = [f'--customize-hook=chroot "$1" {" ".join(cmd)}' for cmd in recipe.ADD_USER]
    # apt's lists and caches and the logs of the build itself are no part of the image.
    cleanup = 'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*'
    cmd = [mmdebstrap, "--mode=root", "--variant=minbase", "--format=tar"]
    # Merged /usr made by mmdebstrap's hook: the usrmerge package would pull in all of perl.
    cmd += ["--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr"]
    cmd += ['--aptopt=APT::Install-Recommends "false"']
    cmd += ["--include=" + ",".join(recipe.PACKAGES)]
    cmd += [f"--dpkgopt=path-exclude={p}" for p in recipe.DPKG_PATH_EXCLUDES]
    cmd += [*add_user, f"--customize-hook={cleanup}", "--skip=output/dev"]
    tmp = dest.with_name(f".tmp-{dest.name}")
    cmd += [recipe.DEBIAN_SUITE, str(tmp), recipe.DEBIAN_MIRROR]
    env = dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH)
    progress = Progress("image: Debian base", None, "steps")
    progress.start(f"mmdebstrap {recipe.DEBIAN_SUITE}, log {log}")

    def step(line: str) -> None:
        # mmdebstrap announces each phase with "I: ..." ("downloading packages", ...).
        if line.startswith("I: ") and line.rstrip().endswith("..."):
            progress.advance(detail=line[3:].strip().rstrip("."))

    try:
        _run(cmd, log, "mmdebstrap", env=env, on_line=step)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    progress.finish(f"{dest.stat().st_size / 1e6:.0f} MB")
    return dest


def wheelhouse(dest: Path, log: Path, root: Path) -> Path:
    """The dradriver wheel and every runtime dependency as wheels in ``dest``; pip's wheel."""
    progress = Progress("image: wheels", None, "requirements")
    progress.start(f"pip wheel of the checkout, log {log}")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    env = dict(os.environ)
    # The host's pip settings must not pick other sources or extras for the image.
    for var in [v for v in env if v.startswith("PIP_")]:
        del env[var]

    def collected(line: str) -> None:
        # pip names each requirement once as it resolves it ("Collecting NAME...").
        if line.startswith("Collecting "):
            progress.advance(detail=line.split()[1])

    # No extras: [dev] never reaches the image.
    _run(
        [*pip, "wheel", "--wheel-dir", str(dest), str(root)],
        log,
        "pip wheel",
        env=env,
        on_line=collected,
    )
    tools = dest.parent / "tools"
    tools.mkdir()
    # The pip that runs the install inside the image (and is not left there): the same
    # version as this one, so that pip's cache has it and the result does not drift.
    this_pip = f"pip=={importlib.metadata.version('pip')}"
    _run(
        [*pip, "download", "--no-deps", "--only-binary=:all:", "-d", str(tools), this_pip],
        log,
        "pip download pip",
        env=env,
    )
    found = sorted(tools.glob("pip-*.whl"))
    if not found:
        raise ImageError(f"pip download left no pip wheel in {tools}")
    progress.finish()
    return found[-1]


def app_layer(base: Path, wheels: Path, pip_wheel: Path, dest: Path, work: Path, log: Path) -> None:
    """Install the wheels into the venv with the image's own Python; the venv as a layer."""
    progress = Progress("image: venv", 4, "steps")
    progress.start("unpacking the base")
    rootfs = work / "rootfs"
    rootfs.mkdir()
    _run(["tar", "-xf", str(base), "-C", str(rootfs), "--numeric-owner"], log, "tar -x base")
    inside = "/tmp/dradriver-build"
    shutil.copytree(wheels, rootfs / inside.lstrip("/") / "wheels")
    shutil.copy2(pip_wheel, rootfs / inside.lstrip("/") / pip_wheel.name)
    env = {"PATH": recipe.DEFAULT_PATH, "LC_ALL": "C.UTF-8", "HOME": "/nonexistent"}
    chroot = ["chroot", str(rootfs)]
    python = f"{recipe.VENV}/bin/python"
    progress.advance(detail="creating the venv")
    _run([*chroot, recipe.PYTHON, "-m", "venv", "--without-pip", recipe.VENV], log, "venv", env=env)
    progress.advance(detail="pip install")
    _run(
        [
            *chroot,
            python,
            f"{inside}/{pip_wheel.name}/pip",
            "install",
            "--no-index",
            "--find-links",
            f"{inside}/wheels",
            "--no-compile",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--no-warn-script-location",
            recipe.DISTRIBUTION,
        ],
        log,
        "pip install in the image",
        env=env,
    )
    progress.advance(detail="compiling byte code")
    # Hash-based .pyc: no source mtimes in the image, and nothing to rewrite at run time.
    # One process: the chroot has no /dev/shm for compileall's worker pool.
    _run(
        [
            *chroot,
            python,
            "-m",
            "compileall",
            "-q",
            "--invalidation-mode",
            "unchecked-hash",
            f"{recipe.VENV}/lib",
        ],
        log,
        "compileall",
        env=env,
    )
    progress.advance(detail="writing the layer")
    write_directory_layer(rootfs, recipe.VENV, dest)
    progress.finish(f"{dest.stat().st_size / 1e6:.0f} MB")


# --- the image ------------------------------------------------------------------------


def _load_record(path: Path) -> BuiltImage | None:
    record = path.with_suffix(".json")
    try:
        doc = json.loads(record.read_text())
        image = BuiltImage(**{**doc, "path": Path(doc["path"]), "cached": True})
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if image.path != path or not path.exists() or path.stat().st_size != image.size:
        return None
    # Used now: pruning goes by last use, and keeps this one.
    os.utime(path)
    return image


def prune(keep: int = KEEP_IMAGES, keep_bases: int = KEEP_BASES) -> list[Path]:
    """Delete all but the ``keep`` most recently used image archives (and bases); the deleted.

    Every change of the wheel's sources makes a new ~300 MB archive; worktrees
    and branches in use at once each keep theirs among the newest.
    """
    directory = images_dir()
    removed: list[Path] = []
    prefix = f"{recipe.REPOSITORY}-"
    archives = [
        p for p in directory.glob(prefix + "*.tar") if not p.name.startswith(prefix + "base-")
    ]
    bases = list(directory.glob(prefix + "base-*.tar"))
    for group, count in ((archives, keep), (bases, keep_bases)):
        group.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        for old in group[count:]:
            for path in (old, old.with_suffix(".json"), old.with_suffix(".log")):
                path.unlink(missing_ok=True)
            removed.append(old)
    return removed


def ensure_image(name: str | None = None, root: Path | None = None) -> BuiltImage:
    """The image archive for this checkout: from the cache, or built now."""
    root = root or paths.REPO
    name = name or default_name(root)
    dest = image_path(name, root)
    found = _load_record(dest)
    if found is not None:
        return found
    _require_root()
    directory = images_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f".{recipe.REPOSITORY}-image.lock", "w") as lock:
        # A parallel run (another test session, CI) may be building the same key.
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _load_record(dest)
        if found is not None:
            return found
        return _build(name, root, dest)


def _build(name: str, root: Path, dest: Path) -> BuiltImage:
    started = time.monotonic()
    log = dest.with_suffix(".log")
    log.write_text("")
    base = base_layer(log)
    with tempfile.TemporaryDirectory(dir=images_dir(), prefix=".build-") as tmp:
        work = Path(tmp)
        wheels = work / "wheels"
        pip_wheel = wheelhouse(wheels, log, root)
        app = work / "app.tar"
        app_layer(base, wheels, pip_wheel, app, work, log)
        config = ContainerConfig(env=recipe.ENV, cmd=recipe.CMD, user=recipe.USER)
        history = [
            f"mmdebstrap --variant=minbase {recipe.DEBIAN_SUITE} + {' '.join(recipe.PACKAGES)}",
            f"pip install {recipe.DISTRIBUTION} into {recipe.VENV}",
        ]
        written = write_archive(dest, name, [base, app], config, go_arch(), history)
        image = BuiltImage(
            name=name,
            path=dest,
            manifest_digest=written.manifest_digest,
            size=written.size,
            base_size=base.stat().st_size,
            app_size=app.stat().st_size,
            build_seconds=round(time.monotonic() - started, 1),
            cached=False,
        )
    dest.with_suffix(".json").write_text(json.dumps(image.record(), indent=1) + "\n")
    prune()
    return image
