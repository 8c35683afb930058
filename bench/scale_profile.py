"""A sampling profile of the controller during ``bench.scale``'s allocation (a helper).

``py-spy record --subprocesses`` (``$PY_SPY`` or ``py-spy`` on PATH; not a dependency:
without it nothing is profiled) samples the controller and its allocation worker while
the claims are allocated; the collapsed stacks are summarised as the functions with the
most samples on the stack (inclusive) and at the top of it (self).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

RATE = 47  # samples per second, off the beat of anything periodic


def py_spy() -> str | None:
    return os.environ.get("PY_SPY") or shutil.which("py-spy")


@dataclass
class Recording:
    process: subprocess.Popen[bytes]
    out: Path


def start(pid: int, out: Path) -> Recording | None:
    tool = py_spy()
    if tool is None:
        return None
    argv = [tool, "record", "--pid", str(pid), "--subprocesses", "--format", "raw"]
    argv += ["--rate", str(RATE), "--nonblocking", "-o", str(out)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Recording(process, out)


def stop(recording: Recording | None) -> list[tuple[str, int, int]]:
    """Stop sampling; the top functions as (frame, inclusive samples, self samples)."""
    if recording is None:
        return []
    recording.process.send_signal(signal.SIGINT)
    try:
        recording.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        recording.process.kill()
        recording.process.wait()
    if not recording.out.exists():
        return []
    return summarise(recording.out.read_text(errors="replace"))


def _frame(text: str) -> str:
    """``fn (path/to/module.py:12)`` -> ``fn (module.py)``: one entry per function."""
    name, _, where = text.partition(" (")
    file = where.rstrip(")").rsplit(":", 1)[0]
    short = "/".join(Path(file).parts[-2:])
    return f"{name} ({short})" if file else name


def summarise(collapsed: str, top: int = 20) -> list[tuple[str, int, int]]:
    """The ``top`` functions by own samples, each with its inclusive samples too."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        # The first frames name the process (and its parents, with --subprocesses).
        frames = [_frame(f) for f in stack.split(";") if not f.startswith("process ")]
        for frame in set(frames):
            inclusive[frame] += int(count)
        if frames:
            own[frames[-1]] += int(count)
    return [(f, inclusive[f], n) for f, n in own.most_common(top)]
