"""Read an OCI image archive back: its config, its files, and the Python distributions in it.

Used by the tests that check the built image against the Dockerfile and
the recipe: what the archive really holds, not what the builder meant to
put there.
"""

from __future__ import annotations

import json
import re
import tarfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path
from typing import IO, Any

from devtools.cluster.images import ImageError

_NAME_RE = re.compile(r"[-_.]+")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return _NAME_RE.sub("-", name).lower()


@dataclass
class ImageContents:
    config: dict[str, Any]  # the image config's "config" (Env, Cmd, User, ...)
    architecture: str
    layers: int
    # path (no leading "/") -> tar member type ("0" file, "2" symlink, "5" dir)
    files: dict[str, str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)  # symlink path -> target
    modes: dict[str, int] = field(default_factory=dict)
    uids: dict[str, int] = field(default_factory=dict)
    data: dict[str, bytes] = field(default_factory=dict)  # the files kept by `wanted`

    def text(self, path: str) -> str:
        return self.data[path.lstrip("/")].decode()


def _wanted(path: str) -> bool:
    return (
        path.endswith((".dist-info/METADATA", ".dist-info/entry_points.txt", "pyvenv.cfg"))
        or path in ("etc/passwd", "etc/group", "etc/os-release", "usr/lib/os-release")
        or "/bin/dradriver" in path
    )


def read(archive: Path) -> ImageContents:
    with tarfile.open(archive) as outer:

        def blob(digest: str) -> IO[bytes]:
            member = outer.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
            if member is None:
                raise ImageError(f"{archive} has no blob {digest}")
            return member

        def blob_json(digest: str) -> dict[str, Any]:
            doc = json.load(blob(digest))
            if not isinstance(doc, dict):
                raise ImageError(f"blob {digest} of {archive} is not a JSON object")
            return doc

        index_file = outer.extractfile("index.json")
        if index_file is None:
            raise ImageError(f"{archive} has no index.json")
        index = json.load(index_file)
        manifests = index.get("manifests") or []
        if len(manifests) != 1:
            raise ImageError(f"{archive} has {len(manifests)} manifests, one expected")
        manifest = blob_json(manifests[0]["digest"])
        config = blob_json(manifest["config"]["digest"])
        contents = ImageContents(
            config=config.get("config") or {},
            architecture=str(config.get("architecture", "")),
            layers=len(manifest["layers"]),
        )
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=blob(layer["digest"])) as tar:
                for member in tar:
                    path = member.name.removeprefix("./").strip("/")
                    if not path or member.name.rsplit("/", 1)[-1].startswith(".wh."):
                        continue
                    contents.files[path] = member.type.decode()
                    contents.modes[path] = member.mode
                    contents.uids[path] = member.uid
                    if member.issym():
                        contents.links[path] = member.linkname
                    if member.isfile() and _wanted(path):
                        extracted = tar.extractfile(member)
                        if extracted is not None:
                            contents.data[path] = extracted.read()
    return contents


@dataclass(frozen=True)
class Distribution:
    name: str  # normalized
    version: str
    requires: tuple[str, ...]  # Requires-Dist lines


def distributions(contents: ImageContents, site_packages: str) -> dict[str, Distribution]:
    """The distributions installed in ``site_packages`` (a path in the image), by name."""
    prefix = site_packages.strip("/") + "/"
    found: dict[str, Distribution] = {}
    for path, data in contents.data.items():
        if not (path.startswith(prefix) and path.endswith(".dist-info/METADATA")):
            continue
        if path[len(prefix) :].count("/") != 1:
            continue
        headers = HeaderParser().parsestr(data.decode("utf-8", "replace"))
        name = normalize(headers["Name"])
        found[name] = Distribution(
            name, headers["Version"], tuple(headers.get_all("Requires-Dist") or ())
        )
    return found


def requirement_closure(dists: dict[str, Distribution], root: str) -> set[str]:
    """The names ``root`` needs at run time, transitively (no extras, markers for this image).

    ``packaging`` (a dev-side dependency) evaluates the environment markers
    against the machine running this, which matches the image where it matters
    here: Linux, CPython 3.11.
    """
    from packaging.requirements import Requirement

    needed: set[str] = set()
    todo = [normalize(root)]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        dist = dists.get(name)
        if dist is None:
            continue  # missing: the caller compares the sets and names it
        for line in dist.requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            todo.append(normalize(req.name))
    return needed
