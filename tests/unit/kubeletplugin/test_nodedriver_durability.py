"""What the node keeps across crashes: durable, atomic writes; locks across processes;
start-up finishing or undoing what a crash interrupted; refusing a newer ledger.

Crashes are real: a plugin process (``multiprocessing``, spawned) is killed by its own
hook, by SIGXFSZ in the middle of a write, or by ``os._exit`` at a chosen step; then
the test starts the plugin again over the same directories. The syscall order of a
write is recorded through the ``os`` functions the writers call (fsync cannot be
observed any other way: a crash without power loss keeps unsynced data).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, cast

import pytest

from dradriver.devices.model import Device
from dradriver.host.cdi import CDIDevice, CDIRegistry
from dradriver.host.containeredits import ContainerEdits, DeviceNode
from dradriver.host.hooks import Hook, run_hook
from dradriver.host.state import claimstore
from dradriver.host.state.codec import checksum
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import ClaimDevice
from dradriver.k8s.client import KubeClient
from dradriver.k8s.objects import Obj
from dradriver.plugin.claimlock import ClaimLocks
from dradriver.plugin.interface import PrepareResult
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.nodedriver import NodeDriver
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.claims import DRIVER, NODE, allocated_claim, claim_ref, result, store_claim

DEVICES = [
    Device(
        name=f"dev-{i}",
        edits=ContainerEdits(
            device_nodes=(DeviceNode(path=f"/dev/mock{i}", host_path="/dev/null"),)
        ),
    )
    for i in range(2)
]
CLAIM = allocated_claim("durable", [result("dev-0")])
UID = str(CLAIM["metadata"]["uid"])
# Failure deadline for what another process must do (never reached when all is well).
DEADLINE = 60

# $1: the records dir. A file "crash-<hook>" there makes that hook kill the plugin
# (its parent) once; "hold" makes the setup hook announce itself on the FIFO "entered"
# and wait for a line on the FIFO "release" (once: the file is moved away).
SETUP = r"""
echo "setup $DRADRIVER_CLAIM_UID $DRADRIVER_DEVICE" >> "$1/hooks.log"
if mv "$1/crash-setup" "$1/crashed" 2>/dev/null; then kill -9 "$PPID"; exit 0; fi
if mv "$1/hold" "$1/held" 2>/dev/null; then echo in > "$1/entered"; read x < "$1/release"; fi
"""
TEARDOWN = r"""
echo "teardown $DRADRIVER_CLAIM_UID $DRADRIVER_DEVICE" >> "$1/hooks.log"
if mv "$1/crash-teardown" "$1/crashed" 2>/dev/null; then kill -9 "$PPID"; fi
"""


class Plugin:
    """One start of the node plugin over ``root``: ledger, CDI dir, hooks, claim locks."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.records = root / "hooks"
        self.records.mkdir(exist_ok=True)
        self.api = FakeAPIServer()
        store_claim(self.api, CLAIM)
        self.ledger = Ledger.load(root / "plugin" / "ledger.json")
        self.cdi = CDIRegistry(root / "cdi", DRIVER, durable=False)
        records = str(self.records)
        self.driver = NodeDriver(
            client=cast(KubeClient, self.api),
            driver_name=DRIVER,
            inventory=NodeInventory(NODE, lambda: list(DEVICES)),
            ledger=self.ledger,
            cdi=self.cdi,
            setup=Hook("setup", command=("sh", "-c", SETUP, "setup", records)),
            teardown=Hook("teardown", command=("sh", "-c", TEARDOWN, "teardown", records)),
        )

    def prepare(self) -> PrepareResult:
        return asyncio.run(self.driver.prepare_claims([claim_ref(CLAIM)]))[UID]

    def unprepare(self) -> str:
        return asyncio.run(self.driver.unprepare_claims([claim_ref(CLAIM)]))[UID]

    def hook_runs(self) -> list[str]:
        log = self.records / "hooks.log"
        return log.read_text().splitlines() if log.exists() else []


def spawn(target: Callable[..., None], *args: object) -> BaseProcess:
    # Spawned, not forked: the test process may have gRPC threads.
    process = multiprocessing.get_context("spawn").Process(target=target, args=args)
    process.start()
    return process


def _prepare_in_a_plugin(root: str) -> None:
    Plugin(Path(root)).prepare()


def _prepare_then_unprepare_in_a_plugin(root: str) -> None:
    plugin = Plugin(Path(root))
    assert plugin.prepare().error == ""
    plugin.unprepare()


def crashed(process: BaseProcess) -> None:
    process.join(DEADLINE)
    assert process.exitcode == -signal.SIGKILL, process.exitcode


NOTHING = dict.fromkeys(
    ("kept", "regenerated", "adopted", "torn_down", "orphans", "unconfirmed"), 0
)


# ----- start-up after a crash ----------------------------------------------------------


def test_a_prepare_cut_short_by_a_crash_is_rolled_back_at_start_not_by_the_retry(
    tmp_path: Path,
) -> None:
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "crash-setup").touch()
    crashed(spawn(_prepare_in_a_plugin, str(tmp_path)))
    on_disk = Ledger.load(tmp_path / "plugin" / "ledger.json").get_claim(UID)
    assert on_disk is not None and on_disk.state == "preparing"

    plugin = Plugin(tmp_path)  # the restart
    assert asyncio.run(plugin.driver.reconcile()) == {**NOTHING, "torn_down": 1}
    # Undone at start, before the kubelet asks again: the device is free meanwhile.
    assert plugin.hook_runs() == [f"setup {UID} dev-0", f"teardown {UID} dev-0"]
    assert plugin.ledger.get_claim(UID) is None and plugin.cdi.claim_uids_on_disk() == set()
    assert plugin.prepare().error == ""  # the kubelet's retry starts from scratch
    assert plugin.hook_runs()[2:] == [f"setup {UID} dev-0"]


def test_an_unprepare_cut_short_by_a_crash_is_finished_at_start(tmp_path: Path) -> None:
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "crash-teardown").touch()
    crashed(spawn(_prepare_then_unprepare_in_a_plugin, str(tmp_path)))
    on_disk = Ledger.load(tmp_path / "plugin" / "ledger.json").get_claim(UID)
    assert on_disk is not None and on_disk.state == "unpreparing"

    plugin = Plugin(tmp_path)
    assert asyncio.run(plugin.driver.reconcile()) == {**NOTHING, "torn_down": 1}
    assert plugin.hook_runs() == [
        f"setup {UID} dev-0",
        f"teardown {UID} dev-0",  # the one the crash cut short
        f"teardown {UID} dev-0",
    ]
    assert plugin.ledger.get_claim(UID) is None and plugin.cdi.claim_uids_on_disk() == set()
    assert plugin.ledger.held_devices() == set()


# ----- two plugin processes, one claim --------------------------------------------------


def _racing_plugin(root: str, name: str, events: Any) -> None:
    plugin = Plugin(Path(root))
    plugin.driver.claim_locks.on_wait = lambda uid: events.put((name, "waiting"))
    outcome = plugin.prepare()
    events.put((name, outcome.error, [list(d.cdi_ids) for d in outcome.devices]))


def test_two_plugin_processes_preparing_one_claim_do_the_work_once(tmp_path: Path) -> None:
    records = tmp_path / "hooks"
    records.mkdir()
    os.mkfifo(records / "entered")
    os.mkfifo(records / "release")
    (records / "hold").touch()
    events = multiprocessing.get_context("spawn").Queue()
    first = spawn(_racing_plugin, str(tmp_path), "first", events)
    # Blocks until the first process is inside its setup hook, holding the claim.
    assert (records / "entered").read_text() == "in\n"
    second = spawn(_racing_plugin, str(tmp_path), "second", events)
    assert events.get(timeout=DEADLINE) == ("second", "waiting")
    (records / "release").write_text("go\n")
    outcomes = sorted(events.get(timeout=DEADLINE) for _ in range(2))
    for process in (first, second):
        process.join(DEADLINE)
        assert process.exitcode == 0
    ids = [[f"{DRIVER}/device={UID}-dev-0"]]
    assert outcomes == [("first", "", ids), ("second", "", ids)]
    assert Plugin(tmp_path).hook_runs() == [f"setup {UID} dev-0"]


def test_claim_locks_on_separate_open_files_never_admit_two(tmp_path: Path) -> None:
    """Three processes' views of one lock directory (separate open files, like separate
    processes): A holds, B waits for A, A finishes; then C comes."""

    async def scenario() -> int:
        a, b, c = (ClaimLocks(tmp_path) for _ in range(3))
        inside: set[str] = set()
        most = 0
        waited: list[str] = []
        changed, release = asyncio.Event(), {"b": asyncio.Event(), "c": asyncio.Event()}

        def note_wait(name: str) -> Callable[[str], None]:
            def waiting(uid: str) -> None:
                waited.append(name)
                changed.set()

            return waiting

        b.on_wait, c.on_wait = note_wait("b"), note_wait("c")

        async def contender(name: str, locks: ClaimLocks) -> None:
            nonlocal most
            async with locks.hold(UID):
                inside.add(name)
                most = max(most, len(inside))
                changed.set()
                await release[name].wait()
                inside.discard(name)

        async def until(condition: Callable[[], bool]) -> None:
            while not condition():
                changed.clear()
                await changed.wait()

        async with asyncio.timeout(DEADLINE):
            async with a.hold(UID):
                tb = asyncio.create_task(contender("b", b))
                await until(lambda: waited == ["b"])
            tc = asyncio.create_task(contender("c", c))
            # One of b and c gets in; the other waits (b since A held it), never gets in too.
            await until(
                lambda: len(inside) == 2 or (len(inside) == 1 and "c" in [*waited, *inside])
            )
            first = next(iter(inside))
            other = "c" if first == "b" else "b"
            release[first].set()
            await until(lambda: other in inside)
            release[other].set()
            await asyncio.gather(tb, tc)
        return most

    assert asyncio.run(scenario()) == 1
    # One lock file, still empty, whatever the number of claims: nothing per claim is left.
    assert [(p.name, p.stat().st_size) for p in tmp_path.iterdir()] == [("claims.lock", 0)]


def _hold_and_die(root: str, held: Any) -> None:
    async def die_holding() -> None:
        async with ClaimLocks(Path(root)).hold(UID):
            held.put("held")
            held.close()
            held.join_thread()  # the message is out before the process dies
            os._exit(0)  # no unlock, no cleanup: as a killed plugin

    asyncio.run(die_holding())


def test_a_dead_holders_claim_lock_is_free_again(tmp_path: Path) -> None:
    """The kernel drops a dead process's open-file locks: a crashed plugin holds nothing."""
    held = multiprocessing.get_context("spawn").Queue()
    process = spawn(_hold_and_die, str(tmp_path), held)
    assert held.get(timeout=DEADLINE) == "held"
    process.join(DEADLINE)
    assert process.exitcode == 0
    waited: list[str] = []

    async def take() -> None:
        locks = ClaimLocks(tmp_path)
        locks.on_wait = waited.append
        async with asyncio.timeout(DEADLINE), locks.hold(UID):
            pass

    asyncio.run(take())
    assert waited == []  # free at the first try


# ----- the ledger's writes --------------------------------------------------------------


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.fixture
def syscalls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str, bytes]]]:
    """(call, path, content of the file at the time) for every fsync, rename and open for
    writing that the writers make, in order."""
    calls: list[tuple[str, str, bytes]] = []
    real_fsync, real_replace, real_rename, real_open = os.fsync, os.replace, os.rename, os.open

    def fsync(fd: int) -> None:
        path = _fd_path(fd)
        content = Path(path).read_bytes() if os.path.isfile(path) else b""
        calls.append(("fsync", path, content))
        real_fsync(fd)

    def replace(src: Any, dst: Any, **kw: Any) -> None:
        calls.append(("rename", f"{src} -> {dst}", b""))
        real_replace(src, dst, **kw)

    def rename(src: Any, dst: Any, **kw: Any) -> None:
        calls.append(("rename", f"{src} -> {dst}", b""))
        real_rename(src, dst, **kw)

    def open_(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR):
            calls.append(("open-for-writing", str(path), b""))
        return real_open(path, flags, *args, **kw)

    for name, fake in (("fsync", fsync), ("replace", replace), ("rename", rename)):
        monkeypatch.setattr(os, name, fake)
    monkeypatch.setattr(os, "open", open_)
    yield calls


def _writes_of(calls: list[tuple[str, str, bytes]], target: Path) -> list[tuple[str, str]]:
    """The calls about ``target``, named: "temp" (a temp file beside it; "complete" if an
    fsync found the final content in it), "temp -> target", "target", "directory"."""
    temp = f"{target.parent}/.{target.name}."
    final = target.read_bytes()
    out = []
    for call, path, content in calls:
        if call == "rename" and path.startswith(temp):
            out.append((call, "temp -> target" if path.endswith(f" -> {target}") else path))
        elif path.startswith(temp):
            complete = call == "fsync" and content == final
            out.append((call, "temp (complete)" if complete else "temp"))
        elif path == str(target):
            out.append((call, "target"))
        elif path == str(target.parent):
            out.append((call, "directory"))
    return out


DURABLE = [
    ("open-for-writing", "temp"),
    ("fsync", "temp (complete)"),  # the whole new content is on disk ...
    ("rename", "temp -> target"),  # ... before it replaces the old one in one step ...
    ("fsync", "directory"),  # ... and the rename is on disk too
]


def test_a_ledger_change_is_written_to_a_temp_file_fsynced_renamed_and_the_dir_fsynced(
    tmp_path: Path, syscalls: list[tuple[str, str, bytes]]
) -> None:
    path = tmp_path / "plugin" / "ledger.json"
    Ledger(path).begin_prepare(UID, "default", "durable", [ClaimDevice(pool=NODE, device="dev-0")])
    assert _writes_of(syscalls, path) == DURABLE


def test_a_durable_cdi_spec_is_written_like_the_ledger_and_a_claims_spec_atomically(
    tmp_path: Path, syscalls: list[tuple[str, str, bytes]]
) -> None:
    edits = [CDIDevice("dev-0", ContainerEdits(env={"A": "1"}))]
    durable = CDIRegistry(tmp_path / "cdi", DRIVER, "deviceplugin")  # the shim's specs
    durable.write_claim("alloc-1", edits)
    assert _writes_of(syscalls, durable.spec_path("alloc-1")) == DURABLE
    syscalls.clear()
    # DRA claim specs: atomic, not fsynced (the ledger is the durable record, and
    # start-up writes any missing spec again).
    claims = CDIRegistry(tmp_path / "cdi", DRIVER, durable=False)
    claims.write_claim(UID, edits)
    assert _writes_of(syscalls, claims.spec_path(UID)) == [
        ("open-for-writing", "temp"),
        ("rename", "temp -> target"),
    ]


def test_the_ledger_is_durable_before_a_device_is_set_up(
    tmp_path: Path, syscalls: list[tuple[str, str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = Plugin(tmp_path)

    async def recording_run_hook(hook: Hook, env: dict[str, str]) -> str:
        syscalls.append(("hook", hook.name, b""))
        return await run_hook(hook, env)

    monkeypatch.setattr(claimstore, "run_hook", recording_run_hook)
    assert plugin.prepare().error == ""
    steps = [(call, path) for call, path, _ in syscalls]
    setup = steps.index(("hook", "setup"))
    ledger = plugin.ledger.path
    renamed = [i for i, (call, path) in enumerate(steps[:setup]) if path.endswith(f" -> {ledger}")]
    assert renamed, "no ledger write before the setup hook"
    assert ("fsync", str(ledger.parent)) in steps[renamed[-1] : setup]


# ----- crashes in the middle of a ledger write --------------------------------------------


def _many_claims(ledger: Ledger) -> None:
    with ledger.transaction():
        for i in range(50):
            ledger.begin_prepare(f"u{i}", "ns", f"c{i}", [ClaimDevice(pool=NODE, device=f"d{i}")])


def _crash_while_writing(path: str, limit: int) -> None:
    ledger = Ledger.load(path)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the inherited stdout and stderr may be files longer than limit
    os.dup2(devnull, 2)
    # Any write that would make a file longer than ``limit`` kills the process (SIGXFSZ,
    # which CPython ignores unless told): the crash lands in the middle of the write,
    # whatever the writer does.
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    _many_claims(ledger)


def _crash_at(path: str, step: str) -> None:
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        if step == "after-rename":
            real_replace(src, dst)
        os._exit(9)

    os.replace = replace  # type: ignore[assignment]
    _many_claims(Ledger.load(path))


@pytest.mark.parametrize(
    ("crash", "survives"),
    [("mid-write", "old"), ("before-rename", "old"), ("after-rename", "new")],
)
def test_a_crash_during_a_ledger_write_leaves_the_old_or_the_new_ledger(
    tmp_path: Path, crash: str, survives: str
) -> None:
    path = tmp_path / "ledger.json"
    first = [ClaimDevice(pool=NODE, device="dev-0")]
    Ledger.load(path).begin_prepare(UID, "default", "durable", first)
    limit = len(path.read_bytes()) + 64
    if crash == "mid-write":
        process = spawn(_crash_while_writing, str(path), limit)
    else:
        process = spawn(_crash_at, str(path), crash)
    process.join(DEADLINE)
    assert process.exitcode == (-signal.SIGXFSZ if crash == "mid-write" else 9)
    if crash == "mid-write":  # killed with a partial new ledger written somewhere
        assert [t.stat().st_size for t in tmp_path.glob(".ledger.json.*.tmp")] == [limit]
    after = Ledger.load(path)
    assert not after.needs_rebuild  # never a torn file
    uids = {c.uid for c in after.claims()}
    assert uids == ({UID} if survives == "old" else {UID, *(f"u{i}" for i in range(50))})


# ----- a ledger from a newer dradriver ---------------------------------------------------


def test_a_newer_ledger_stops_the_plugin_with_a_message_saying_what_to_do(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    data: Obj = {"claims": [], "future": True}
    newer = {"version": 3, "checksum": checksum({"version": 3, "data": data}), "data": data}
    (state / "ledger.json").write_text(json.dumps(newer))
    before = (state / "ledger.json").read_bytes()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    plugin = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubeletplugin.main",
            "--node-name=node-1",
            f"--kubelet-root={tmp_path / 'kubelet'}",
            f"--state-dir={state}",
            f"--cdi-dir={tmp_path / 'cdi'}",
            f"--kubeconfig={kubeconfig}",
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert plugin.returncode == 1, plugin.stderr
    message = plugin.stderr.strip().splitlines()[-1]
    assert message.startswith("dradriver-kubeletplugin: error: ledger ")
    assert "has format version 3, but this dradriver supports only version 2" in message
    assert "Run a release that understands version 3" in message
    assert (state / "ledger.json").read_bytes() == before
    assert not (tmp_path / "kubelet" / "plugins_registry").exists()  # never registered
