"""Read what the probe image's ``probe report`` printed (runtimebin/cmd/probe).

The report is one record per line, space-separated fields, each field with
space, backslash and control bytes escaped as ``\\ooo`` (as in
/proc/self/mountinfo)::

    probe start pid=1 ppid=0 uid=0 gid=0 hostname=NAME
    env KEY=VALUE
    path type=char rdev=1:3 mode=0666 uid=0 gid=0 name=/dev/null
    mount id=ID parent=ID dev=MAJ:MIN root=ROOT point=POINT options=OPTS fstype=T source=S super=O
    probe ready paths=N mounts=M
    probe exit signal=terminated

``probe use KIND:PATH...`` prints, after the same ``probe start`` line, one
``use`` record per device it really used, then ``probe ready uses=N``::

    use kind=kvm path=/dev/kvm open=ok api=12 vm=created
    use kind=loop path=/dev/loop3 open=ok attached=ok readback=ok detached=ok
    use kind=fuse path=/dev/fuse open=EPERM

Tests, the demo and the benchmarks read it through the pod log API, so what
they check is what the container itself saw.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from devtools.cluster.api import AdminAPI
from devtools.cluster.wait import wait_until
from dradriver.k8s.errors import KubeAPIError

_ESCAPE = re.compile(r"\\([0-7]{3})")


def unescape(text: str) -> str:
    """Undo the probe's (and mountinfo's) ``\\ooo`` escapes."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


def _fields(tokens: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for token in tokens:
        key, sep, value = token.partition("=")
        if sep:
            out[key] = unescape(value)
    return out


@dataclass(frozen=True)
class PathEntry:
    """One ``path`` record: what a file in the container is."""

    name: str
    type: str  # char, block, file, dir, symlink, fifo, socket, error
    rdev: str  # MAJOR:MINOR for char and block devices, else "-"
    mode: str
    uid: str
    gid: str
    target: str = ""


@dataclass(frozen=True)
class MountEntry:
    """One ``mount`` record (a line of the container's /proc/self/mountinfo)."""

    point: str
    root: str
    source: str
    fstype: str
    options: str


@dataclass
class Report:
    """A parsed report; ``ready`` once the ``probe ready`` line was read."""

    start: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    paths: dict[str, PathEntry] = field(default_factory=dict)
    mounts: list[MountEntry] = field(default_factory=list)
    ready: bool = False

    def mount_at(self, point: str) -> MountEntry | None:
        found = [m for m in self.mounts if m.point == point]
        return found[-1] if found else None


def parse_report(text: str) -> Report:
    """Parse the first complete report in ``text`` (a container's log).

    Lines after ``probe ready`` (``probe exit``) and any other output are
    ignored, so a container that prints something else too can be read.
    """
    report = Report()
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        tokens = rest.split(" ")
        if kind == "probe" and tokens[0] == "start":
            report = Report(start=_fields(tokens[1:]))
        elif kind == "probe" and tokens[0] == "ready":
            report.ready = True
            return report
        elif kind == "env":
            key, _, value = unescape(rest).partition("=")
            report.env[key] = value
        elif kind == "path":
            f = _fields(tokens)
            report.paths[f.get("name", "")] = PathEntry(
                name=f.get("name", ""),
                type=f.get("type", ""),
                rdev=f.get("rdev", "-"),
                mode=f.get("mode", ""),
                uid=f.get("uid", ""),
                gid=f.get("gid", ""),
                target=f.get("target", ""),
            )
        elif kind == "mount":
            f = _fields(tokens)
            report.mounts.append(
                MountEntry(
                    point=f.get("point", ""),
                    root=f.get("root", ""),
                    source=f.get("source", ""),
                    fstype=f.get("fstype", ""),
                    options=f.get("options", ""),
                )
            )
    return report


@dataclass(frozen=True)
class Use:
    """One ``use`` record: what using one device in the container gave, step by step.

    ``steps`` holds every field after ``kind`` and ``path`` in order (``open``, ``api``,
    ``vm``, ``ifname``, ``sysfs``, ``attached``, ``readback``, ``detached``, ``error``);
    a failed step holds the errno's name (``EPERM``) and is the record's last.
    """

    kind: str
    path: str
    steps: dict[str, str]

    def get(self, step: str) -> str:
        return self.steps.get(step, "")

    @property
    def opened(self) -> bool:
        return self.get("open") == "ok"

    def text(self) -> str:
        """The record as the probe printed it (unescaped), for messages."""
        steps = " ".join(f"{k}={v}" for k, v in self.steps.items())
        return f"use kind={self.kind} path={self.path} {steps}".rstrip()


def parse_uses(text: str) -> list[Use] | None:
    """The ``use`` records of the first complete ``probe use`` run in ``text``.

    None until its ``probe ready`` line is there (the container is still working, or
    printed something else).
    """
    uses: list[Use] = []
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        tokens = rest.split(" ")
        if kind == "probe" and tokens[0] == "start":
            uses = []
        elif kind == "probe" and tokens[0] == "ready" and tokens[1:2] == [f"uses={len(uses)}"]:
            return uses
        elif kind == "use":
            f = _fields(tokens)
            device, path = f.pop("kind", ""), f.pop("path", "")
            uses.append(Use(kind=device, path=path, steps=f))
    return None


def read_uses(api: AdminAPI, namespace: str, pod: str, container: str, timeout: float) -> list[Use]:
    """Wait until ``container`` has printed all its ``use`` records; read them through the
    pod log API (a 400 until the container runs means "not yet")."""

    def ready() -> list[Use] | None:
        return parse_uses(api.pod_log(namespace, pod, container))

    return wait_until(
        f"the probe's use records of {namespace}/{pod}/{container}",
        ready,
        timeout,
        ignore=(KubeAPIError,),
    )


def read_report(api: AdminAPI, namespace: str, pod: str, container: str, timeout: float) -> Report:
    """Wait until ``container`` has printed a whole report; read it through the pod log API.

    Until the container runs the log API refuses (400); that means "not yet".
    """

    def ready() -> Report | None:
        report = parse_report(api.pod_log(namespace, pod, container))
        return report if report.ready else None

    return wait_until(
        f"the probe report of {namespace}/{pod}/{container}", ready, timeout, ignore=(KubeAPIError,)
    )


__all__ = [
    "MountEntry",
    "PathEntry",
    "Report",
    "Use",
    "parse_report",
    "parse_uses",
    "read_report",
    "read_uses",
    "unescape",
]
