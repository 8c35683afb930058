"""The part of a build cache key that comes from a Go module's sources."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class _Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


def hash_go_sources(digest: _Digest, module: Path) -> None:
    """Feed every go.mod, go.sum and .go file under ``module`` (path and content, in a
    stable order) into ``digest``: what `go build` reads from the module itself."""
    files = sorted(
        p
        for p in module.rglob("*")
        if p.is_file() and (p.name in ("go.mod", "go.sum") or p.suffix == ".go")
    )
    for path in files:
        digest.update(str(path.relative_to(module)).encode() + b"\0")
        digest.update(path.read_bytes())
