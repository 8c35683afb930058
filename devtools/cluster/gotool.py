"""What the single Go tools built from the Go module proxy (helm, kwok) share.

Invariants: an override variable names a binary to use instead of a build, and a value
that is not an executable file is an error naming the variable; a cache entry is complete
once its ``.complete`` record exists, written last and under the entry's lock, so a
parallel build of the same key (another test run, a CI job) waits, then reuses it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def ensure(
    override_env: str,
    target: Path,
    name: str,
    build: Callable[[Path], None],
    error: type[Exception],
) -> Path:
    """The tool ``name``: ``$override_env``, else ``target/name``, built on a cache miss."""
    override = os.environ.get(override_env)
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise error(f"{override_env}={override} is not an executable file")
        return path
    if not (target / ".complete").exists():
        build(target)
    return target / name


def cached(override_env: str, target: Path, name: str) -> Path | None:
    """The tool if it is already built (or named by ``$override_env``), else None."""
    override = os.environ.get(override_env)
    if override:
        return Path(override) if os.access(override, os.X_OK) else None
    return target / name if (target / ".complete").exists() else None


@contextmanager
def build_lock(target: Path) -> Iterator[bool]:
    """Hold ``target``'s build lock; yields whether it still has to be built."""
    target.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield not (target / ".complete").exists()


def record_complete(target: Path, seconds: float, version: str) -> None:
    """Mark ``target`` complete: the last write of a build, under :func:`build_lock`."""
    record = {"seconds": round(seconds, 1), "version": version}
    (target / ".complete").write_text(json.dumps(record) + "\n")


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a build log, for the error of a failed build."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
