"""Progress of long build steps: which component, how many of how many, elapsed time.

A cold ``make demo`` builds the kube binaries, the runtime and the image for
minutes; without this a newcomer sees one line and then nothing. A
:class:`Progress` prints ``<component>: <done>/<total> <unit>, <elapsed>`` to
stderr when it starts, at most once per ``interval`` while it advances (so a
log is not flooded), and when it finishes.

:func:`run_go_build` runs one ``go build -v`` under a Progress: the total is
the number of packages ``go list -deps`` names for the same targets, and each
package ``-v`` reports as compiled is one step. Packages already in the Go
build cache are not compiled again and not reported, so a warm build ends
below its total; the closing line says so.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

# At most one progress line per component this often (seconds).
DEFAULT_INTERVAL = 10.0


def format_elapsed(seconds: float) -> str:
    """``42s``, ``3m05s``: short enough for one progress line."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    return f"{whole // 60}m{whole % 60:02d}s"


class Progress:
    """One long step's progress, printed as lines (never carriage returns: logs keep them)."""

    def __init__(
        self,
        component: str,
        total: int | None = None,
        unit: str = "steps",
        *,
        stream: IO[str] | None = None,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.component = component
        self.total = total
        self.unit = unit
        self.done = 0
        self.detail = ""
        self._stream = stream
        self._interval = interval
        self._clock = clock
        self._started = clock()
        self._last_print: float | None = None

    @property
    def elapsed(self) -> float:
        return self._clock() - self._started

    def line(self) -> str:
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.component}: {count} {self.unit}{detail}, {format_elapsed(self.elapsed)}"

    def _emit(self, text: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        stream.write(text + "\n")
        stream.flush()
        self._last_print = self._clock()

    def start(self, detail: str = "") -> None:
        self.detail = detail
        self._emit(self.line())

    def advance(self, steps: int = 1, detail: str | None = None) -> None:
        self.done += steps
        if detail is not None:
            self.detail = detail
        now = self._clock()
        if self._last_print is None or now - self._last_print >= self._interval:
            self._emit(self.line())

    def finish(self, note: str = "") -> None:
        tail = f"; {note}" if note else ""
        self._emit(
            f"{self.component}: done, {self.done} {self.unit} in "
            f"{format_elapsed(self.elapsed)}{tail}"
        )


class GoBuildError(RuntimeError):
    """``go build`` (or the ``go list`` before it) failed; the message has the log's tail."""


def count_go_packages(
    go: str, targets: Sequence[str], cwd: Path, env: dict[str, str], flags: Sequence[str] = ()
) -> int | None:
    """How many packages ``go build`` of ``targets`` may compile, or None if go list fails.

    ``flags`` are the build's tags and the like, which change the package set.
    """
    proc = subprocess.run(
        [go, "list", "-deps", *flags, *targets],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    return len([p for p in proc.stdout.splitlines() if p.strip()])


def is_package_line(line: str) -> bool:
    """A line of ``go build -v`` that names a compiled package (not an error or a ``#``)."""
    text = line.strip()
    return bool(text) and not text.startswith("#") and " " not in text and ":" not in text


def run_logged(
    cmd: Sequence[str],
    *,
    cwd: Path | None,
    env: dict[str, str] | None,
    log: IO[str],
    on_line: Callable[[str], None] | None = None,
) -> int:
    """Run ``cmd`` with stdout and stderr copied line by line to ``log``; the exit code.

    ``on_line`` sees each line as it arrives, which is what lets a caller show progress.
    """
    with subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if on_line is not None:
                on_line(line)
        code = proc.wait()
    log.flush()
    return code


def run_go_build(
    cmd: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    log: IO[str],
    progress: Progress,
) -> int:
    """Run ``cmd`` (a ``go build -v ...``), copying its output to ``log``; the exit code.

    Each compiled package that ``-v`` names advances ``progress``.
    """
    progress.start()

    def on_line(line: str) -> None:
        if is_package_line(line):
            progress.advance(detail=line.strip())

    code = run_logged(cmd, cwd=cwd, env=env, log=log, on_line=on_line)
    progress.detail = ""
    if code == 0:
        cached = progress.total is not None and progress.done < progress.total
        progress.finish("the rest came from the Go build cache" if cached else "")
    return code
