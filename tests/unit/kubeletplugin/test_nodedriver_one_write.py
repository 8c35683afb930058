"""Claims no hook works on: one durable ledger write per prepare and per unprepare.

Without a setup hook the only thing a prepare changes outside the plugin is the claim's
CDI spec, which names the claim UID and so is usable by no container before the kubelet
has the answer. The node driver writes the spec first and records the claim as prepared
in one write; an unprepare without a teardown hook removes the spec, then the entry.

The crash windows this opens are real crashes here: a spawned plugin process exits
(``os._exit``) at the rename of the ledger write, after the spec was written or removed;
then the test starts the plugin again over the same directories. Writes are counted
through ``os.replace``, the one call that makes a new ledger (or spec) visible.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from dradriver.devices.model import Device
from dradriver.host.cdi import CDIRegistry
from dradriver.host.containeredits import ContainerEdits, DeviceNode
from dradriver.host.state.ledger import Ledger
from dradriver.k8s.client import KubeClient
from dradriver.k8s.objects import Obj
from dradriver.plugin.interface import PrepareResult
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.nodedriver import NodeDriver
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.claims import (
    DRIVER,
    NODE,
    allocated_claim,
    claim_ref,
    result,
    store_claim,
)

DEVICES = [
    Device(
        name=f"dev-{i}",
        edits=ContainerEdits(
            device_nodes=(DeviceNode(path=f"/dev/mock{i}", host_path="/dev/null"),)
        ),
    )
    for i in range(2)
]
CLAIM = allocated_claim("hookless", [result("dev-0")])
UID = str(CLAIM["metadata"]["uid"])
OTHER = allocated_claim("intruder", [result("dev-0")])
DEADLINE = 60  # for the spawned plugin (never reached when all is well)
CRASH_EXIT = 9
NOTHING = dict.fromkeys(
    ("kept", "regenerated", "adopted", "torn_down", "orphans", "unconfirmed"), 0
)


class Plugin:
    """One start of a node plugin without hooks over ``root``."""

    def __init__(self, root: Path, claims: tuple[Obj, ...] = (CLAIM,)) -> None:
        self.api = FakeAPIServer()
        for claim in claims:
            store_claim(self.api, claim)
        self.ledger = Ledger.load(root / "plugin" / "ledger.json")
        self.cdi = CDIRegistry(root / "cdi", DRIVER, durable=False)
        self.driver = NodeDriver(
            client=cast(KubeClient, self.api),
            driver_name=DRIVER,
            inventory=NodeInventory(NODE, lambda: list(DEVICES)),
            ledger=self.ledger,
            cdi=self.cdi,
        )

    def prepare(self, claim: Obj = CLAIM) -> PrepareResult:
        ref = claim_ref(claim)
        return asyncio.run(self.driver.prepare_claims([ref]))[ref.uid]

    def unprepare(self, claim: Obj = CLAIM) -> str:
        ref = claim_ref(claim)
        return asyncio.run(self.driver.unprepare_claims([ref]))[ref.uid]


@pytest.fixture
def renames(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The target of every ``os.replace`` in this process, in order."""
    seen: list[str] = []
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        seen.append(str(dst))
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    yield seen


def test_a_prepare_without_a_setup_hook_writes_the_spec_then_the_ledger_once(
    tmp_path: Path, renames: list[str]
) -> None:
    plugin = Plugin(tmp_path)
    outcome = plugin.prepare()
    assert outcome.error == ""
    spec, ledger = str(plugin.cdi.spec_path(UID)), str(plugin.ledger.path)
    assert renames == [spec, ledger]  # the spec first, then one ledger write
    entry = Ledger.load(plugin.ledger.path).get_claim(UID)
    assert entry is not None and entry.state == "prepared"
    assert entry.cdi_ids == list(outcome.devices[0].cdi_ids)


def test_an_unprepare_without_a_teardown_hook_writes_the_ledger_once(
    tmp_path: Path, renames: list[str]
) -> None:
    plugin = Plugin(tmp_path)
    assert plugin.prepare().error == ""
    renames.clear()
    assert plugin.unprepare() == ""
    assert renames == [str(plugin.ledger.path)]
    assert not plugin.cdi.spec_path(UID).exists()
    assert Ledger.load(plugin.ledger.path).claims() == []


def test_a_refused_prepare_leaves_no_spec_behind(tmp_path: Path) -> None:
    plugin = Plugin(tmp_path, (CLAIM, OTHER))
    assert plugin.prepare().error == ""
    refused = plugin.prepare(OTHER)
    assert "is held by claim default/hookless" in refused.error
    assert plugin.cdi.claim_uids_on_disk() == {UID}
    assert plugin.ledger.held_devices() == {(NODE, "dev-0")}


# ----- crashes between the spec and the ledger write ----------------------------------


def _crash_at_the_ledger_write(root: str, prepare_first: bool) -> None:
    plugin = Plugin(Path(root))
    if prepare_first:
        assert plugin.prepare().error == ""
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(dst) == plugin.ledger.path:
            os._exit(CRASH_EXIT)  # the ledger write never lands
        real(src, dst)

    os.replace = replace  # type: ignore[assignment]
    if prepare_first:
        plugin.unprepare()
    else:
        plugin.prepare()


def crash(root: Path, prepare_first: bool) -> None:
    # Spawned, not forked: the test process may have gRPC threads.
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=_crash_at_the_ledger_write, args=(str(root), prepare_first))
    process.start()
    process.join(DEADLINE)
    assert process.exitcode == CRASH_EXIT


def test_a_crash_after_the_spec_of_a_prepare_adopts_the_claim_if_still_allocated(
    tmp_path: Path,
) -> None:
    crash(tmp_path, prepare_first=False)
    restarted = Plugin(tmp_path)
    assert restarted.ledger.claims() == []  # the crash left only the spec
    assert restarted.cdi.claim_uids_on_disk() == {UID}
    assert asyncio.run(restarted.driver.reconcile()) == {**NOTHING, "adopted": 1}
    assert restarted.ledger.held_devices() == {(NODE, "dev-0")}
    again = restarted.prepare()  # the kubelet's retry
    assert again.error == "" and restarted.cdi.claim_uids_on_disk() == {UID}


def test_a_crash_after_the_spec_of_a_prepare_deletes_it_if_the_claim_is_gone(
    tmp_path: Path,
) -> None:
    crash(tmp_path, prepare_first=False)
    restarted = Plugin(tmp_path, claims=())  # deleted while the plugin was down
    assert asyncio.run(restarted.driver.reconcile()) == {**NOTHING, "orphans": 1}
    assert restarted.cdi.claim_uids_on_disk() == set()
    assert restarted.ledger.held_devices() == set()


def test_a_crash_after_the_spec_of_an_unprepare_is_removed_writes_it_again_or_tears_down(
    tmp_path: Path,
) -> None:
    crash(tmp_path, prepare_first=True)
    restarted = Plugin(tmp_path)
    entry = restarted.ledger.get_claim(UID)
    assert entry is not None and entry.state == "prepared"  # the hold is still on disk
    assert restarted.cdi.claim_uids_on_disk() == set()
    # Still allocated here: the spec comes back, so the pod's containers still start,
    # and the kubelet's retry of the unprepare finishes it.
    assert asyncio.run(restarted.driver.reconcile()) == {**NOTHING, "kept": 1, "regenerated": 1}
    assert restarted.cdi.claim_uids_on_disk() == {UID}
    assert restarted.unprepare() == ""
    assert restarted.cdi.claim_uids_on_disk() == set() and restarted.ledger.claims() == []


def test_a_crash_after_the_spec_of_an_unprepare_tears_down_a_claim_that_is_gone(
    tmp_path: Path,
) -> None:
    crash(tmp_path, prepare_first=True)
    restarted = Plugin(tmp_path, claims=())  # deleted while the plugin was down
    assert asyncio.run(restarted.driver.reconcile()) == {**NOTHING, "torn_down": 1}
    assert restarted.ledger.claims() == [] and restarted.cdi.claim_uids_on_disk() == set()


# ----- the event loop during a ledger write ----------------------------------------------


def test_a_prepare_waits_for_a_ledger_write_in_progress_without_stopping_the_loop(
    tmp_path: Path,
) -> None:
    """A write holds the ledger's lock through its fsyncs; the prepare's ledger read waits
    for it in a worker thread, so the loop (other claims, gRPC, probes) goes on."""
    plugin = Plugin(tmp_path)
    entered, release = threading.Event(), threading.Event()
    released: list[bool] = []

    def write_in_progress() -> None:
        with plugin.ledger.transaction():
            entered.set()
            released.append(release.wait(DEADLINE))

    async def main() -> tuple[bool, PrepareResult]:
        writer = threading.Thread(target=write_in_progress)
        writer.start()
        await asyncio.to_thread(entered.wait, DEADLINE)
        prepare = asyncio.create_task(plugin.driver.prepare_claims([claim_ref(CLAIM)]))
        for _ in range(50):  # the loop keeps turning while the prepare waits
            await asyncio.sleep(0)
        waited = not prepare.done()
        release.set()  # run by the loop: with the loop stopped, the write would never end
        outcome = (await prepare)[UID]
        await asyncio.to_thread(writer.join, DEADLINE)
        return waited, outcome

    waited, outcome = asyncio.run(main())
    assert waited and outcome.error == ""
    assert released == [True]  # released by the loop, not by the deadline
