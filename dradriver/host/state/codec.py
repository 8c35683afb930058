"""The ledger file on disk: read, verify, migrate, checksum, quarantine.

File format, the same envelope in every version:
``{"version": N, "checksum": "sha256:<hex>", "data": {...}}``. From version 2 on
the checksum covers the version too (the SHA-256 of the canonical JSON of
``{"version": N, "data": data}``, sorted keys, compact), so a flipped version
reads as corruption rather than as a file from a newer dradriver; a newer
version is recognised by that same rule. Version 1 (checksum of ``data``
alone) is read and migrated (:data:`MIGRATIONS`); the next write is version 2.

Invariants: a file is decoded only if its checksum matches; a newer version is
refused (:class:`LedgerVersionError`), never rewritten; a bad file is moved aside
(:func:`quarantine`), never deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dradriver.host.atomicfile import fsync_dir
from dradriver.host.state.schema import (
    SUPPORTED_VERSION,
    LedgerCorruptError,
    LedgerData,
    LedgerVersionError,
)

_CHECKSUM_RE = re.compile(r"sha256:[0-9a-f]{64}")


def checksum(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def envelope_checksum(version: int, data: Any) -> str:
    """The checksum of a version 2 (or later) file: it covers the version as well."""
    return checksum({"version": version, "data": data})


def _stated_checksum(version: int, data: Any) -> str:
    return checksum(data) if version == 1 else envelope_checksum(version, data)


# Version N -> a function turning version N data into version N+1 data. Version 2
# changed only the checksum and added ClaimEntry.recovered (default false).
MIGRATIONS: dict[int, Callable[[Any], Any]] = {1: lambda data: data}


def read_checkpoint(path: Path) -> bytes | None:
    """The checkpoint's bytes, or None if there is none.

    Raises LedgerCorruptError for anything at the path that is not a readable
    regular file: a directory, a FIFO (opened non-blocking, so a FIFO without a
    writer never stalls the start), a socket, a dangling symlink or a symlink loop.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise LedgerCorruptError(path, "a symlink to a file that does not exist") from None
        return None
    except OSError as err:
        raise LedgerCorruptError(path, f"cannot be opened: {err.strerror}") from err
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else ""
            raise LedgerCorruptError(path, f"is {kind or 'not a regular file'}")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as err:
        raise LedgerCorruptError(path, f"cannot be read: {err.strerror}") from err
    finally:
        os.close(fd)


def decode(path: Path, raw: bytes) -> LedgerData:
    try:
        return _decode_document(path, raw)
    except RecursionError as err:
        raise LedgerCorruptError(path, "nested too deeply to be a ledger") from err


def _decode_document(path: Path, raw: bytes) -> LedgerData:
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise LedgerCorruptError(path, f"not valid JSON ({err})") from err
    if not isinstance(doc, dict):
        raise LedgerCorruptError(path, "top level is not an object")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise LedgerCorruptError(path, f"missing or invalid version {version!r}")
    if set(doc) != {"version", "checksum", "data"}:
        raise LedgerCorruptError(
            path, f"expected keys version, checksum, data; found {', '.join(sorted(doc))}"
        )
    stated = doc["checksum"]
    if not isinstance(stated, str) or not _CHECKSUM_RE.fullmatch(stated):
        raise LedgerCorruptError(path, f"malformed checksum {stated!r}")
    actual = _stated_checksum(version, doc["data"])
    if stated != actual:
        newer = " (it claims a newer version, but its checksum says otherwise)"
        raise LedgerCorruptError(
            path,
            f"checksum mismatch: file says {stated}, data is {actual}"
            + (newer if version > SUPPORTED_VERSION else ""),
        )
    # Checked after the checksum: the envelope is the same in every version, so a
    # genuine newer file passes it and a flipped version number does not.
    if version > SUPPORTED_VERSION:
        raise LedgerVersionError(path, version)
    data = doc["data"]
    for step in range(version, SUPPORTED_VERSION):
        data = MIGRATIONS[step](data)
    try:
        return LedgerData.model_validate(data, strict=True)
    except ValidationError as err:
        raise LedgerCorruptError(path, f"schema violation: {err}") from err


def quarantine(path: Path) -> Path:
    """Move a bad checkpoint aside (never delete it: it is evidence, maybe recoverable)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    kept = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 0
    while os.path.lexists(kept):
        n += 1
        kept = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.rename(path, kept)
    fsync_dir(path.parent)
    return kept
