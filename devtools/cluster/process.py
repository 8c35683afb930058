"""Start, watch and stop the processes dev tooling runs: cluster components, the node
plugin, the controller, the webhook, the benchmarks' plugins.

Every one runs in its own session with its output in a log file and an empty working
directory of its own, and is recorded by PID plus the executable it runs. Cluster
components outlive the command that started them (``dradriver cluster up`` returns
while they keep running), so another process stops them from that record, and only
while the PID still runs that executable: never a program that has reused the PID.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from devtools.cluster.wait import WaitTimeout, wait_until

T = TypeVar("T")


class ProcessDied(RuntimeError):
    """A process exited while it was needed; the message carries the end of its log."""

    def __init__(self, name: str, log_path: Path, code: int | None) -> None:
        self.name = name
        self.log_path = log_path
        self.code = code
        how = f"exit code {code}" if code is not None else "it is gone"
        super().__init__(f"{name} died ({how}); last lines of {log_path}:\n{log_tail(log_path)}")


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ProcessRecord:
    """What identifies a started process (persisted in the cluster's state file)."""

    name: str
    pid: int
    exe: str
    log: str
    argv: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        """Whether ``pid`` still runs ``exe`` (and is not an exited, unreaped child)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
            exe = os.readlink(f"/proc/{self.pid}/exe")
        except OSError:
            return False
        # Field 3 of /proc/PID/stat is the state; Z is an exited, unreaped child.
        state = stat.rsplit(")", 1)[1].split()[0]
        return state != "Z" and exe.removesuffix(" (deleted)") == self.exe

    def peak_rss_kib(self) -> int | None:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return None


def _resolve(program: str) -> str:
    """The file a program name runs, as /proc/PID/exe will show it."""
    if os.sep not in program:
        program = shutil.which(program) or program
    return os.path.realpath(program)


class ManagedProcess:
    """One process: started here (:meth:`start`) or found in a record (:meth:`adopt`)."""

    def __init__(self, record: ProcessRecord, popen: subprocess.Popen[bytes] | None = None):
        self.record = record
        self._popen = popen

    @classmethod
    def start(
        cls,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        exe: str | None = None,
    ) -> ManagedProcess:
        """Start ``argv`` with its output appended to ``log_path``.

        ``cwd`` is created if missing and should be the process's own, empty: the
        kubelet with the fake runtime deletes files in its working directory. ``exe`` is
        the program the process ends up running when ``argv[0]`` execs another.
        """
        cwd.mkdir(parents=True, exist_ok=True, mode=0o700)
        log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                list(argv),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        record = ProcessRecord(
            name=name,
            pid=popen.pid,
            exe=_resolve(exe or argv[0]),
            log=str(log_path),
            argv=list(argv),
        )
        return cls(record, popen)

    @classmethod
    def adopt(cls, record: ProcessRecord) -> ManagedProcess:
        """A process another process started, known only from its record."""
        return cls(record)

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def pid(self) -> int:
        return self.record.pid

    @property
    def log_path(self) -> Path:
        return Path(self.record.log)

    @property
    def returncode(self) -> int | None:
        """The exit code once a process started here has exited (None otherwise)."""
        return self._popen.poll() if self._popen is not None else None

    def alive(self) -> bool:
        if self._popen is not None:
            # Our own child keeps its PID until we reap it, so the PID cannot be reused.
            return self._popen.poll() is None
        return self.record.alive()

    def check(self) -> None:
        """Raise :class:`ProcessDied` (with the end of the log) if the process is gone."""
        if not self.alive():
            raise ProcessDied(self.name, self.log_path, self.returncode)

    def log_tail(self, lines: int = 25) -> str:
        return log_tail(self.log_path, lines)

    def wait_ready(
        self,
        what: str,
        probe: Callable[[], T | None],
        timeout: float,
        *,
        ignore: tuple[type[Exception], ...] = (),
    ) -> T:
        """Poll ``probe`` until truthy; fail at once if the process dies, and on timeout
        with the end of its log."""
        try:
            return wait_until(what, probe, timeout, watch=[self], ignore=ignore)
        except WaitTimeout as e:
            raise WaitTimeout(f"{e}; last lines of {self.log_path}:\n{self.log_tail()}") from e

    def terminate(self, timeout: float = 30) -> int | None:
        """SIGTERM and wait for the exit; returns the exit code (None if not started here)."""
        self._signal(signal.SIGTERM)
        if not self._wait_exit(timeout):
            raise WaitTimeout(
                f"{self.name} (pid {self.pid}) did not exit {timeout:.0f}s after SIGTERM"
            )
        return self.returncode

    def stop(self, timeout: float = 10) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited after ``timeout`` seconds."""
        self._signal(signal.SIGTERM)
        if not self._wait_exit(timeout):
            self.kill()
        return self.returncode

    def kill(self) -> int | None:
        """SIGKILL (a crash: nothing is cleaned up) and wait for the exit."""
        self._signal(signal.SIGKILL)
        self._wait_exit(None)
        return self.returncode

    def _signal(self, sig: signal.Signals) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def _wait_exit(self, timeout: float | None) -> bool:
        if self._popen is not None:
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # It may be a child of this process all the same (components of an `up` that
            # failed are stopped from the state file): reap it, or it stays a zombie.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG)
            if not self.record.alive():
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.05)
