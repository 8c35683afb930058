"""Run a private containerd for the local cluster: config, start, stop, teardown.

One instance per kubelet that uses it, with everything it owns under one base
directory (outside any work tree): ``root/``, ``state/`` (with the shim
sockets, runc's state and pod netns files), its grpc and ttrpc sockets,
``config.toml``, the registry hosts dir and its log. Nothing is written to the
host's ``/run/containerd``, ``/var/lib/containerd``, ``/etc/containerd`` or
``/opt/containerd``.

The configuration follows the facts in shared/reference/real-runtime.md
(containerd 2.4, config version 4): CDI spec dirs, ``restrict_oom_score_adj``
(no CAP_SYS_RESOURCE here), the seccomp-enabled runc with cgroupfs, the
sandbox image pinned to the locally imported pause image, every registry sent
to a loopback port that refuses (``http://127.0.0.1:9``) and NRI disabled.

containerd runs as a :class:`~devtools.cluster.process.ManagedProcess` (the
one process runner: own session, log file, empty cwd, recorded by PID and
executable), so the local cluster records it next to its other components and
``dradriver cluster down`` in another process can stop it.

Teardown order (:meth:`Containerd.stop`): remove what runs in it while it is
still up (every pod sandbox through the CRI, which the kubelet leaves running
when it stops, then every task and container ``ctr run`` left in the given
namespaces), stop containerd, delete with runc any container still in its
runc root (containerd crashed or was killed), end shims it left, unmount what
it mounted under its root and state (overlays, shm, the pods' netns files,
which live under ``state/``), remove the shim socket dir and the empty
``k8s.io`` cgroups it created; then :func:`remove_state` deletes the base
directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devtools.cluster.cri import CRIClient, CRIError, PodSandbox
from devtools.cluster.process import ManagedProcess, ProcessRecord
from dradriver.log import get_logger

log = get_logger("cluster.containerd")

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
# The pod network: one tap device per pod netns, addresses from host-local.
CNI_NETWORK = "dradriver"
POD_SUBNET = "10.88.0.0/16"
# Nothing listens on the discard port; a pull fails at once and stays local.
REFUSING_REGISTRY = "http://127.0.0.1:9"
CGROUP_V1_ROOT = Path("/sys/fs/cgroup")


class ContainerdError(RuntimeError):
    """containerd did not start, or a ctr command failed; the message says how."""


# containerd refuses a shim socket_dir longer than this (core/runtime/v2/socket_linux.go).
MAX_SHIM_SOCKET_DIR = 42


@dataclass(frozen=True)
class Layout:
    """Where one containerd instance keeps everything, all under ``base``.

    ``shim_socket_dir`` defaults to ``base/s``; give a short path of its own
    when ``base`` is long (containerd allows at most 42 characters).
    """

    base: Path
    shim_socket_dir: Path | None = None

    @property
    def shim_sockets(self) -> Path:
        return self.shim_socket_dir or self.base / "s"

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def address(self) -> Path:
        """The grpc socket (what ``ctr -a`` and the kubelet's CRI endpoint use)."""
        return self.base / "containerd.sock"

    @property
    def ttrpc_address(self) -> Path:
        return self.base / "containerd.sock.ttrpc"

    @property
    def config(self) -> Path:
        return self.base / "config.toml"

    @property
    def hosts_dir(self) -> Path:
        """Registry hosts configuration (``certs.d`` layout)."""
        return self.base / "certs.d"

    @property
    def cdi_dir(self) -> Path:
        return self.base / "cdi"

    @property
    def cni_conf_dir(self) -> Path:
        return self.base / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        """host-local's IP leases (otherwise the host's /var/lib/cni/networks)."""
        return self.base / "cni" / "ipam"

    @property
    def opt(self) -> Path:
        return self.base / "opt"

    @property
    def temp(self) -> Path:
        return self.base / "tmp"

    @property
    def runc_root(self) -> Path:
        return self.state / "runc"

    @property
    def workdir(self) -> Path:
        """An empty working directory of its own (never a work tree)."""
        return self.base / "work"

    @property
    def log(self) -> Path:
        return self.base / "containerd.log"

    def check(self) -> None:
        # sun_path holds 107 bytes.
        if len(str(self.ttrpc_address)) > 100:
            raise ContainerdError(f"base dir {self.base} is too long for unix socket paths")
        if len(str(self.shim_sockets)) > MAX_SHIM_SOCKET_DIR:
            raise ContainerdError(
                f"shim socket dir {self.shim_sockets} is longer than {MAX_SHIM_SOCKET_DIR} "
                "characters; pass Layout(base, shim_socket_dir=<short path>)"
            )


def _toml(value: object) -> str:
    """A TOML value for a str, bool, int or list of those (JSON's forms are valid TOML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, str)):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _table(name: str, values: dict[str, object]) -> str:
    body = "".join(f"  {key} = {_toml(v)}\n" for key, v in values.items())
    return f"[{name}]\n{body}\n"


def config_text(
    layout: Layout,
    bin_dir: Path,
    cdi_spec_dirs: Sequence[Path] = (),
    sandbox_image: str = PAUSE_IMAGE,
    cni_bin_dirs: Sequence[Path] = (),
    cni_conf_dir: Path | None = None,
    log_level: str = "info",
) -> str:
    """containerd 2.4's config (version 4) for ``layout``, running ``bin_dir``'s runc."""
    cdi = [str(p) for p in cdi_spec_dirs] or [str(layout.cdi_dir)]
    cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
    runc = f"{cri_runtime}.containerd.runtimes.runc"
    images = "plugins.'io.containerd.cri.v1.images'"
    parts = [
        "# Written by devtools/cluster/containerd.py; one instance per kubelet.\n",
        "version = 4\n",
        f"root = {_toml(str(layout.root))}\n",
        f"state = {_toml(str(layout.state))}\n",
        f"temp = {_toml(str(layout.temp))}\n",
        # No drop-ins from the host's /etc/containerd/conf.d.
        "imports = []\n",
        # NRI's socket would be the host's /var/run/nri/nri.sock.
        "disabled_plugins = ['io.containerd.nri.v1.nri']\n\n",
        _table("debug", {"level": log_level}),
        _table("plugins.'io.containerd.server.v1.grpc'", {"address": str(layout.address)}),
        _table("plugins.'io.containerd.server.v1.ttrpc'", {"address": str(layout.ttrpc_address)}),
        _table("plugins.'io.containerd.internal.v1.opt'", {"path": str(layout.opt)}),
        # Shim sockets, otherwise in the host's /run/containerd/s.
        _table("plugins.'io.containerd.shim.v1.manager'", {"socket_dir": str(layout.shim_sockets)}),
        _table(
            cri_runtime,
            {
                "cdi_spec_dirs": cdi,
                # No CAP_SYS_RESOURCE here: a sandbox's oom_score_adj of -998
                # fails in runc init unless it is clamped to ours.
                "restrict_oom_score_adj": True,
                # Pod netns files under state/, not the host's /var/run/netns.
                "netns_mounts_under_state_dir": True,
            },
        ),
        _table(f"{cri_runtime}.containerd", {"default_runtime_name": "runc"}),
        _table(runc, {"runtime_type": "io.containerd.runc.v2"}),
        _table(
            f"{runc}.options",
            {
                "BinaryName": str(bin_dir / "runc"),
                "Root": str(layout.runc_root),
                "SystemdCgroup": False,
            },
        ),
        _table(
            f"{cri_runtime}.cni",
            {
                "bin_dirs": [str(p) for p in cni_bin_dirs] or [str(bin_dir)],
                "conf_dir": str(cni_conf_dir or layout.cni_conf_dir),
            },
        ),
        _table(f"{images}.pinned_images", {"sandbox": sandbox_image}),
        _table(f"{images}.registry", {"config_path": str(layout.hosts_dir)}),
        # The CRI streaming server (exec/attach/port-forward) on loopback, a
        # free port picked at start.
        _table(
            "plugins.'io.containerd.grpc.v1.cri'",
            {"stream_server_address": "127.0.0.1", "stream_server_port": "0"},
        ),
    ]
    return "".join(parts)


def hosts_toml(server: str = REFUSING_REGISTRY) -> str:
    """A registry hosts.toml that sends pulls and resolves to ``server``."""
    return (
        f"server = {_toml(server)}\n\n"
        f"[host.{_toml(server)}]\n"
        '  capabilities = ["pull", "resolve"]\n'
    )


def write_config(
    layout: Layout,
    bin_dir: Path,
    cdi_spec_dirs: Sequence[Path] = (),
    sandbox_image: str = PAUSE_IMAGE,
    cni_bin_dirs: Sequence[Path] = (),
    cni_conf_dir: Path | None = None,
    log_level: str = "info",
) -> Path:
    """Create ``layout``'s directories and write its config and registry hosts file."""
    layout.check()
    dirs = (layout.base, layout.root, layout.state, layout.temp, layout.workdir)
    for d in (*dirs, layout.shim_sockets):
        d.mkdir(parents=True, exist_ok=True)
    if not cdi_spec_dirs:
        layout.cdi_dir.mkdir(parents=True, exist_ok=True)
    if cni_conf_dir is None:
        layout.cni_conf_dir.mkdir(parents=True, exist_ok=True)
    default_hosts = layout.hosts_dir / "_default"
    default_hosts.mkdir(parents=True, exist_ok=True)
    (default_hosts / "hosts.toml").write_text(hosts_toml())
    layout.config.write_text(
        config_text(
            layout, bin_dir, cdi_spec_dirs, sandbox_image, cni_bin_dirs, cni_conf_dir, log_level
        )
    )
    return layout.config


def cni_conflist(layout: Layout, subnet: str = POD_SUBNET) -> dict[str, object]:
    """The pod network: a ``tap`` device as ``eth0`` with an address from ``host-local``.

    This kernel has no veth, macvlan or ipvlan, so the usual bridge/ptp
    plugins cannot work; tap needs only ``tun``. The pod gets a netns of its
    own with ``lo`` and a carrier-less ``eth0`` (containerd's CRI needs an IP
    on ``eth0``); the host gains no interface and nothing leaves the pod.
    ``lo`` comes from the ``loopback`` plugin, which containerd runs as a
    network of its own (``cni-loopback``) before this one: in a chain it
    would act on ``eth0``.
    """
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "tap",
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "dataDir": str(layout.cni_ipam_dir),
                },
            }
        ],
    }


def write_cni_conflist(layout: Layout, subnet: str = POD_SUBNET) -> Path:
    """Write :func:`cni_conflist` into the layout's CNI conf dir; return its path."""
    layout.cni_conf_dir.mkdir(parents=True, exist_ok=True)
    path = layout.cni_conf_dir / f"10-{CNI_NETWORK}.conflist"
    path.write_text(json.dumps(cni_conflist(layout, subnet), indent=2) + "\n")
    return path


# --- ctr ----------------------------------------------------------------------


def ctr_argv(bin_dir: Path, layout: Layout, namespace: str, *args: str) -> list[str]:
    return [str(bin_dir / "ctr"), "-a", str(layout.address), "-n", namespace, *args]


def run_ctr(
    bin_dir: Path,
    layout: Layout,
    namespace: str,
    *args: str,
    timeout: float = 60,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    argv = ctr_argv(bin_dir, layout, namespace, *args)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    if check and proc.returncode != 0:
        raise ContainerdError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


# --- start and stop -------------------------------------------------------------


def proc_exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _alive(pid: int, exe: str) -> bool:
    """True while ``pid`` runs ``exe`` and has not exited (zombies count as gone)."""
    if proc_exe(pid) != exe:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class Containerd:
    """A containerd of ours: its process, binaries and layout.

    Started here (:func:`start`) or, for a teardown from another process (the
    local cluster's ``down``), rebuilt from the process record
    (:meth:`adopt`).
    """

    layout: Layout
    bin_dir: Path
    process: ManagedProcess
    ready_seconds: float | None = None
    # Cgroup parents containerd creates (the CRI's default "k8s.io"), and of
    # those, the ones that existed before it started (never removed).
    cgroup_parents: list[str] = field(default_factory=lambda: ["k8s.io"])
    cgroups_before: list[str] = field(default_factory=list)

    @classmethod
    def adopt(
        cls, layout: Layout, record: ProcessRecord, cgroups_before: Sequence[str] = ()
    ) -> Containerd:
        bin_dir = Path(record.exe).parent
        process = ManagedProcess.adopt(record)
        return cls(layout, bin_dir, process, cgroups_before=[*cgroups_before])

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def exe(self) -> str:
        return str((self.bin_dir / "containerd").resolve())

    def runc_flags(self) -> list[str]:
        """``ctr run`` options for the seccomp runc and this instance's runc root.

        The CRI plugin takes these from the config; ``ctr run`` does not, and
        would otherwise use ``runc`` from PATH with root /run/containerd/runc.
        """
        return [
            "--runc-binary",
            str(self.bin_dir / "runc"),
            "--runc-root",
            str(self.layout.runc_root),
        ]

    def alive(self) -> bool:
        return self.process.alive()

    def ctr(
        self, namespace: str, *args: str, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return run_ctr(self.bin_dir, self.layout, namespace, *args, timeout=timeout, check=check)

    def cri(self) -> CRIClient:
        """A CRI client on this instance's socket (the one the kubelet uses)."""
        return CRIClient(self.layout.address)

    def answers(self) -> bool:
        """Whether containerd answers ``ctr version`` yet."""
        if not self.layout.address.exists():
            return False
        return self.ctr("default", "version", timeout=10, check=False).returncode == 0

    def remove_pod_sandboxes(self) -> list[PodSandbox]:
        """Stop and remove every pod sandbox through the CRI (what the kubelet left).

        containerd then undoes them itself: containers, the CNI DEL of their
        networks (host-local's IP leases, libcni's result cache), netns and
        shm mounts.
        """
        with self.cri() as cri:
            return cri.remove_all_pod_sandboxes()

    def remove_tasks(self, namespace: str, grace: float = 5.0) -> list[str]:
        """Kill and delete every task and container in ``namespace``; return their IDs.

        For containers started with ``ctr run``; the kubelet's pods go first
        through the CRI (:meth:`remove_pod_sandboxes`).
        """
        tasks = self.ctr(namespace, "tasks", "list", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr(namespace, "tasks", "kill", "-s", "SIGTERM", task, check=False)
        deadline = time.monotonic() + grace
        for task in tasks:
            while time.monotonic() < deadline and self.task_running(namespace, task):
                time.sleep(0.05)
            if self.task_running(namespace, task):
                self.ctr(namespace, "tasks", "kill", "-s", "SIGKILL", task, check=False)
            self.ctr(namespace, "tasks", "delete", "-f", task, check=False)
        containers = self.ctr(namespace, "containers", "list", "-q", check=False).stdout.split()
        for container in containers:
            self.ctr(namespace, "containers", "delete", container, check=False)
        return sorted(set(tasks) | set(containers))

    def task_running(self, namespace: str, task: str) -> bool:
        proc = self.ctr(namespace, "tasks", "list", check=False)
        for line in proc.stdout.splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == task:
                return len(fields) >= 3 and fields[2] not in ("STOPPED", "UNKNOWN")
        return False

    def stop(
        self, namespaces: Iterable[str] = ("k8s.io", "default"), timeout: float = 10.0
    ) -> None:
        """Tear down in order: pod sandboxes (CRI), tasks (ctr), containerd, runc
        leftovers, shims, mounts, cgroups."""
        if self.alive():
            try:
                removed = self.remove_pod_sandboxes()
            except CRIError as e:
                # Still tear down what can be: runc and the mounts below do not need it.
                log.warning("could not remove pod sandboxes through the CRI", error=str(e))
            else:
                if removed:
                    names = ",".join(f"{s.namespace}/{s.name}" for s in removed)
                    log.info("removed pod sandboxes", count=len(removed), pods=names)
            for namespace in namespaces:
                tasks = self.remove_tasks(namespace)
                if tasks:
                    log.info("removed tasks", namespace=namespace, ids=",".join(tasks))
        self.process.stop(timeout)
        # containerd gone with tasks still up (it crashed or was killed): the
        # containers outlive their shims, so delete them through runc itself.
        for container in self.delete_runc_containers():
            log.warning("deleted a container containerd left running", id=container)
        for pid in self.shim_pids():
            log.warning("ending a shim containerd left", pid=pid)
            self._signal_and_wait(pid, str((self.bin_dir / "containerd-shim-runc-v2").resolve()), 5)
        unmount_under([self.layout.root, self.layout.state, self.layout.base])
        if self.layout.shim_socket_dir is not None:
            shutil.rmtree(self.layout.shim_socket_dir, ignore_errors=True)
        keep = {Path(p) for p in self.cgroups_before}
        for removed_cgroup in remove_empty_cgroups(self.cgroup_parents, keep=keep):
            log.debug("removed cgroup", path=str(removed_cgroup))

    @staticmethod
    def _signal_and_wait(pid: int, exe: str, timeout: float) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not _alive(pid, exe):
                break
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and _alive(pid, exe):
                time.sleep(0.05)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)

    def delete_runc_containers(self) -> list[str]:
        """``runc delete --force`` every container in this instance's runc root."""
        runc = str(self.bin_dir / "runc")
        deleted = []
        root = self.layout.runc_root
        for ns_root in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
            listed = subprocess.run(
                [runc, "--root", str(ns_root), "list", "-q"],
                capture_output=True,
                text=True,
                check=False,
                timeout=30,
            )
            for container in listed.stdout.split():
                subprocess.run(
                    [runc, "--root", str(ns_root), "delete", "--force", container],
                    capture_output=True,
                    check=False,
                    timeout=30,
                )
                deleted.append(f"{ns_root.name}/{container}")
        return deleted

    def shim_pids(self) -> list[int]:
        """PIDs of this instance's shims (our shim binary, started with our address)."""
        shim = str((self.bin_dir / "containerd-shim-runc-v2").resolve())
        address = str(self.layout.address)
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or proc_exe(int(entry.name)) != shim:
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if address.encode() in argv:
                found.append(int(entry.name))
        return found


def start(
    layout: Layout,
    bin_dir: Path,
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
    name: str = "containerd",
) -> Containerd:
    """Start containerd with ``layout.config`` (see :func:`write_config`) and wait until ready.

    ``name`` is the process's name in logs and records (one instance per
    kubelet: ``containerd``, ``containerd-node-2``, ...).
    """
    if not layout.config.exists():
        raise ContainerdError(f"no config at {layout.config}; call write_config first")
    if layout.address.exists():
        raise ContainerdError(
            f"{layout.address} exists: is another containerd using {layout.base}?"
        )
    run_env = dict(env or os.environ)
    # The shim (runtime_type io.containerd.runc.v2) is looked up on PATH.
    run_env["PATH"] = f"{bin_dir}{os.pathsep}{run_env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
    cgroups_before = [str(p) for p in existing_cgroups(["k8s.io"])]
    started = time.monotonic()
    process = ManagedProcess.start(
        name,
        [str(bin_dir / "containerd"), "--config", str(layout.config)],
        log_path=layout.log,
        cwd=layout.workdir,
        env=run_env,
    )
    handle = Containerd(layout, bin_dir, process, cgroups_before=cgroups_before)
    try:
        process.wait_ready(f"{name} to answer on {layout.address}", handle.answers, timeout)
    except BaseException:
        handle.stop(namespaces=())
        raise
    handle.ready_seconds = time.monotonic() - started
    log.info(
        "containerd ready",
        pid=process.pid,
        seconds=round(handle.ready_seconds, 2),
        address=str(layout.address),
    )
    return handle


# --- teardown helpers -----------------------------------------------------------


def _unescape_mount(field_text: str) -> str:
    """Undo /proc/self/mountinfo's \\ooo escapes."""
    out = bytearray()
    raw = field_text.encode()
    i = 0
    while i < len(raw):
        if raw[i] == 0x5C and i + 3 < len(raw) and raw[i + 1 : i + 4].isdigit():
            out.append(int(raw[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode(errors="surrogateescape")


def mounts_under(paths: Iterable[Path]) -> list[Path]:
    """Mount points at or below any of ``paths``, deepest first."""
    roots = [str(Path(p).resolve()) for p in paths]
    found: set[str] = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 5:
                continue
            point = _unescape_mount(fields[4])
            if any(point == r or point.startswith(r + "/") for r in roots):
                found.add(point)
    return [Path(p) for p in sorted(found, key=lambda p: (-p.count("/"), p))]


def unmount_under(paths: Iterable[Path], attempts: int = 3) -> None:
    """Unmount everything mounted at or below ``paths`` (overlays, shm, netns, ...)."""
    paths = list(paths)
    for _ in range(attempts):
        points = mounts_under(paths)
        if not points:
            return
        for point in points:
            proc = subprocess.run(["umount", str(point)], capture_output=True, text=True)
            if proc.returncode != 0:
                subprocess.run(["umount", "-l", str(point)], capture_output=True, text=True)
    left = mounts_under(paths)
    if left:
        raise ContainerdError(f"still mounted after unmounting: {', '.join(map(str, left))}")


def cgroup_v1_hierarchies() -> list[Path]:
    """The mounted cgroup hierarchies under /sys/fs/cgroup (v1 controllers and unified)."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-") if "-" in fields else -1
            if sep > 0 and fields[sep + 1] in ("cgroup", "cgroup2"):
                point = Path(_unescape_mount(fields[4]))
                if point.is_relative_to(CGROUP_V1_ROOT):
                    found.append(point)
    return sorted(set(found))


def existing_cgroups(parents: Iterable[str]) -> list[Path]:
    """``<hierarchy>/<parent>`` dirs that exist now (recorded before containerd starts)."""
    return [
        hierarchy / parent.strip("/")
        for hierarchy in cgroup_v1_hierarchies()
        for parent in parents
        if (hierarchy / parent.strip("/")).is_dir()
    ]


def remove_empty_cgroups(parents: Iterable[str], keep: Collection[Path] = ()) -> list[Path]:
    """rmdir ``<hierarchy>/<parent>`` (and empty children) where nothing runs in them.

    rmdir only succeeds on a cgroup without processes or children, so a
    cgroup another runtime still uses is left alone. A parent in ``keep``
    existed before our containerd started: its empty children (ours, left by
    a crash) go, the parent stays.
    """
    removed = []
    for hierarchy in cgroup_v1_hierarchies():
        for parent in parents:
            top = hierarchy / parent.strip("/")
            if not top.is_dir() or top == hierarchy:
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                try:
                    d.rmdir()
                    removed.append(d)
                except OSError:
                    pass
            if top in keep:
                continue
            try:
                top.rmdir()
                removed.append(top)
            except OSError:
                pass
    return removed


def remove_state(layout: Layout) -> None:
    """Delete the base directory; refuses while anything is still mounted below it."""
    left = mounts_under([layout.base])
    if left:
        raise ContainerdError(
            f"refusing to delete {layout.base}: still mounted: {', '.join(map(str, left))}"
        )
    # No mounts below, so this stays inside base (rmtree does not follow symlinks).
    shutil.rmtree(layout.base, ignore_errors=True)
