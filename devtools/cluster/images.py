"""Container images for the local cluster, written without a registry.

Each image is an OCI image-layout tarball (``oci-layout``, ``index.json`` and
``blobs/sha256/``: one uncompressed layer, a config and a manifest) that
``ctr images import`` loads into containerd, where the CRI plugin sees it at
once. Two images exist:

- ``registry.k8s.io/pause:3.10``, the sandbox image containerd is pinned to:
  the project's probe binary as ``/pause`` (pause mode), user 65535 as upstream.
- ``dradriver.dev/probe:dev``, the test image: ``/bin/probe`` (entrypoint,
  default command ``report``), Debian's static busybox as ``/bin/busybox``
  with a link for every applet (``sh``, ``ls``, ``cat``, ``env``, ``sleep``,
  ...), ``/etc/passwd``, ``/etc/group``, ``/root`` and ``/tmp``.

The tarballs are deterministic (sorted entries, fixed mtimes, uid/gid 0, no
user names), so an image's digest depends on its content only; they are
cached under ``<cache>/images/`` by that digest. Pods must name them with
``imagePullPolicy: Never`` or ``IfNotPresent``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import platform
import shutil
import struct
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
PROBE_IMAGE = "dradriver.dev/probe:dev"
K8S_NAMESPACE = "k8s.io"

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"

# Every entry's mtime (1 Jan 2000): fixed so that the digest is stable, and
# not 0, which some tools show as "55 years ago" or treat as unset.
MTIME = 946684800
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
    "pause:x:65535:65535:pause:/nonexistent:/bin/false\n"
)
GROUP = "root:x:0:\nnobody:x:65534:\npause:x:65535:\n"


class ImageError(RuntimeError):
    """An image cannot be written or imported; the message says why."""


def cache_root() -> Path:
    base = os.environ.get("DRADRIVER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dradriver"
    )
    return Path(base)


def images_dir() -> Path:
    return cache_root() / "images"


def go_arch() -> str:
    """This machine's architecture in OCI/Go terms (the probe is built for it)."""
    machine = platform.machine()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
    if machine not in arch:
        raise ImageError(f"no OCI architecture known for machine {machine!r}")
    return arch[machine]


# --- the layer ----------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One file, directory or symlink of a layer; ``path`` is relative (no leading /)."""

    path: str
    kind: str  # "dir", "file" or "symlink"
    mode: int = 0o755
    data: bytes = b""
    target: str = ""
    uid: int = 0
    gid: int = 0


@dataclass
class Layer:
    """A layer's entries; :meth:`tar` renders them deterministically."""

    entries: dict[str, Entry] = field(default_factory=dict)

    def add(self, entry: Entry) -> None:
        path = entry.path.strip("/")
        parts = path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            self.entries.setdefault(parent, Entry(parent, "dir", 0o755))
        self.entries[path] = dataclasses.replace(entry, path=path)

    def dir(self, path: str, mode: int = 0o755) -> None:
        self.add(Entry(path, "dir", mode))

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.add(Entry(path, "file", mode, data))

    def symlink(self, path: str, target: str) -> None:
        self.add(Entry(path, "symlink", 0o777, target=target))

    def tar(self) -> bytes:
        return deterministic_tar(self.entries.values())


def _tarinfo(name: str, kind: str, mode: int, size: int = 0, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = {"dir": tarfile.DIRTYPE, "file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE}[kind]
    info.mode = mode
    info.size = size
    info.linkname = target
    info.mtime = MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def deterministic_tar(entries: Iterable[Entry]) -> bytes:
    """A POSIX tar of ``entries`` in path order; equal input gives equal bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(entries, key=lambda e: e.path):
            name = entry.path + "/" if entry.kind == "dir" else entry.path
            info = _tarinfo(name, entry.kind, entry.mode, len(entry.data), entry.target)
            info.uid, info.gid = entry.uid, entry.gid
            tar.addfile(info, io.BytesIO(entry.data) if entry.kind == "file" else None)
    return buf.getvalue()


# --- the OCI layout -------------------------------------------------------------


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Image:
    """A rendered OCI layout tarball and what identifies it."""

    name: str
    manifest_digest: str
    layout: bytes  # the tarball's bytes

    @property
    def size(self) -> int:
        return len(self.layout)


def oci_layout(
    name: str,
    layer: Layer,
    entrypoint: Sequence[str],
    cmd: Sequence[str] = (),
    env: Sequence[str] = (f"PATH={DEFAULT_PATH}",),
    user: str = "",
    arch: str | None = None,
) -> Image:
    """Render image ``name`` (``host/repo:tag``) with one layer as an OCI layout tarball."""
    arch = arch or go_arch()
    if ":" not in name.rsplit("/", 1)[-1]:
        raise ImageError(f"image name {name!r} has no tag")
    tag = name.rsplit(":", 1)[1]
    layer_tar = layer.tar()
    layer_digest = _digest(layer_tar)
    container_config: dict[str, object] = {
        "Entrypoint": list(entrypoint),
        "Env": list(env),
        "WorkingDir": "/",
    }
    if cmd:
        container_config["Cmd"] = list(cmd)
    if user:
        container_config["User"] = user
    config = _json(
        {
            "architecture": arch,
            "os": "linux",
            "config": container_config,
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created_by": "dradriver devtools.cluster.images"}],
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {"mediaType": MEDIA_CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": MEDIA_LAYER, "digest": layer_digest, "size": len(layer_tar)}],
        }
    )
    manifest_digest = _digest(manifest)
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": manifest_digest,
                    "size": len(manifest),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
    )
    outer = Layer()
    outer.file("oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
    outer.file("index.json", index)
    for blob in (layer_tar, config, manifest):
        outer.file("blobs/sha256/" + _digest(blob).removeprefix("sha256:"), blob)
    return Image(name, manifest_digest, outer.tar())


def write_cached(image: Image) -> Path:
    """Write ``image`` under the images cache, named by its digest; reuse it if there."""
    directory = images_dir()
    directory.mkdir(parents=True, exist_ok=True)
    slug = image.name.replace("/", "_").replace(":", "_")
    path = directory / f"{slug}-{image.manifest_digest.removeprefix('sha256:')[:16]}.tar"
    if path.exists() and path.stat().st_size == image.size:
        return path
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".tar")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(image.layout)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# --- the two images -------------------------------------------------------------


def pause_image(probe: Path) -> Image:
    layer = Layer()
    layer.file("pause", probe.read_bytes(), 0o755)
    layer.file("etc/passwd", PASSWD.encode())
    layer.file("etc/group", GROUP.encode())
    return oci_layout(PAUSE_IMAGE, layer, ["/pause"], user="65535:65535")


def probe_image(probe: Path, busybox: Path | None = None) -> Image:
    busybox = busybox or static_busybox()
    layer = Layer()
    layer.file("bin/probe", probe.read_bytes(), 0o755)
    layer.file("bin/busybox", busybox.read_bytes(), 0o755)
    for applet in busybox_applets(busybox):
        # Applets install to /bin, /sbin, /usr/bin, /usr/sbin; all live in /bin here.
        name = applet.rsplit("/", 1)[-1]
        if name and name not in ("busybox", "probe"):
            layer.symlink(f"bin/{name}", "busybox")
    layer.file("etc/passwd", PASSWD.encode())
    layer.file("etc/group", GROUP.encode())
    layer.dir("root", 0o700)
    layer.dir("tmp", 0o1777)
    return oci_layout(PROBE_IMAGE, layer, ["/bin/probe"], cmd=["report"])


def busybox_applets(busybox: Path) -> list[str]:
    proc = subprocess.run(
        [str(busybox), "--list"], capture_output=True, text=True, check=False, timeout=30
    )
    applets = sorted(set(proc.stdout.split()))
    if proc.returncode != 0 or "sh" not in applets:
        raise ImageError(f"{busybox} --list gave no applets:\n{proc.stdout}{proc.stderr}")
    return applets


def ensure_images(probe: Path) -> dict[str, Path]:
    """Write (or find) both image tarballs; ``probe`` is the runtimebin probe binary."""
    return {
        PAUSE_IMAGE: write_cached(pause_image(probe)),
        PROBE_IMAGE: write_cached(probe_image(probe)),
    }


# --- busybox-static -------------------------------------------------------------


def is_static_elf(path: Path) -> bool:
    """True for an ELF executable with no program interpreter (PT_INTERP)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only
                return False
            endian = "<" if head[5] == 1 else ">"
            phoff = struct.unpack_from(endian + "Q", head, 32)[0]
            phentsize, phnum = struct.unpack_from(endian + "HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    for i in range(phnum):
        (p_type,) = struct.unpack_from(endian + "I", table, i * phentsize)
        if p_type == 3:  # PT_INTERP
            return False
    return True


def static_busybox() -> Path:
    """A statically linked busybox: the host's if it is static, else Debian's busybox-static.

    The package is fetched with ``apt-get download`` and unpacked with
    ``dpkg-deb`` into the cache, so nothing on the host changes (installing
    busybox-static would replace a dynamic ``busybox`` package).
    """
    for candidate in (Path("/bin/busybox"), Path("/usr/bin/busybox")):
        if is_static_elf(candidate):
            return candidate
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise ImageError(
                f"no static busybox on this machine and no {tool} to fetch Debian's "
                "busybox-static; put a static busybox at /bin/busybox"
            )
    directory = images_dir() / "busybox-static"
    directory.mkdir(parents=True, exist_ok=True)
    debs = sorted(directory.glob("busybox-static_*.deb"))
    if not debs:
        _apt_download(directory)
        debs = sorted(directory.glob("busybox-static_*.deb"))
        if not debs:
            raise ImageError(f"apt-get download busybox-static left no .deb in {directory}")
    deb = debs[-1]
    unpacked = directory / deb.stem
    binary = unpacked / "bin" / "busybox"
    if not is_static_elf(binary):
        tmp = Path(tempfile.mkdtemp(dir=directory, prefix=".unpack-"))
        try:
            proc = subprocess.run(
                ["dpkg-deb", "-x", str(deb), str(tmp)], capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                raise ImageError(f"dpkg-deb -x {deb} failed:\n{proc.stderr}")
            shutil.rmtree(unpacked, ignore_errors=True)
            os.replace(tmp, unpacked)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if not is_static_elf(binary):
            raise ImageError(f"{deb} holds no static bin/busybox")
    return binary


def _apt_download(directory: Path) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "download", "-q", "busybox-static"]
    proc = subprocess.run(cmd, cwd=directory, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        # A fresh machine has no package lists yet: update once and retry.
        subprocess.run(
            ["apt-get", "update", "-q"], env=env, capture_output=True, text=True, check=False
        )
        proc = subprocess.run(
            cmd, cwd=directory, env=env, capture_output=True, text=True, check=False
        )
    if proc.returncode != 0:
        raise ImageError(
            "could not fetch Debian's busybox-static with apt-get download:\n"
            + "\n".join((proc.stdout + proc.stderr).splitlines()[-10:])
        )


# --- importing into containerd --------------------------------------------------


def import_image(
    ctr: Path, address: str, tarball: Path, namespace: str = K8S_NAMESPACE, timeout: float = 120
) -> None:
    """``ctr -a ADDRESS -n NAMESPACE images import --platform linux/ARCH TARBALL``."""
    cmd = [str(ctr), "-a", address, "-n", namespace, "images", "import"]
    cmd += ["--platform", f"linux/{go_arch()}", str(tarball)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)
    if proc.returncode != 0:
        raise ImageError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")


def import_images(
    ctr: Path, address: str, tarballs: Iterable[Path], namespace: str = K8S_NAMESPACE
) -> None:
    for tarball in tarballs:
        import_image(ctr, address, tarball, namespace)


def list_images(ctr: Path, address: str, namespace: str = K8S_NAMESPACE) -> list[str]:
    """The image names containerd has in ``namespace``."""
    cmd = [str(ctr), "-a", address, "-n", namespace, "images", "list", "-q"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0:
        raise ImageError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout.split()
