"""The benchmark suite: finds the benchmarks by their convention (bench/__init__.py), runs
each in a process of its own, and writes their output as the performance section of
docs/benchmarks.md.

Each benchmark runs as ``python -m bench.<name>`` in a fresh interpreter, so that one's
memory figures never include another's imports or leftovers, and a crash costs one entry.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import platform
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from devtools.docs.pages import between_markers

KINDS = ("exclusive", "none", "own", "shared")  # also the order of a full run
BEGIN = "<!-- bench:begin (written by `make bench`, do not edit by hand) -->"
END = "<!-- bench:end -->"
REPO = Path(__file__).resolve().parent.parent


class ConventionError(RuntimeError):
    """A module in bench/ has ``main`` but not the rest of the convention."""


@dataclass(frozen=True)
class Bench:
    name: str  # the module's name in bench/
    cluster: str  # one of KINDS
    smoke_args: tuple[str, ...]
    own_smoke_test: str | None = None  # a test of its own runs the smoke sizes

    @property
    def module(self) -> str:
        return f"bench.{self.name}"


@dataclass(frozen=True)
class Run:
    bench: Bench
    argv: tuple[str, ...]
    returncode: int
    output: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def discover() -> list[Bench]:
    """Every benchmark in bench/, in the order a full run takes them (KINDS, then name)."""
    import bench

    found = []
    for info in pkgutil.iter_modules(bench.__path__):
        if info.ispkg or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"bench.{info.name}")
        if not callable(getattr(module, "main", None)):
            continue  # a helper
        smoke = getattr(module, "SMOKE_ARGS", None)
        cluster = getattr(module, "CLUSTER", None)
        if not isinstance(smoke, tuple) or not all(isinstance(a, str) for a in smoke):
            raise ConventionError(f"bench.{info.name}: SMOKE_ARGS must be a tuple of strings")
        if cluster not in KINDS:
            raise ConventionError(f"bench.{info.name}: CLUSTER must be one of {KINDS}")
        own = getattr(module, "OWN_SMOKE_TEST", None)
        if own is not None and not (REPO / str(own)).is_file():
            raise ConventionError(f"bench.{info.name}: OWN_SMOKE_TEST {own} does not exist")
        found.append(Bench(info.name, cluster, smoke, own))
    return sorted(found, key=lambda b: (KINDS.index(b.cluster), b.name))


def run(
    bench: Bench,
    argv: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    echo: bool = False,
    timeout: float | None = None,
) -> Run:
    """``python -m bench.<name> *argv`` with stdout and stderr together, echoed if asked."""
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", bench.module, *argv],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    assert process.stdout is not None
    try:
        for line in process.stdout:
            lines.append(line)
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
        returncode = process.wait(timeout=timeout)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return Run(bench, tuple(argv), returncode, "".join(lines), time.monotonic() - started)


def _first_line(path: str, key: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine() -> str:
    """CPU model and count, memory, kernel: what the figures were measured on."""
    mem = _first_line("/proc/meminfo", "MemTotal")
    gib = f"{int(mem.split()[0]) / 2**20:.1f} GiB" if mem != "unknown" else "unknown memory"
    return (
        f"{_first_line('/proc/cpuinfo', 'model name')}, {os.cpu_count()} CPUs, {gib}, "
        f"{platform.system()} {platform.release()}"
    )


def versions() -> str:
    """Python, dradriver's commit, Kubernetes, the Go reference."""
    from bench.common import GO_MODULE, go_version
    from devtools.cluster.binaries import resolve_version

    try:
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return (
        f"dradriver {commit}, Python {platform.python_version()}, Kubernetes {resolve_version()} "
        f"(kube-scheduler, apiserver), Go reference {GO_MODULE} {go_version()}"
    )


def section(runs: Iterable[Run], when: datetime | None = None) -> str:
    """The performance section of docs/benchmarks.md: when, where, versions, then each
    benchmark's output."""
    when = when or datetime.now(UTC)
    out = [
        BEGIN,
        "",
        f"Measured {when:%Y-%m-%d %H:%M} UTC by `make bench` (`python -m bench`).",
        f"Machine: {machine()}.",
        f"Versions: {versions()}.",
        "",
    ]
    for r in runs:
        status = "" if r.ok else f", **failed (exit {r.returncode})**"
        command = " ".join(["python -m", r.bench.module, *r.argv])
        out += [
            f"#### `{r.bench.module}` (`{command}`, {r.seconds:.0f} s{status})",
            "",
            "```text",
            r.output.rstrip(),
            "```",
            "",
        ]
    out.append(END)
    return "\n".join(out)


def write_section(page: Path, text: str) -> None:
    """Replace what is between the markers in ``page`` with ``text`` (markers included)."""
    content = page.read_text()
    try:
        start, stop = between_markers(content, BEGIN, END, "performance section")
    except ValueError as e:
        raise ValueError(f"{page}: {e}") from None
    page.write_text(content[: start - len(BEGIN)] + text + content[stop + len(END) :])


def has_table(output: str) -> bool:
    """Whether ``output`` holds a table: a header rule of dashes (``---+---`` or ``-----``)."""
    return any(
        len(line) >= 3 and set(line.strip()) <= {"-", "+", " ", "|"} and "--" in line
        for line in output.splitlines()
    )
