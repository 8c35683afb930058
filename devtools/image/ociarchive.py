"""OCI image-layout archives with several layers, streamed from files on disk.

:mod:`devtools.cluster.images` renders its small test images in memory; the
dradriver image's layers are tens of megabytes, so here each layer is a tar
file that is hashed and copied in chunks. The archive is the same format
(``oci-layout``, ``index.json``, ``blobs/sha256/``, uncompressed layers) that
``ctr images import`` loads, and it is deterministic: equal layer files and
config give equal bytes.

:func:`write_directory_layer` turns a directory into a layer tar the same way
(sorted paths, fixed mtimes, uid/gid 0, no user names).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devtools.cluster.images import (
    MEDIA_CONFIG,
    MEDIA_INDEX,
    MEDIA_LAYER,
    MEDIA_MANIFEST,
    MTIME,
    ImageError,
)

CHUNK = 1 << 20


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _bytes_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ContainerConfig:
    """The runtime part of an image config (what ``docker inspect`` shows as Config)."""

    env: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    user: str = ""
    working_dir: str = "/"

    def as_json(self) -> dict[str, object]:
        config: dict[str, object] = {"Env": list(self.env), "WorkingDir": self.working_dir}
        if self.cmd:
            config["Cmd"] = list(self.cmd)
        if self.entrypoint:
            config["Entrypoint"] = list(self.entrypoint)
        if self.user:
            config["User"] = self.user
        return config


@dataclass(frozen=True)
class WrittenImage:
    name: str
    manifest_digest: str
    path: Path
    size: int  # the archive's bytes (layers uncompressed)


def write_archive(
    dest: Path,
    name: str,
    layers: Sequence[Path],
    config: ContainerConfig,
    arch: str,
    history: Sequence[str],
) -> WrittenImage:
    """Write image ``name`` (``host/repo:tag``) with ``layers`` (bottom first) to ``dest``."""
    if ":" not in name.rsplit("/", 1)[-1]:
        raise ImageError(f"image name {name!r} has no tag")
    if len(history) != len(layers):
        raise ImageError("one history entry per layer")
    tag = name.rsplit(":", 1)[1]
    digests = [file_digest(p) for p in layers]
    config_blob = _json(
        {
            "architecture": arch,
            "os": "linux",
            "config": config.as_json(),
            "rootfs": {"type": "layers", "diff_ids": digests},
            "history": [{"created_by": h} for h in history],
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": {
                "mediaType": MEDIA_CONFIG,
                "digest": _bytes_digest(config_blob),
                "size": len(config_blob),
            },
            "layers": [
                {"mediaType": MEDIA_LAYER, "digest": d, "size": p.stat().st_size}
                for d, p in zip(digests, layers, strict=True)
            ],
        }
    )
    manifest_digest = _bytes_digest(manifest)
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
    small = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": index,
        "blobs/sha256/" + _bytes_digest(config_blob).removeprefix("sha256:"): config_blob,
        "blobs/sha256/" + manifest_digest.removeprefix("sha256:"): manifest,
    }
    big = {
        "blobs/sha256/" + d.removeprefix("sha256:"): p for d, p in zip(digests, layers, strict=True)
    }
    tmp = dest.with_name(f".tmp-{dest.name}")
    try:
        with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for directory in ("blobs", "blobs/sha256"):
                tar.addfile(_info(directory + "/", tarfile.DIRTYPE, 0o755))
            for path in sorted({*small, *big}):
                if path in small:
                    data = small[path]
                    tar.addfile(_info(path, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
                else:
                    layer = big[path]
                    size = layer.stat().st_size
                    with open(layer, "rb") as f:
                        tar.addfile(_info(path, tarfile.REGTYPE, 0o644, size), f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return WrittenImage(name, manifest_digest, dest, dest.stat().st_size)


def _info(name: str, kind: bytes, mode: int, size: int = 0, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = target
    info.mtime = MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_directory_layer(root: Path, subtree: str, dest: Path) -> None:
    """A layer holding ``root/subtree`` (and its parent dirs) as ``subtree`` in the image.

    Regular files, directories and symlinks only: anything else under the
    subtree (a socket, a device) is a build mistake and fails.
    """
    parts = subtree.strip("/").split("/")
    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(1, len(parts)):
            tar.addfile(_info("/".join(parts[:i]) + "/", tarfile.DIRTYPE, 0o755))
        top = root / subtree.strip("/")
        for path in [top, *_tree(top)]:
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                tar.addfile(_info(rel, tarfile.SYMTYPE, 0o777, target=os.readlink(path)))
            elif stat.S_ISDIR(st.st_mode):
                tar.addfile(_info(rel + "/", tarfile.DIRTYPE, mode))
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    tar.addfile(_info(rel, tarfile.REGTYPE, mode, st.st_size), f)
            else:
                raise ImageError(f"{path} is neither a file, a directory nor a symlink")


def _tree(top: Path) -> list[Path]:
    """Everything under ``top`` in path order; symlinks (to dirs too) are not followed."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(top):
        base = Path(dirpath)
        found.extend(base / n for n in (*dirnames, *filenames))
    return sorted(found, key=lambda p: p.as_posix())
