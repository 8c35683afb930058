"""The claim store: one transaction per prepare and per unprepare, one rollback, one hook env."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dradriver.host.cdi import CDIDevice, CDIRegistry
from dradriver.host.containeredits import ContainerEdits
from dradriver.host.hooks import Hook
from dradriver.host.state.claimstore import (
    ClaimPlan,
    ClaimStore,
    DevicePlan,
    SideFiles,
    hook_env,
    setup_env,
)
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import ClaimDevice, ClaimMismatchError, DeviceBusy

pytestmark = pytest.mark.unit

DRIVER = "test.dradriver.dev"
# Records every hook's environment, one JSON object a line; fails for device "bad".
RECORD = (
    'python3 -c "import json, os, sys; '
    "env = {k: v for k, v in os.environ.items() if k.startswith('DRADRIVER_')}; "
    "open(sys.argv[1], 'a').write(json.dumps([sys.argv[2], env]) + '\\n'); "
    "sys.exit(3 if sys.argv[2] == 'setup' and env['DRADRIVER_DEVICE'] == 'bad' else 0)\""
)


def plan(uid: str, *devices: str, digest: str = "d1", side: SideFiles | None = None) -> ClaimPlan:
    return ClaimPlan(
        uid=uid,
        namespace="ns",
        name=f"claim-{uid}",
        devices=tuple(
            DevicePlan(
                use=ClaimDevice(pool="node-1", device=d, request_names=["req"]),
                cdi=CDIDevice(d, ContainerEdits(env={"A": "1"})),
                hook_env=setup_env(False, "fast", ["--x"], "{}"),
            )
            for d in devices
        ),
        digest=digest,
        side_files=side,
    )


def store(tmp_path: Path, hooks: bool = False) -> ClaimStore:
    log = tmp_path / "hooks.jsonl"

    def hook(name: str) -> Hook:
        return Hook(name, command=("sh", "-c", f"{RECORD} {log} {name}"))

    return ClaimStore(
        driver_name=DRIVER,
        ledger=Ledger.load(tmp_path / "ledger.json"),
        cdi=CDIRegistry(tmp_path / "cdi", DRIVER, durable=False),
        setup=hook("setup") if hooks else None,
        teardown=hook("teardown") if hooks else None,
    )


def hook_runs(tmp_path: Path) -> list[tuple[str, dict[str, str]]]:
    path = tmp_path / "hooks.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(run[0], run[1]) for run in map(json.loads, lines)]


def test_without_hooks_a_prepare_is_one_write_with_spec_entry_and_side_files(
    tmp_path: Path,
) -> None:
    s = store(tmp_path)
    written: list[str] = []

    def write() -> bool:
        written.append("meta")
        return True

    side = SideFiles(write, lambda: written.append("gone"))
    done = asyncio.run(s.prepare(plan("u1", "dev-0", side=side)))
    assert done.fresh and done.side_files and written == ["meta"]
    assert done.ids == {"dev-0": s.cdi.cdi_id("u1", "dev-0")}
    assert s.commits.writes == 1
    entry = Ledger.load(tmp_path / "ledger.json").get_claim("u1")
    assert entry is not None and entry.state == "prepared"
    assert entry.devices[0].cdi_ids == [done.ids["dev-0"]]
    assert s.cdi.read_claim("u1") is not None


def test_a_repeat_writes_the_spec_again_and_is_not_fresh(tmp_path: Path) -> None:
    s = store(tmp_path)
    asyncio.run(s.prepare(plan("u1", "dev-0")))
    s.cdi.remove_claim("u1")
    again = asyncio.run(s.prepare(plan("u1", "dev-0")))
    assert not again.fresh and s.cdi.read_claim("u1") is not None
    with pytest.raises(ClaimMismatchError, match="already prepared with a different"):
        asyncio.run(s.prepare(plan("u1", "dev-0", digest="d2")))


def test_a_refused_plan_changes_nothing_but_a_repeat_still_succeeds(tmp_path: Path) -> None:
    s = store(tmp_path)
    asyncio.run(s.prepare(plan("u1", "dev-0")))
    refused = RuntimeError("the device plugin has it")
    repeat = ClaimPlan(**{**plan("u1", "dev-0").__dict__, "refused": refused})
    assert not asyncio.run(s.prepare(repeat)).fresh
    other = ClaimPlan(**{**plan("u2", "dev-1").__dict__, "refused": refused})
    with pytest.raises(RuntimeError, match="device plugin"):
        asyncio.run(s.prepare(other))
    assert s.ledger.get_claim("u2") is None and s.cdi.read_claim("u2") is None


def test_a_busy_device_leaves_no_spec_and_no_side_files(tmp_path: Path) -> None:
    s = store(tmp_path)
    asyncio.run(s.prepare(plan("u1", "dev-0")))
    calls: list[str] = []

    def write() -> bool:
        calls.append("write")
        return True

    side = SideFiles(write, lambda: calls.append("remove"))
    with pytest.raises(DeviceBusy):
        asyncio.run(s.prepare(plan("u2", "dev-0", side=side)))
    assert s.cdi.read_claim("u2") is None and calls == []  # refused before they were written


def test_every_hook_gets_the_same_claim_and_device_variables(tmp_path: Path) -> None:
    s = store(tmp_path, hooks=True)
    asyncio.run(s.prepare(plan("u1", "dev-0")))
    asyncio.run(s.unprepare("u1"))
    with pytest.raises(Exception, match="exit"):
        asyncio.run(s.prepare(plan("u2", "bad")))
    runs = hook_runs(tmp_path)
    assert [name for name, _ in runs] == ["setup", "teardown", "setup", "teardown"]
    base = {
        "DRADRIVER_DRIVER": DRIVER,
        "DRADRIVER_CLAIM_NAMESPACE": "ns",
        "DRADRIVER_REQUEST": "req",
        "DRADRIVER_POOL": "node-1",
        "DRADRIVER_SHARE_ID": "",
    }
    for _, env in runs:
        assert base.items() <= env.items()
    setup, teardown, failed, rollback = (env for _, env in runs)
    assert setup["DRADRIVER_PROFILE"] == "fast" and "DRADRIVER_PROFILE" not in teardown
    assert rollback == failed  # the rollback's teardown sees what the setup saw
    assert s.ledger.get_claim("u2") is None and s.cdi.read_claim("u2") is None


def test_a_half_done_claim_is_torn_down_before_it_is_prepared_again(tmp_path: Path) -> None:
    s = store(tmp_path, hooks=True)
    use = ClaimDevice(pool="node-1", device="dev-0", request_names=["req"])
    s.ledger.begin_prepare("u1", "ns", "claim-u1", [use], "d1")  # a crash during setup
    done = asyncio.run(s.prepare(plan("u1", "dev-0")))
    assert done.fresh
    assert [name for name, _ in hook_runs(tmp_path)] == ["teardown", "setup"]
    entry = s.ledger.get_claim("u1")
    assert entry is not None and entry.state == "prepared"


def test_hook_env_is_one_function_for_plans_and_entries(tmp_path: Path) -> None:
    p = plan("u1", "dev-0")
    use = p.devices[0].use
    assert hook_env(DRIVER, p, use, {}) == {
        "DRADRIVER_DRIVER": DRIVER,
        "DRADRIVER_CLAIM_NAMESPACE": "ns",
        "DRADRIVER_CLAIM_NAME": "claim-u1",
        "DRADRIVER_CLAIM_UID": "u1",
        "DRADRIVER_REQUEST": "req",
        "DRADRIVER_POOL": "node-1",
        "DRADRIVER_DEVICE": "dev-0",
        "DRADRIVER_SHARE_ID": "",
    }
