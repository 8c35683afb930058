"""The node driver's decisions: prepare, unprepare and the start-up reconcile.

Real parts except the apiserver: the ledger, the CDI specs and the claim locks live in
tmp dirs, the setup and teardown hooks are real shell commands that record what they
saw (the ledger file as it is while setup runs, the merged config), and the device-plugin
shim is the real one. Claims are read from :class:`~tests.fakes.apiserver.FakeAPIServer`
at their REST paths, so a deleted, replaced or unreadable claim is one dict operation
away. "Restarting the plugin" builds a new NodeDriver over the same directories, with
the ledger read back from disk.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from dradriver.api.wellknown import CONFLICT_ANNOTATION
from dradriver.deviceplugin.server import DevicePluginError
from dradriver.devices.config import parse_config
from dradriver.devices.model import Device
from dradriver.host.cdi import CDIDevice, CDIRegistry
from dradriver.host.containeredits import ContainerEdits, DeviceNode
from dradriver.host.hooks import Hook
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import ClaimDevice, ClaimEntry
from dradriver.k8s.client import KubeClient
from dradriver.k8s.http import TransportTimeout
from dradriver.k8s.objects import Obj
from dradriver.plugin.interface import ClaimRef, PrepareResult
from kubeletplugin import recovery
from kubeletplugin.inventory import NodeInventory
from kubeletplugin.legacy.shim import DevicePluginShim
from kubeletplugin.nodedriver import NodeDriver, PrepareError
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.claims import (
    DRIVER,
    NODE,
    allocated_claim,
    claim_path,
    claim_ref,
    claim_uid,
    device_config,
    opaque,
    parameters_reference,
    result,
    store_claim,
    with_pins,
)

# Host path /dev/null: prepare refuses device nodes that are not real device nodes.
DEVICES = [
    Device(
        name=f"dev-{i}",
        edits=ContainerEdits(
            device_nodes=(DeviceNode(path=f"/dev/mock{i}", host_path="/dev/null"),)
        ),
    )
    for i in range(3)
]
RESOURCE = "dradriver.dev/mock"

# $1: the records dir, $2: the ledger file. A file fail-<device> in the records dir makes
# setup of that device fail, as a broken device would.
SETUP = r"""
echo "setup $DRADRIVER_CLAIM_UID $DRADRIVER_DEVICE" >> "$1/hooks.log"
cp "$2" "$1/ledger-$DRADRIVER_CLAIM_UID-$DRADRIVER_DEVICE.json"
printf '%s\n' "$DRADRIVER_PROFILE" "$DRADRIVER_SETUP_ARGS" \
    > "$1/config-$DRADRIVER_CLAIM_UID-$DRADRIVER_DEVICE"
if [ -e "$1/fail-$DRADRIVER_DEVICE" ]; then echo "device $DRADRIVER_DEVICE is on fire"; exit 3; fi
"""
TEARDOWN = r"""echo "teardown $DRADRIVER_CLAIM_UID $DRADRIVER_DEVICE" >> "$1/hooks.log" """


class Node:
    """One node's plugin: its state dirs, the apiserver it reads claims from, and hooks."""

    def __init__(self, tmp: Path) -> None:
        self.api = FakeAPIServer()
        self.ledger_path = tmp / "plugin" / "ledger.json"
        self.cdi_dir = tmp / "cdi"
        self.plugin_dir = tmp / "device-plugins"
        self.records = tmp / "hooks"
        self.records.mkdir()
        self.inventory = NodeInventory(NODE, lambda: list(DEVICES))
        self.start()

    def start(self) -> None:
        """Start the plugin (again): a new driver over the same dirs, the ledger from disk."""
        self.ledger = Ledger.load(self.ledger_path)
        self.cdi = CDIRegistry(self.cdi_dir, DRIVER, durable=False)
        args = (str(self.records), str(self.ledger_path))
        self.driver = NodeDriver(
            client=cast(KubeClient, self.api),
            driver_name=DRIVER,
            inventory=self.inventory,
            ledger=self.ledger,
            cdi=self.cdi,
            setup=Hook("setup", command=("sh", "-c", SETUP, "setup", *args)),
            teardown=Hook("teardown", command=("sh", "-c", TEARDOWN, "teardown", *args)),
        )

    def attach_shim(self, mode: str) -> DevicePluginShim:
        """The device-plugin shim serving dev-0 as RESOURCE, sharing the ledger with DRA."""
        config = parse_config(
            f"devicePlugin: {{enabled: true, mode: {mode}, resources: "
            f"[{{resourceName: {RESOURCE}, devices: {{names: [dev-0]}}}}]}}"
        ).device_plugin
        shim = DevicePluginShim(
            config=config,
            driver_name=DRIVER,
            inventory=self.inventory,
            ledger=self.ledger,
            cdi_dir=self.cdi_dir,
            plugin_dir=self.plugin_dir,
        )
        self.driver.gate = shim
        return shim

    def store(self, claim: Obj) -> Obj:
        return store_claim(self.api, claim)

    def prepare(self, *claims: Obj) -> dict[str, PrepareResult]:
        return asyncio.run(self.driver.prepare_claims([claim_ref(c) for c in claims]))

    def prepared(self, claim: Obj) -> PrepareResult:
        """Prepare one claim that must succeed."""
        out = self.prepare(claim)[claim["metadata"]["uid"]]
        assert out.error == "", out.error
        return out

    def error(self, claim: Obj) -> str:
        """Prepare one claim that must fail; its error."""
        out = self.prepare(claim)[claim["metadata"]["uid"]]
        assert out.error and not out.devices
        return out.error

    def unprepare(self, *refs: ClaimRef) -> dict[str, str]:
        return asyncio.run(self.driver.unprepare_claims(list(refs)))

    def reconcile(self) -> dict[str, int]:
        return asyncio.run(self.driver.reconcile())

    def on_disk(self, uid: str) -> ClaimEntry | None:
        """The claim's entry in the ledger file (another process's view)."""
        return Ledger.load(self.ledger_path).get_claim(uid)

    def hook_runs(self) -> list[str]:
        log = self.records / "hooks.log"
        return log.read_text().splitlines() if log.exists() else []

    def ledger_during_setup(self, uid: str, device: str) -> ClaimEntry | None:
        return Ledger.load(self.records / f"ledger-{uid}-{device}.json").get_claim(uid)

    def setup_config(self, uid: str, device: str) -> list[str]:
        """DRADRIVER_PROFILE and DRADRIVER_SETUP_ARGS as the setup hook saw them."""
        return (self.records / f"config-{uid}-{device}").read_text().splitlines()

    def fail_setup(self, device: str) -> None:
        (self.records / f"fail-{device}").touch()

    def spec_files(self) -> list[str]:
        return sorted(p.name for p in self.cdi_dir.iterdir()) if self.cdi_dir.exists() else []


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def uid_of(claim: Obj) -> str:
    return str(claim["metadata"]["uid"])


def cdi_id(uid: str, device: str) -> str:
    return f"{DRIVER}/device={uid}-{device}"


# ----- plan and the config digest ----------------------------------------------------


def test_plan_takes_this_drivers_results_on_this_node(node: Node) -> None:
    claim = node.store(
        allocated_claim(
            "plan",
            [
                result("dev-0", "gpu/small"),
                result("nic-0", "net", driver="other.example.com", pool="elsewhere"),
            ],
        )
    )
    planned = node.driver.plan(claim_ref(claim), claim)
    assert [(p.request, p.pool, p.device) for p in planned] == [("gpu/small", NODE, "dev-0")]
    prepared = node.prepared(claim)
    # The kubelet matches containers' top-level request names, not subrequests.
    assert [d.request_names for d in prepared.devices] == [("gpu",)]


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (
            {**allocated_claim("c", [result("dev-0")]), "status": {}},
            "ResourceClaim default/c is not allocated",
        ),
        (
            allocated_claim("c", [result("x", driver="other.example.com")]),
            f"ResourceClaim default/c has no devices of {DRIVER}",
        ),
        (
            allocated_claim("c", [result("dev-0", pool="node-2")]),
            f"device node-2/dev-0 is not on this node (pool {NODE})",
        ),
        (
            allocated_claim("c", [result("dev-9")]),
            f"device {NODE}/dev-9 is not on this node",
        ),
        (
            allocated_claim("c", [result("dev-0")], config=[opaque(parameters_reference("fast"))]),
            "'fast' is not resolved yet: dradriver-controller pins the parameters",
        ),
    ],
    ids=["unallocated", "other-driver", "other-node", "unknown-device", "unpinned-reference"],
)
def test_plan_refuses_what_this_node_cannot_prepare(node: Node, claim: Obj, message: str) -> None:
    with pytest.raises(PrepareError) as err:
        node.driver.plan(claim_ref(claim), claim)
    assert message in str(err.value)


def test_a_referenced_parameters_object_is_prepared_from_its_pin(node: Node) -> None:
    pin = {"resourceVersion": "7", "config": device_config(env={"MODE": "turbo"})}
    claim = node.store(
        with_pins(
            allocated_claim(
                "ref", [result("dev-0")], config=[opaque(parameters_reference("fast"))]
            ),
            {"fast": pin},
        )
    )
    node.prepared(claim)
    assert node.cdi.resolve(cdi_id(uid_of(claim), "dev-0")).env["MODE"] == "turbo"


def test_the_config_digest_follows_devices_and_config(node: Node) -> None:
    base = allocated_claim("d", [result("dev-0")], config=[opaque(device_config(env={"A": "1"}))])
    other_env = allocated_claim(
        "d", [result("dev-0")], config=[opaque(device_config(env={"A": "2"}))]
    )
    other_device = allocated_claim(
        "d", [result("dev-1")], config=[opaque(device_config(env={"A": "1"}))]
    )
    admin = allocated_claim(
        "d", [result("dev-0", admin_access=True)], config=[opaque(device_config(env={"A": "1"}))]
    )
    ref = claim_ref(base)

    def digest(claim: Obj) -> str:
        return NodeDriver.digest(node.driver.plan(ref, claim))

    assert digest(base) == digest(copy.deepcopy(base))
    assert len({digest(c) for c in (base, other_env, other_device, admin)}) == 4


def test_a_prepared_claim_whose_allocation_changed_is_refused_until_unprepared(
    node: Node,
) -> None:
    claim = node.store(allocated_claim("d", [result("dev-0")]))
    node.prepared(claim)
    spec = node.cdi.spec_path(uid_of(claim)).read_bytes()
    node.store(allocated_claim("d", [result("dev-0")], config=[opaque(device_config(profile="x"))]))
    assert "already prepared with a different allocation or config; unprepare it first" in (
        node.error(claim)
    )
    assert node.cdi.spec_path(uid_of(claim)).read_bytes() == spec
    assert node.hook_runs() == [f"setup {uid_of(claim)} dev-0"]


# ----- prepare -----------------------------------------------------------------------


def test_prepare_records_preparing_then_prepared_and_writes_one_spec(node: Node) -> None:
    claim = node.store(allocated_claim("train", [result("dev-0"), result("dev-1")]))
    uid = uid_of(claim)
    prepared = node.prepared(claim)

    ids = [cdi_id(uid, "dev-0"), cdi_id(uid, "dev-1")]
    assert [(d.request_names, d.pool, d.device, d.cdi_ids) for d in prepared.devices] == [
        (("gpu",), NODE, "dev-0", (ids[0],)),
        (("gpu",), NODE, "dev-1", (ids[1],)),
    ]
    # While setup ran, the hold was already on disk, as "preparing".
    during = node.ledger_during_setup(uid, "dev-0")
    assert during is not None and during.state == "preparing"
    assert [d.device for d in during.devices] == ["dev-0", "dev-1"]
    assert all(d.exclusive for d in during.devices)
    after = node.on_disk(uid)
    assert after is not None and after.state == "prepared"
    assert [d.cdi_ids for d in after.devices] == [[ids[0]], [ids[1]]]
    # One spec file for the claim; device names carry the claim UID.
    assert node.spec_files() == [node.cdi.spec_path(uid).name]
    spec = node.cdi.read_claim(uid)
    assert spec is not None
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-dev-0", f"{uid}-dev-1"]
    edits = node.cdi.resolve(ids[1])
    assert edits.env["DRADRIVER_CLAIM"] == "default/train"
    assert [n.path for n in edits.device_nodes] == ["/dev/mock1"]


def test_repeated_prepare_returns_the_same_devices_without_setting_up_again(node: Node) -> None:
    claim = node.store(allocated_claim("again", [result("dev-0")]))
    first = node.prepared(claim)
    node.cdi.spec_path(uid_of(claim)).unlink()  # e.g. /var/run/cdi emptied meanwhile
    assert node.prepared(claim) == first
    assert node.cdi.read_claim(uid_of(claim)) is not None
    node.start()  # a plugin restart does not change the answer either
    assert node.prepared(claim) == first
    assert node.hook_runs() == [f"setup {uid_of(claim)} dev-0"]


def test_a_claim_shared_by_two_pods_is_prepared_once(node: Node) -> None:
    claim = node.store(allocated_claim("shared", [result("dev-0")]))
    ref = claim_ref(claim)

    async def two_pods() -> tuple[dict[str, PrepareResult], dict[str, PrepareResult]]:
        # The kubelet prepares each pod's claims in its own call, concurrently.
        return await asyncio.gather(
            node.driver.prepare_claims([ref]), node.driver.prepare_claims([ref])
        )

    first, second = asyncio.run(two_pods())
    assert first[ref.uid].error == "" and first[ref.uid] == second[ref.uid]
    assert node.hook_runs() == [f"setup {ref.uid} dev-0"]


def test_opaque_config_merges_class_then_claim(node: Node) -> None:
    claim = node.store(
        allocated_claim(
            "cfg",
            [result("dev-0", "gpu"), result("dev-1", "nic")],
            config=[
                # Listed first, applied last: claim config overrides class config.
                opaque(device_config(env={"MODE": "claim"}, profile="fast")),
                opaque(
                    device_config(env={"MODE": "class", "FROM_CLASS": "1"}, setupArgs=["--cls"]),
                    source="FromClass",
                ),
                opaque(device_config(env={"GPU_ONLY": "1"}), requests=["gpu"]),
                opaque({"not": "ours"}, driver="other.example.com"),
            ],
        )
    )
    uid = uid_of(claim)
    node.prepared(claim)
    gpu = node.cdi.resolve(cdi_id(uid, "dev-0")).env
    nic = node.cdi.resolve(cdi_id(uid, "dev-1")).env
    assert (gpu["MODE"], gpu["FROM_CLASS"], gpu["GPU_ONLY"]) == ("claim", "1", "1")
    assert (nic["MODE"], nic["FROM_CLASS"]) == ("claim", "1") and "GPU_ONLY" not in nic
    assert node.setup_config(uid, "dev-1") == ["fast", '["--cls"]']


def test_a_bad_config_value_fails_only_that_claim_and_names_the_field(node: Node) -> None:
    good = node.store(allocated_claim("good", [result("dev-0")]))
    bad = node.store(
        allocated_claim("bad", [result("dev-1")], config=[opaque(device_config(env={"1BAD": "x"}))])
    )
    results = node.prepare(good, bad)
    assert results[uid_of(good)].error == ""
    error = results[uid_of(bad)].error
    assert error.startswith("ResourceClaim default/bad: invalid opaque config: ")
    assert "config[0] (FromClaim): field env: " in error and "'1BAD'" in error
    assert node.on_disk(uid_of(bad)) is None
    assert node.spec_files() == [node.cdi.spec_path(uid_of(good)).name]
    assert node.hook_runs() == [f"setup {uid_of(good)} dev-0"]


def test_a_failing_setup_hook_rolls_everything_back(node: Node) -> None:
    node.fail_setup("dev-1")
    claim = node.store(allocated_claim("broken", [result("dev-0"), result("dev-1")]))
    uid = uid_of(claim)
    assert "setup hook sh exited 3: device dev-1 is on fire" in node.error(claim)
    assert node.on_disk(uid) is None and node.ledger.held_devices() == set()
    assert node.spec_files() == []
    assert node.hook_runs() == [
        f"setup {uid} dev-0",
        f"setup {uid} dev-1",
        f"teardown {uid} dev-0",
        f"teardown {uid} dev-1",
    ]
    # Nothing is left holding dev-0: another claim gets it.
    node.prepared(node.store(allocated_claim("next", [result("dev-0")])))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (device_config(env={"A": "x\x00y"}), "env['A'] contains a NUL character"),
        # The model refuses it first: a profile must be a DNS label.
        (device_config(profile="a\x00b"), "profile 'a\\x00b' is not a DNS label"),
        (device_config(env={"A": "x\ud800"}), "env['A'] is not valid UTF-8"),
        (device_config(setupArgs=["\udc80"]), "setupArgs[0] is not valid UTF-8"),
        (
            device_config(env={"A": "x" * (128 * 1024)}),
            "bytes; at most 65536 are passed to hooks",
        ),
    ],
    ids=["nul-env", "nul-profile", "surrogate-env", "surrogate-args", "128KiB"],
)
def test_a_config_no_hook_or_container_can_take_fails_that_claim_and_holds_nothing(
    node: Node, config: Obj, message: str
) -> None:
    claim = node.store(allocated_claim("bad", [result("dev-0")], config=[opaque(config)]))
    error = node.error(claim)
    assert error.startswith("ResourceClaim default/bad: invalid opaque config")
    assert message in error and "internal error" not in error
    assert node.on_disk(uid_of(claim)) is None and node.ledger.held_devices() == set()
    assert node.spec_files() == [] and node.hook_runs() == []


def test_an_unexpected_failure_after_the_hold_is_recorded_rolls_back(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(node.ledger, "complete_prepare", broken)
    claim = node.store(allocated_claim("unlucky", [result("dev-0")]))
    assert node.error(claim) == "internal error: a bug"
    assert node.on_disk(uid_of(claim)) is None and node.ledger.held_devices() == set()
    assert node.spec_files() == []
    assert node.hook_runs() == [f"setup {uid_of(claim)} dev-0", f"teardown {uid_of(claim)} dev-0"]


def test_a_claim_with_an_invalid_uid_fails_alone(node: Node) -> None:
    good = node.store(allocated_claim("good", [result("dev-0")]))
    bad = ClaimRef("default", uid_of(good) + "\n", "good")  # a trailing newline
    results = asyncio.run(node.driver.prepare_claims([claim_ref(good), bad]))
    assert results[uid_of(good)].error == ""
    assert "is not a valid UID" in results[bad.uid].error
    assert "is not a valid UID" in node.unprepare(bad)[bad.uid]
    assert node.on_disk(uid_of(good)) is not None


def test_claims_that_come_and_go_leave_nothing_in_the_lock_dir(node: Node) -> None:
    unknown = [ClaimRef("default", claim_uid("default", f"u{i}"), f"u{i}") for i in range(300)]
    results = asyncio.run(node.driver.prepare_claims(unknown))
    assert all("does not exist" in r.error for r in results.values())
    assert node.unprepare(*unknown) == {c.uid: "" for c in unknown}
    claim = node.store(allocated_claim("real", [result("dev-0")]))
    node.prepared(claim)
    node.unprepare(claim_ref(claim))
    locks = node.ledger_path.parent / "claim-locks"
    assert [(p.name, p.stat().st_size) for p in locks.iterdir()] == [("claims.lock", 0)]
    assert node.driver.claim_locks.claims_in_use == 0


def test_an_exclusive_device_held_by_another_claim_is_refused_naming_the_holder(
    node: Node,
) -> None:
    first = node.store(allocated_claim("first", [result("dev-0")]))
    second = node.store(allocated_claim("second", [result("dev-0")], namespace="team-b"))
    node.prepared(first)
    error = node.error(second)
    assert f"device {NODE}/dev-0 is held by claim default/first (uid {uid_of(first)}" in error
    assert node.on_disk(uid_of(second)) is None
    assert node.spec_files() == [node.cdi.spec_path(uid_of(first)).name]
    assert node.hook_runs() == [f"setup {uid_of(first)} dev-0"]


def test_a_device_the_device_plugin_shim_holds_is_refused_naming_the_holder(
    node: Node,
) -> None:
    shim = node.attach_shim("shared")
    allocation = shim.allocate(RESOURCE, ["dev-0"])
    holder = allocation.annotations[f"{DRIVER}/allocation"]
    claim = node.store(allocated_claim("late", [result("dev-0")]))
    error = node.error(claim)
    assert f"device {NODE}/dev-0 is in use through the device plugin ({RESOURCE})" in error
    assert holder in error
    assert node.on_disk(uid_of(claim)) is None
    assert [h.pod_uid for h in node.ledger.plugin_holds()] == [holder]
    assert node.hook_runs() == []


def test_a_device_partitioned_to_the_device_plugin_is_refused(node: Node) -> None:
    node.attach_shim("partitioned")
    claim = node.store(allocated_claim("late", [result("dev-0")]))
    error = node.error(claim)
    assert f"device {NODE}/dev-0 is served through the device plugin as {RESOURCE}" in error
    assert node.on_disk(uid_of(claim)) is None and node.hook_runs() == []


def test_admin_access_never_takes_the_device(node: Node) -> None:
    monitor = node.store(allocated_claim("monitor", [result("dev-0", admin_access=True)]))
    user = node.store(allocated_claim("user", [result("dev-0")]))
    monitor_2 = node.store(allocated_claim("monitor-2", [result("dev-0", admin_access=True)]))
    node.prepared(monitor)
    entry = node.on_disk(uid_of(monitor))
    assert entry is not None
    assert [(d.admin_access, d.exclusive) for d in entry.devices] == [(True, False)]
    assert node.ledger.held_devices() == set()
    node.prepared(user)  # the admin use does not keep the device from its user
    node.prepared(monitor_2)  # nor does the user keep admin access out
    assert node.ledger.held_devices() == {(NODE, "dev-0")}


def test_a_claim_held_after_an_allocation_conflict_is_refused(node: Node) -> None:
    claim = node.store(
        allocated_claim(
            "late",
            [result("dev-0")],
            annotations={CONFLICT_ANNOTATION: "dev-0 is also allocated to default/early"},
        )
    )
    error = node.error(claim)
    assert "held by dradriver-controller after an allocation conflict" in error
    assert "(dev-0 is also allocated to default/early)" in error
    assert node.on_disk(uid_of(claim)) is None and node.spec_files() == []
    assert node.hook_runs() == []


# ----- unprepare ---------------------------------------------------------------------


def test_unprepare_tears_down_and_frees_the_device(node: Node) -> None:
    claim = node.store(allocated_claim("done", [result("dev-0")]))
    node.prepared(claim)
    assert node.unprepare(claim_ref(claim)) == {uid_of(claim): ""}
    assert node.hook_runs() == [f"setup {uid_of(claim)} dev-0", f"teardown {uid_of(claim)} dev-0"]
    assert node.on_disk(uid_of(claim)) is None and node.spec_files() == []
    node.prepared(node.store(allocated_claim("next", [result("dev-0")])))


def test_unprepare_of_an_unknown_claim_succeeds(node: Node) -> None:
    never = ClaimRef("default", claim_uid("default", "never"), "never")
    assert node.unprepare(never) == {never.uid: ""}
    # A spec the ledger does not know (it was lost) goes with the claim's unprepare.
    forgotten = ClaimRef("default", claim_uid("default", "forgotten"), "forgotten")
    node.cdi.write_claim(forgotten.uid, [CDIDevice("dev-0", ContainerEdits(env={"A": "1"}))])
    assert node.unprepare(forgotten) == {forgotten.uid: ""}
    assert node.spec_files() == [] and node.hook_runs() == []


# ----- start-up reconcile ------------------------------------------------------------

NOTHING = {
    "kept": 0,
    "regenerated": 0,
    "adopted": 0,
    "torn_down": 0,
    "orphans": 0,
    "unconfirmed": 0,
}


def test_reconcile_keeps_claims_still_allocated_here(node: Node) -> None:
    claim = node.store(allocated_claim("keep", [result("dev-0")]))
    node.prepared(claim)
    spec = node.cdi.spec_path(uid_of(claim)).read_bytes()
    node.start()
    assert node.reconcile() == {**NOTHING, "kept": 1}
    assert node.cdi.spec_path(uid_of(claim)).read_bytes() == spec
    entry = node.on_disk(uid_of(claim))
    assert entry is not None and entry.state == "prepared"
    assert node.hook_runs() == [f"setup {uid_of(claim)} dev-0"]


def test_reconcile_rolls_back_a_half_done_prepare(node: Node) -> None:
    claim = node.store(allocated_claim("half", [result("dev-0")]))
    uid = uid_of(claim)
    # What a crash during setup leaves: the claim recorded as preparing (maybe a spec).
    digest = NodeDriver.digest(node.driver.plan(claim_ref(claim), claim))
    device = ClaimDevice(pool=NODE, device="dev-0", request_names=["gpu"])
    node.ledger.begin_prepare(uid, "default", "half", [device], digest)
    node.cdi.write_claim(uid, [CDIDevice("dev-0", ContainerEdits(env={"A": "1"}))])
    node.start()
    assert node.reconcile() == {**NOTHING, "torn_down": 1}
    assert node.hook_runs() == [f"teardown {uid} dev-0"]
    assert node.on_disk(uid) is None and node.spec_files() == []
    node.prepared(claim)  # the kubelet's retry starts over
    assert node.hook_runs()[-1] == f"setup {uid} dev-0"


def test_reconcile_finishes_a_half_done_unprepare(node: Node) -> None:
    claim = node.store(allocated_claim("going", [result("dev-0")]))
    uid = uid_of(claim)
    node.prepared(claim)
    node.ledger.begin_unprepare(uid)  # what a crash during teardown leaves
    node.start()
    assert node.reconcile() == {**NOTHING, "torn_down": 1}
    assert node.hook_runs() == [f"setup {uid} dev-0", f"teardown {uid} dev-0"]
    assert node.on_disk(uid) is None and node.spec_files() == []


def _deleted(node: Node, claim: Obj) -> None:
    del node.api.objects[claim_path("default", claim["metadata"]["name"])]


def _replaced(node: Node, claim: Obj) -> None:
    # Same name, new object: the kubelet's UID no longer matches.
    name = claim["metadata"]["name"]
    node.store(allocated_claim(name, [result("dev-0")], uid=claim_uid("default", name, 1)))


def _moved(node: Node, claim: Obj) -> None:
    # Deallocated and allocated again, on another node: same UID, other pool.
    node.store(allocated_claim(claim["metadata"]["name"], [result("dev-0", pool="node-2")]))


def _reconfigured(node: Node, claim: Obj) -> None:
    # Allocated again with other config: what was set up is not what the claim asks for.
    name = claim["metadata"]["name"]
    node.store(
        allocated_claim(name, [result("dev-0")], config=[opaque(device_config(profile="p"))])
    )


@pytest.mark.parametrize("change", [_deleted, _replaced, _moved, _reconfigured])
def test_reconcile_tears_down_claims_no_longer_allocated_here(
    node: Node, change: Callable[[Node, Obj], None]
) -> None:
    claim = node.store(allocated_claim("gone", [result("dev-0")]))
    uid = uid_of(claim)
    node.prepared(claim)
    change(node, claim)
    node.start()
    assert node.reconcile() == {**NOTHING, "torn_down": 1}
    assert node.hook_runs() == [f"setup {uid} dev-0", f"teardown {uid} dev-0"]
    assert node.on_disk(uid) is None and node.spec_files() == []


def _timing_out(node: Node) -> None:
    # A read that times out cannot be had from the in-memory fake: raise what the client's
    # transport raises.
    async def get_or_none(path: str) -> Obj | None:
        raise TransportTimeout(f"GET {path}: no answer within the read timeout")

    node.api.get_or_none = get_or_none  # type: ignore[method-assign]


def _failing(status: int) -> Callable[[Node], None]:
    def fail(node: Node) -> None:
        node.api.fail("GET", claim_path("default", "unknown"), status)

    return fail


@pytest.mark.parametrize(
    "outage",
    [_failing(403), _failing(429), _failing(500), _failing(503), _timing_out],
    ids=["403", "429", "500", "503", "timeout"],
)
def test_reconcile_keeps_a_claim_it_cannot_read_because_the_apiserver_fails(
    node: Node, outage: Callable[[Node], None]
) -> None:
    claim = node.store(allocated_claim("unknown", [result("dev-0")]))
    node.prepared(claim)
    spec = node.cdi.spec_path(uid_of(claim)).read_bytes()
    outage(node)
    node.start()
    assert node.reconcile() == {**NOTHING, "unconfirmed": 1}
    assert node.on_disk(uid_of(claim)) is not None
    assert node.cdi.spec_path(uid_of(claim)).read_bytes() == spec
    assert node.driver.unconfirmed == {uid_of(claim)}
    assert node.hook_runs() == [f"setup {uid_of(claim)} dev-0"]


def test_an_unconfirmed_claim_is_checked_again_and_torn_down_once_it_is_gone(node: Node) -> None:
    kept = node.store(allocated_claim("kept", [result("dev-1")]))
    gone = node.store(allocated_claim("gone", [result("dev-0")]))
    node.prepared(kept)
    node.prepared(gone)
    node.api.fail("GET", claim_path("default", ""), 503)
    node.start()
    assert node.reconcile() == {**NOTHING, "unconfirmed": 2}
    assert asyncio.run(node.driver.confirm_unconfirmed()) == 2  # still failing: kept
    node.api.clear_faults()
    _deleted(node, gone)
    asyncio.run(node.driver.confirm_claims_later(first=0))  # returns once all are settled
    assert node.driver.unconfirmed == set()
    assert node.on_disk(uid_of(gone)) is None and node.on_disk(uid_of(kept)) is not None
    assert node.hook_runs()[-1] == f"teardown {uid_of(gone)} dev-0"


def test_the_start_does_not_wait_for_an_apiserver_that_never_answers(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim = node.store(allocated_claim("slow", [result("dev-0")]))
    node.prepared(claim)

    async def get_or_none(path: str) -> Obj | None:
        await asyncio.Event().wait()  # never answers
        raise AssertionError("unreachable")

    node.api.get_or_none = get_or_none  # type: ignore[method-assign]
    monkeypatch.setattr(recovery, "START_READ_BUDGET_SECONDS", 0.01)
    node.start()
    assert node.reconcile() == {**NOTHING, "unconfirmed": 1}
    assert node.on_disk(uid_of(claim)) is not None


def test_reconcile_writes_a_missing_spec_again(node: Node) -> None:
    claim = node.store(allocated_claim("reboot", [result("dev-0"), result("dev-1")]))
    uid = uid_of(claim)
    node.prepared(claim)
    spec = node.cdi.spec_path(uid).read_bytes()
    node.cdi.spec_path(uid).unlink()  # /var/run/cdi is a tmpfs: a reboot empties it
    node.start()
    assert node.reconcile() == {**NOTHING, "kept": 1, "regenerated": 1}
    assert node.cdi.spec_path(uid).read_bytes() == spec
    assert node.hook_runs() == [f"setup {uid} dev-0", f"setup {uid} dev-1"]


def test_reconcile_deletes_orphan_specs_and_leaves_other_kinds_alone(node: Node) -> None:
    kept = node.store(allocated_claim("kept", [result("dev-0")]))
    node.prepared(kept)
    orphan = claim_uid("default", "orphan")
    node.cdi.write_claim(orphan, [CDIDevice("dev-1", ContainerEdits(env={"A": "1"}))])
    plugin_kind = CDIRegistry(node.cdi_dir, DRIVER, "deviceplugin", durable=False)
    plugin_kind.write_claim("alloc-1", [CDIDevice("dev-2", ContainerEdits(env={"A": "1"}))])
    node.start()
    assert node.reconcile() == {**NOTHING, "kept": 1, "orphans": 1}
    assert node.spec_files() == sorted(
        [node.cdi.spec_path(uid_of(kept)).name, plugin_kind.spec_path("alloc-1").name]
    )


def flip_a_bit(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


def test_a_corrupt_ledger_is_rebuilt_before_the_shim_can_hand_the_device_out(node: Node) -> None:
    node.attach_shim("shared")
    claim = node.store(allocated_claim("in-use", [result("dev-0")]))
    node.prepared(claim)
    flip_a_bit(node.ledger_path)
    node.start()
    shim = node.attach_shim("shared")
    assert node.ledger.recovered_from_corruption is not None
    assert node.reconcile() == {**NOTHING, "adopted": 1}
    entry = node.on_disk(uid_of(claim))
    assert entry is not None and entry.state == "prepared" and not entry.recovered
    shim.refresh()
    listed = {d.id: d.healthy for d in shim.manager.endpoint(RESOURCE).service.devices}
    assert listed == {"dev-0": False}  # what ListAndWatch sends: not allocatable
    with pytest.raises(DevicePluginError, match="held by claim default/in-use"):
        shim.allocate(RESOURCE, ["dev-0"])
    assert node.spec_files() == [node.cdi.spec_path(uid_of(claim)).name]
    assert node.hook_runs() == [f"setup {uid_of(claim)} dev-0"]  # no setup or teardown again


def _removed(path: Path) -> None:
    path.unlink()


def _dangling_symlink(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.with_name("nowhere.json"))


@pytest.mark.parametrize("lose", [_removed, _dangling_symlink])
def test_a_lost_ledger_keeps_the_specs_of_claims_in_use_and_their_holds(
    node: Node, lose: Callable[[Path], None]
) -> None:
    claim = node.store(allocated_claim("in-use", [result("dev-0")]))
    node.prepared(claim)
    spec = node.cdi.spec_path(uid_of(claim)).read_bytes()
    lose(node.ledger_path)
    node.start()
    assert node.ledger.needs_rebuild
    assert node.reconcile() == {**NOTHING, "adopted": 1}
    assert node.cdi.spec_path(uid_of(claim)).read_bytes() == spec
    other = node.store(allocated_claim("other", [result("dev-0")], namespace="team-b"))
    assert f"device {NODE}/dev-0 is held by claim default/in-use" in node.error(other)
    # The adopted claim is prepared already: the kubelet's next call does no setup.
    node.prepared(claim)
    assert node.hook_runs() == [f"setup {uid_of(claim)} dev-0"]


def test_a_lost_ledger_holds_what_a_spec_names_until_the_apiserver_answers(node: Node) -> None:
    claim = node.store(allocated_claim("in-use", [result("dev-0")]))
    # Consumable capacity: two shares of dev-1 in one claim, CDI names dev-1-<share>.
    capacity = node.store(
        allocated_claim(
            "cap", [result("dev-1", share_id="a1b2"), result("dev-1", "nic", share_id="c3d4")]
        )
    )
    node.prepared(claim)
    node.prepared(capacity)
    setups = node.hook_runs()
    node.ledger_path.unlink()
    node.api.fail("GET", claim_path("default", ""), 503)
    node.start()
    assert node.reconcile() == {**NOTHING, "unconfirmed": 2}
    held = node.on_disk(uid_of(claim))
    assert held is not None and held.recovered
    assert [(d.device, d.share_id, d.exclusive) for d in held.devices] == [("dev-0", None, True)]
    shares = node.on_disk(uid_of(capacity))
    assert shares is not None
    assert sorted((d.device, d.share_id, d.exclusive) for d in shares.devices) == [
        ("dev-1", "a1b2", False),
        ("dev-1", "c3d4", False),
    ]
    assert node.driver.unconfirmed == {uid_of(claim), uid_of(capacity)}
    node.api.clear_faults()
    assert asyncio.run(node.driver.confirm_unconfirmed()) == 0
    confirmed = node.on_disk(uid_of(claim))
    assert confirmed is not None and not confirmed.recovered
    assert confirmed.config_digest == NodeDriver.digest(node.driver.plan(claim_ref(claim), claim))
    assert len(node.spec_files()) == 2
    assert node.hook_runs() == setups  # adopted, not set up again


@pytest.mark.parametrize("lose", [flip_a_bit, _removed])
def test_a_lost_ledger_gets_device_plugin_holds_back_from_their_specs(
    node: Node, lose: Callable[[Path], None]
) -> None:
    shim = node.attach_shim("shared")
    holder = shim.allocate(RESOURCE, ["dev-0"]).annotations[f"{DRIVER}/allocation"]
    lose(node.ledger_path)
    node.start()
    shim = node.attach_shim("shared")
    node.reconcile()
    assert shim.reconcile_cdi() == {"holds": 0, "regenerated": 0, "rebuilt": 1, "orphans": 0}
    assert [(h.pod_uid, h.resource) for h in node.ledger.plugin_holds()] == [(holder, RESOURCE)]
    claim = node.store(allocated_claim("late", [result("dev-0")]))
    error = node.error(claim)
    assert f"device {NODE}/dev-0 is in use through the device plugin ({RESOURCE})" in error
    assert holder in error


def test_a_lost_ledger_deletes_only_specs_of_claims_that_are_gone(node: Node) -> None:
    gone = node.store(allocated_claim("gone", [result("dev-0")]))
    moved = node.store(allocated_claim("moved", [result("dev-1")]))
    node.prepared(gone)
    node.prepared(moved)
    node.ledger_path.unlink()
    _deleted(node, gone)
    _moved(node, moved)
    node.start()
    assert node.reconcile() == {**NOTHING, "orphans": 2}
    assert node.spec_files() == [] and node.ledger.claims() == []


def test_a_fresh_node_starts_with_nothing_to_rebuild(node: Node) -> None:
    assert node.ledger.needs_rebuild and node.ledger.rebuild_reason == "missing"
    assert node.reconcile() == NOTHING
    node.prepared(node.store(allocated_claim("first", [result("dev-0")])))
