"""Start, watch and stop one cluster component as a detached process.

Components outlive the command that started them (``dradriver cluster up``
returns while they keep running), so they run in their own session and are
tracked by PID plus the executable they were started from: ``stop`` never
signals a PID that has since been reused by another program.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


class ComponentDied(RuntimeError):
    """A component exited while the cluster was starting or running."""

    def __init__(self, name: str, log_path: Path, code: int | None) -> None:
        self.name = name
        self.log_path = log_path
        tail = log_tail(log_path)
        how = f"exit code {code}" if code is not None else "it is gone"
        super().__init__(f"{name} died ({how}); last lines of {log_path}:\n{tail}")


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
    """What is remembered about a started component (persisted in the state file)."""

    name: str
    pid: int
    exe: str
    log: str
    argv: list[str] = field(default_factory=list)

    def alive(self) -> bool:
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

    def stop(self, timeout: float = 10.0) -> None:
        if not self.alive():
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _reap(self.pid)
            if not self.alive():
                return
            time.sleep(0.05)
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            while self.alive():
                _reap(self.pid)
                time.sleep(0.05)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


class Component:
    """A component this process started; ``check`` raises if it has died."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        workdir: Path,
        log_path: Path,
        env: dict[str, str] | None = None,
        exe: str | None = None,
    ) -> None:
        """``exe``: the program the process ends up running, if argv[0] execs another."""
        workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.name = name
        self.log_path = log_path
        with open(log_path, "ab") as log:
            # The working directory is an empty one of the component's own: a
            # kubelet with the fake runtime deletes files in its cwd.
            self._proc = subprocess.Popen(
                argv,
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.record = ProcessRecord(
            name=name,
            pid=self._proc.pid,
            exe=os.path.realpath(exe or argv[0]),
            log=str(log_path),
            argv=list(argv),
        )

    def check(self) -> None:
        code = self._proc.poll()
        if code is not None:
            raise ComponentDied(self.name, self.log_path, code)
