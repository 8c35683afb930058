"""The node ledger: holds survive restarts, corruption is kept aside, devices are never doubled."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dradriver.host.state.codec import checksum
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import (
    ClaimDevice,
    ClaimHolder,
    ClaimMismatchError,
    ClaimStateError,
    DeviceBusy,
    DeviceKey,
    DeviceRef,
    LedgerValueError,
    LedgerVersionError,
    PluginHolder,
    UnknownClaimError,
    UnknownPluginHoldError,
)
from tests.stepcount import python_calls

pytestmark = pytest.mark.unit


def excl(device: str, pool: str = "pool-a", request: str = "req") -> ClaimDevice:
    return ClaimDevice(pool=pool, device=device, request_names=[request])


def shared(device: str, share_id: str, pool: str = "pool-a") -> ClaimDevice:
    return ClaimDevice(pool=pool, device=device, request_names=["req"], share_id=share_id)


def admin(device: str, pool: str = "pool-a") -> ClaimDevice:
    return ClaimDevice(pool=pool, device=device, request_names=["req"], admin_access=True)


def ref(device: str, pool: str = "pool-a") -> DeviceRef:
    return DeviceRef(pool=pool, device=device)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "plugin" / "ledger.json"


@pytest.fixture
def ledger(path: Path) -> Ledger:
    return Ledger.load(path)


@pytest.fixture
def ledger_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Capture dradriver's records even if log.configure() turned propagation off."""
    logger = logging.getLogger("dradriver.ledger")
    logger.addHandler(caplog.handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(old)


def error_fields(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    """Fields of the distinct ERROR records (a record may reach the handler twice)."""
    records = {id(r): r for r in caplog.records if r.levelno == logging.ERROR}
    return [r.__dict__["fields"] for r in records.values()]


def prepared_ledger(path: Path) -> Ledger:
    ledger = Ledger.load(path)
    ledger.begin_prepare("uid-1", "default", "claim-1", [excl("dev-0")], config_digest="abc")
    ledger.complete_prepare("uid-1", {DeviceKey("pool-a", "dev-0"): ["dradriver.dev/device=x"]})
    return ledger


# --- persistence and file format ---------------------------------------------


def test_missing_file_is_an_empty_ledger(path: Path) -> None:
    ledger = Ledger.load(path)
    assert ledger.claims() == [] and ledger.plugin_holds() == []
    assert ledger.recovered_from_corruption is None
    assert not path.exists()


def test_state_survives_reload(path: Path) -> None:
    ledger = prepared_ledger(path)
    ledger.begin_plugin_hold("example.com/dev", "pod-1", "ctr", [ref("dev-9")])

    again = Ledger.load(path)
    assert again.claims() == ledger.claims()
    assert again.plugin_holds() == ledger.plugin_holds()
    entry = again.get_claim("uid-1")
    assert entry is not None
    assert entry.state == "prepared"
    assert entry.config_digest == "abc"
    assert entry.cdi_ids == ["dradriver.dev/device=x"]
    assert again.held_devices() == {("pool-a", "dev-0"), ("pool-a", "dev-9")}


def test_file_format_version_checksum_and_modes(path: Path) -> None:
    old = os.umask(0o000)  # the modes must not depend on the umask
    try:
        prepared_ledger(path)
    finally:
        os.umask(old)
    doc = json.loads(path.read_text())
    assert set(doc) == {"version", "checksum", "data"}
    assert doc["version"] == 2
    # The checksum covers the version too.
    covered = {"version": 2, "data": doc["data"]}
    canonical = json.dumps(covered, sort_keys=True, separators=(",", ":")).encode()
    assert doc["checksum"] == "sha256:" + hashlib.sha256(canonical).hexdigest()
    assert checksum(covered) == doc["checksum"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    # No temp files left; the .lock file is the cross-process lock.
    assert sorted(os.listdir(path.parent)) == ["ledger.json", "ledger.json.lock"]


def test_every_step_is_persisted_before_returning(path: Path) -> None:
    ledger = Ledger.load(path)

    def state_on_disk() -> str | None:
        entry = Ledger.load(path).get_claim("uid-1")
        return entry.state if entry else None

    ledger.begin_prepare("uid-1", "ns", "c", [excl("dev-0")])
    assert state_on_disk() == "preparing"
    ledger.complete_prepare("uid-1")
    assert state_on_disk() == "prepared"
    ledger.begin_unprepare("uid-1")
    assert state_on_disk() == "unpreparing"
    ledger.remove_claim("uid-1")
    assert state_on_disk() is None


# --- corruption and versions ---------------------------------------------------


def corrupt_copies(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.corrupt-*"))


def test_checksum_tamper_keeps_copy_and_starts_empty(
    path: Path, ledger_logs: pytest.LogCaptureFixture
) -> None:
    prepared_ledger(path)
    doc = json.loads(path.read_text())
    doc["data"]["claims"][0]["name"] = "someone-else"
    tampered = json.dumps(doc).encode()
    path.write_bytes(tampered)

    ledger = Ledger.load(path)

    assert ledger.claims() == []
    kept = corrupt_copies(path)
    assert len(kept) == 1
    assert ledger.recovered_from_corruption == kept[0]
    assert kept[0].read_bytes() == tampered
    assert not path.exists()
    errors = error_fields(ledger_logs)
    assert len(errors) == 1
    assert "checksum mismatch" in str(errors[0]["reason"])
    assert errors[0]["kept"] == str(kept[0])
    assert errors[0]["path"] == str(path)


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        pytest.param(lambda raw: raw[: len(raw) // 2], "not valid JSON", id="truncated"),
        pytest.param(lambda raw: b"", "not valid JSON", id="empty"),
        pytest.param(lambda raw: b"\xff\xfe garbage", "not valid JSON", id="binary"),
        pytest.param(lambda raw: b"[1, 2]", "not an object", id="list"),
        pytest.param(lambda raw: b'{"checksum": "x", "data": {}}', "version", id="no-version"),
    ],
)
def test_unreadable_files_are_recovered(
    path: Path,
    ledger_logs: pytest.LogCaptureFixture,
    mangle: object,
    reason: str,
) -> None:
    prepared_ledger(path)
    assert callable(mangle)
    bad: bytes = mangle(path.read_bytes())
    path.write_bytes(bad)

    ledger = Ledger.load(path)

    assert ledger.claims() == []
    assert ledger.recovered_from_corruption is not None
    assert ledger.recovered_from_corruption.read_bytes() == bad
    assert any(reason in str(f["reason"]) for f in error_fields(ledger_logs))


def write_with_valid_checksum(path: Path, data: object) -> None:
    path.write_text(json.dumps({"version": 1, "checksum": checksum(data), "data": data}))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("state", "bogus"),
        ("updated", "yesterday"),
        ("namespace", ""),
        ("surprise", 1),
    ],
)
def test_schema_violation_with_valid_checksum_is_corrupt(
    path: Path, ledger_logs: pytest.LogCaptureFixture, field: str, value: object
) -> None:
    prepared_ledger(path)
    data = json.loads(path.read_text())["data"]
    data["claims"][0][field] = value
    write_with_valid_checksum(path, data)

    ledger = Ledger.load(path)

    assert ledger.claims() == []
    assert ledger.recovered_from_corruption is not None
    assert any("schema violation" in str(f["reason"]) for f in error_fields(ledger_logs))


def test_strict_types_on_load(path: Path) -> None:
    prepared_ledger(path)
    data = json.loads(path.read_text())["data"]
    data["claims"][0]["devices"][0]["exclusive"] = "true"  # lax mode would accept this
    write_with_valid_checksum(path, data)
    assert Ledger.load(path).recovered_from_corruption is not None


def test_second_corruption_keeps_both_copies(path: Path) -> None:
    for _ in range(2):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{")
        assert Ledger.load(path).recovered_from_corruption is not None
    assert len(corrupt_copies(path)) == 2


def test_future_version_is_refused_and_file_untouched(path: Path) -> None:
    path.parent.mkdir(parents=True)
    data: dict[str, list[str]] = {"new": []}
    # Every version keeps the envelope: the checksum covers version and data.
    doc = {"version": 3, "checksum": checksum({"version": 3, "data": data}), "data": data}
    raw = json.dumps(doc).encode()
    path.write_bytes(raw)
    before = path.stat()

    with pytest.raises(LedgerVersionError) as info:
        Ledger.load(path)

    message = str(info.value)
    assert "version 3" in message and "version 2" in message
    assert "newer dradriver" in message and "move the file away" in message
    assert (info.value.found, info.value.supported) == (3, 2)
    assert path.read_bytes() == raw
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    assert corrupt_copies(path) == []


def test_a_version_1_file_is_read_and_rewritten_as_version_2(path: Path) -> None:
    prepared_ledger(path)
    data = json.loads(path.read_text())["data"]
    for claim in data["claims"]:
        del claim["recovered"]  # version 1 had no such field
    # Exactly what dradriver wrote before version 2: the checksum covers data alone.
    path.write_text(json.dumps({"version": 1, "checksum": checksum(data), "data": data}))

    ledger = Ledger.load(path)

    assert not ledger.needs_rebuild
    entry = ledger.get_claim("uid-1")
    assert entry is not None and entry.state == "prepared" and entry.cdi_ids
    ledger.begin_unprepare("uid-1")
    assert json.loads(path.read_text())["version"] == 2


@pytest.mark.parametrize("version", [1, 3, 12])
def test_a_flipped_version_is_corruption_not_a_newer_format(path: Path, version: int) -> None:
    prepared_ledger(path)
    doc = json.loads(path.read_text())
    doc["version"] = version
    path.write_text(json.dumps(doc))

    ledger = Ledger.load(path)  # no LedgerVersionError: the checksum covers the version

    assert ledger.needs_rebuild and ledger.claims() == []
    assert len(corrupt_copies(path)) == 1


def _deep_json(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000)


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)  # no writer: a blocking read would wait forever


def _symlink_loop(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.name)


def _dangling_symlink(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.with_name("gone.json"))


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_deep_json, "nested too deeply"),
        (_directory, "is a directory"),
        (_fifo, "is a FIFO"),
        (_symlink_loop, "cannot be opened"),
        (_dangling_symlink, "a symlink to a file that does not exist"),
    ],
    ids=["deep-json", "directory", "fifo", "symlink-loop", "dangling-symlink"],
)
def test_whatever_is_at_the_path_is_kept_aside_never_a_crash(
    path: Path, ledger_logs: pytest.LogCaptureFixture, make: object, reason: str
) -> None:
    prepared_ledger(path)
    assert callable(make)
    make(path)

    ledger = Ledger.load(path)

    assert ledger.needs_rebuild and ledger.claims() == []
    assert ledger.recovered_from_corruption is not None
    assert os.path.lexists(ledger.recovered_from_corruption)
    assert not os.path.lexists(path)
    assert any(reason in str(f["reason"]) for f in error_fields(ledger_logs))
    ledger.begin_prepare("uid-2", "ns", "c", [excl("dev-0")])  # and it works from there
    assert Ledger.load(path).get_claim("uid-2") is not None


def test_a_missing_file_needs_a_rebuild(path: Path) -> None:
    assert Ledger.load(path).rebuild_reason == "missing"
    prepared_ledger(path)
    assert not Ledger.load(path).needs_rebuild


def test_a_file_deleted_under_a_running_plugin_is_written_again(path: Path) -> None:
    ledger = prepared_ledger(path)
    path.unlink()
    assert ledger.held_devices() == {("pool-a", "dev-0")}  # not forgotten
    assert Ledger.load(path).get_claim("uid-1") is not None


def test_a_transaction_costs_linear_steps_in_the_claims_it_changes(tmp_path: Path) -> None:
    def prepare_many(n: int) -> Callable[[], None]:
        ledger = Ledger(tmp_path / f"ledger-{n}.json")

        def work() -> None:
            with ledger.transaction():
                for i in range(n):
                    ledger.begin_prepare(f"u{i}", "ns", f"c{i}", [excl(f"d{i}")])
            with ledger.transaction():
                for i in range(n):
                    ledger.complete_prepare(f"u{i}")

        return work

    small, large = python_calls(prepare_many(400)), python_calls(prepare_many(1600))
    # Linear: 4x the claims, ~4x the steps (quadratic would be ~16x).
    assert large < 6 * small, (small, large)


# --- claims --------------------------------------------------------------------


def test_two_phase_states(ledger: Ledger) -> None:
    entry = ledger.begin_prepare("uid-1", "ns", "c", [excl("dev-0")])
    assert entry.state == "preparing"
    assert entry.devices[0].cdi_ids == []
    done = ledger.complete_prepare("uid-1", {DeviceKey("pool-a", "dev-0"): ["v/c=a", "v/c=b"]})
    assert done.state == "prepared"
    assert done.cdi_ids == ["v/c=a", "v/c=b"]
    leaving = ledger.begin_unprepare("uid-1")
    assert leaving is not None and leaving.state == "unpreparing"
    # Still held while teardown runs.
    assert ledger.held_devices() == {("pool-a", "dev-0")}
    with pytest.raises(ClaimStateError):
        ledger.complete_prepare("uid-1")
    ledger.remove_claim("uid-1")
    assert ledger.get_claim("uid-1") is None
    assert ledger.held_devices() == set()


def test_unknown_claim_operations(ledger: Ledger) -> None:
    with pytest.raises(UnknownClaimError, match="uid-x"):
        ledger.complete_prepare("uid-x")
    assert ledger.begin_unprepare("uid-x") is None
    ledger.remove_claim("uid-x")


def test_complete_prepare_rejects_device_not_in_claim(ledger: Ledger) -> None:
    ledger.begin_prepare("uid-1", "ns", "c", [excl("dev-0")])
    with pytest.raises(LedgerValueError, match="dev-7"):
        ledger.complete_prepare("uid-1", {DeviceKey("pool-a", "dev-7"): ["v/c=x"]})


def test_idempotent_begin_prepare(path: Path) -> None:
    ledger = prepared_ledger(path)
    mtime = path.stat().st_mtime_ns
    os.utime(path, ns=(1, 1))

    again = ledger.begin_prepare(
        "uid-1", "default", "claim-1", [excl("dev-0")], config_digest="abc"
    )

    assert again.state == "prepared"  # nothing left to do for the caller
    assert again.cdi_ids == ["dradriver.dev/device=x"]
    assert path.stat().st_mtime_ns == 1  # no rewrite
    assert mtime != 1


def test_begin_prepare_while_preparing_returns_same_entry(ledger: Ledger) -> None:
    first = ledger.begin_prepare("uid-1", "ns", "c", [excl("dev-0"), excl("dev-1")])
    second = ledger.begin_prepare("uid-1", "ns", "c", [excl("dev-1"), excl("dev-0")])
    assert second == first


def test_prepare_with_different_devices_is_refused(ledger: Ledger) -> None:
    ledger.begin_prepare("uid-1", "ns", "c", [excl("dev-0")])
    with pytest.raises(ClaimMismatchError, match="Unprepare it"):
        ledger.begin_prepare("uid-1", "ns", "c", [excl("dev-1")])
    entry = ledger.get_claim("uid-1")
    assert entry is not None and [d.device for d in entry.devices] == ["dev-0"]


def test_changed_config_digest_means_prepare_again(ledger: Ledger) -> None:
    ledger.begin_prepare("uid-1", "ns", "c", [excl("dev-0")], config_digest="v1")
    ledger.complete_prepare("uid-1")
    entry = ledger.begin_prepare("uid-1", "ns", "c", [excl("dev-0")], config_digest="v2")
    assert (entry.state, entry.config_digest) == ("preparing", "v2")


def test_prepare_after_unprepare_started_restarts_prepare(ledger: Ledger) -> None:
    ledger.begin_prepare("uid-1", "ns", "c", [excl("dev-0")])
    ledger.complete_prepare("uid-1")
    ledger.begin_unprepare("uid-1")
    entry = ledger.begin_prepare("uid-1", "ns", "c", [excl("dev-0")])
    assert entry.state == "preparing"


def test_device_busy_between_two_claims(ledger: Ledger) -> None:
    ledger.begin_prepare("uid-1", "team-a", "train", [excl("dev-0", request="gpu")])
    with pytest.raises(DeviceBusy) as info:
        ledger.begin_prepare("uid-2", "team-b", "infer", [excl("dev-1"), excl("dev-0")])
    message = str(info.value)
    assert "pool-a/dev-0" in message
    assert "team-a/train" in message and "uid-1" in message and "request gpu" in message
    assert "team-b/infer" in message  # who was refused
    assert [r for r, _ in info.value.conflicts] == [ref("dev-0")]  # dev-1 was free
    assert info.value.device == ref("dev-0")
    assert isinstance(info.value.holders[0], ClaimHolder)
    assert ledger.get_claim("uid-2") is None
    assert Ledger.load(ledger.path).get_claim("uid-2") is None


def test_unpreparing_claim_still_blocks(ledger: Ledger) -> None:
    ledger.begin_prepare("uid-1", "ns", "a", [excl("dev-0")])
    ledger.begin_unprepare("uid-1")
    with pytest.raises(DeviceBusy, match="state unpreparing"):
        ledger.begin_prepare("uid-2", "ns", "b", [excl("dev-0")])


def test_device_busy_between_claim_and_plugin_hold(ledger: Ledger) -> None:
    ledger.begin_plugin_hold("example.com/dev", "pod-7", "main", [ref("dev-0")])
    with pytest.raises(DeviceBusy) as info:
        ledger.begin_prepare("uid-1", "ns", "c", [excl("dev-0")])
    message = str(info.value)
    assert "pod-7" in message and "main" in message and "example.com/dev" in message
    assert isinstance(info.value.holders[0], PluginHolder)

    # A shared use also needs the device not to be taken exclusively.
    with pytest.raises(DeviceBusy):
        ledger.begin_prepare("uid-2", "ns", "s", [shared("dev-0", "s1")])


def test_plugin_hold_refused_when_claim_holds_device(ledger: Ledger) -> None:
    ledger.begin_prepare("uid-1", "ns", "claim-x", [shared("dev-0", "s1")])
    with pytest.raises(DeviceBusy) as info:
        ledger.begin_plugin_hold("example.com/dev", "pod-1", "c", [ref("dev-0")])
    assert "ns/claim-x" in str(info.value) and "uid-1" in str(info.value)
    assert ledger.plugin_holds() == []


def test_plugin_holds_conflict_with_each_other(ledger: Ledger) -> None:
    ledger.begin_plugin_hold("r", "pod-1", "c", [ref("dev-0")])
    with pytest.raises(DeviceBusy, match="pod pod-1 container c"):
        ledger.begin_plugin_hold("r", "pod-2", "c", [ref("dev-0")])


def test_admin_access_never_conflicts(ledger: Ledger) -> None:
    ledger.begin_prepare("uid-1", "ns", "owner", [excl("dev-0")])
    ledger.begin_prepare("uid-2", "ns", "monitor", [admin("dev-0")])
    ledger.begin_prepare("uid-3", "ns", "monitor2", [admin("dev-1")])
    # An admin user does not block an exclusive claim or a device-plugin hold.
    ledger.begin_prepare("uid-4", "ns", "owner2", [excl("dev-1")])
    ledger.begin_prepare("uid-5", "ns", "monitor3", [admin("dev-2")])
    ledger.begin_plugin_hold("r", "pod-1", "c", [ref("dev-2")])
    assert ledger.held_devices() == {
        ("pool-a", "dev-0"),
        ("pool-a", "dev-1"),
        ("pool-a", "dev-2"),
    }
    holders = ledger.holders("pool-a", "dev-0")
    assert {type(h) for h in holders} == {ClaimHolder}
    assert sorted(h.admin_access for h in holders) == [False, True]


def test_shared_uses_coexist_but_not_with_exclusive(ledger: Ledger) -> None:
    ledger.begin_prepare("uid-1", "ns", "a", [shared("dev-0", "s1")])
    ledger.begin_prepare("uid-2", "ns", "b", [shared("dev-0", "s2")])
    assert ledger.held_devices() == set()
    assert ledger.held_devices(include_shared=True) == {("pool-a", "dev-0")}
    with pytest.raises(DeviceBusy) as info:
        ledger.begin_prepare("uid-3", "ns", "c", [excl("dev-0")])
    assert "ns/a" in str(info.value) and "ns/b" in str(info.value)
    assert len(info.value.holders) == 2

    ledger.begin_prepare("uid-4", "ns", "d", [excl("dev-1")])
    with pytest.raises(DeviceBusy):
        ledger.begin_prepare("uid-5", "ns", "e", [shared("dev-1", "s3")])


def test_same_device_in_other_pool_is_a_different_device(ledger: Ledger) -> None:
    ledger.begin_prepare("uid-1", "ns", "a", [excl("dev-0", pool="pool-a")])
    ledger.begin_prepare("uid-2", "ns", "b", [excl("dev-0", pool="pool-b")])
    assert ledger.held_devices() == {("pool-a", "dev-0"), ("pool-b", "dev-0")}


def test_claim_device_exclusive_rules() -> None:
    assert excl("d").exclusive is True
    assert shared("d", "s").exclusive is False
    assert admin("d").exclusive is False
    with pytest.raises(ValidationError, match="admin-access"):
        ClaimDevice(pool="p", device="d", admin_access=True, exclusive=True)
    with pytest.raises(ValidationError, match="share_id"):
        ClaimDevice(pool="p", device="d", share_id="s", exclusive=True)


def test_duplicate_device_use_in_one_claim_is_rejected(ledger: Ledger) -> None:
    with pytest.raises(LedgerValueError, match="twice"):
        ledger.begin_prepare("uid-1", "ns", "a", [excl("dev-0"), excl("dev-0")])
    # Two shares of one device in one claim are distinct uses.
    ledger.begin_prepare("uid-2", "ns", "b", [shared("dev-1", "s1"), shared("dev-1", "s2")])


def test_returned_entries_are_copies(ledger: Ledger) -> None:
    entry = ledger.begin_prepare("uid-1", "ns", "a", [excl("dev-0")])
    entry.devices.clear()
    stored = ledger.get_claim("uid-1")
    assert stored is not None and len(stored.devices) == 1


# --- device-plugin holds ---------------------------------------------------------


def test_plugin_hold_lifecycle(path: Path) -> None:
    ledger = Ledger.load(path)
    hold = ledger.begin_plugin_hold("example.com/dev", "pod-1", "c", [ref("dev-0"), ref("dev-1")])
    assert hold.state == "allocating"
    again = ledger.begin_plugin_hold("example.com/dev", "pod-1", "c", [ref("dev-1"), ref("dev-0")])
    assert again == hold
    assert ledger.complete_plugin_hold("pod-1", "c").state == "allocated"
    loaded = Ledger.load(path).get_plugin_hold("pod-1", "c")
    assert loaded is not None and loaded.state == "allocated"
    ledger.release_plugin_hold("pod-1", "c")
    ledger.release_plugin_hold("pod-1", "c")
    assert ledger.plugin_holds() == []
    ledger.begin_prepare("uid-1", "ns", "a", [excl("dev-0")])  # free again
    with pytest.raises(UnknownPluginHoldError):
        ledger.complete_plugin_hold("pod-1", "c")


def test_new_plugin_allocation_replaces_old_for_same_container(ledger: Ledger) -> None:
    ledger.begin_plugin_hold("r", "pod-1", "c", [ref("dev-0")])
    ledger.begin_plugin_hold("r", "pod-1", "c", [ref("dev-1")])
    assert ledger.held_devices() == {("pool-a", "dev-1")}


# --- property: never two exclusive holders, and load(save(x)) == x ---------------

DEVICES = ["dev-0", "dev-1", "dev-2"]
Mode = Literal["excl", "shared", "admin"]


@dataclass(frozen=True)
class Op:
    kind: Literal["prepare", "complete", "unprepare", "remove", "hold", "release"]
    who: int
    uses: tuple[tuple[str, Mode], ...] = ()


def make_device(device: str, mode: Mode, who: int) -> ClaimDevice:
    if mode == "excl":
        return excl(device)
    if mode == "shared":
        return shared(device, f"share-{who}")
    return admin(device)


ops = st.one_of(
    st.builds(
        Op,
        kind=st.just("prepare"),
        who=st.integers(0, 3),
        uses=st.lists(
            st.tuples(st.sampled_from(DEVICES), st.sampled_from(["excl", "shared", "admin"])),
            min_size=1,
            max_size=2,
            unique_by=lambda u: u[0],
        ).map(tuple),
    ),
    st.builds(
        Op,
        kind=st.just("hold"),
        who=st.integers(0, 2),
        uses=st.lists(st.sampled_from(DEVICES), min_size=1, max_size=2, unique=True).map(
            lambda ds: tuple((d, "excl") for d in ds)
        ),
    ),
    st.builds(Op, kind=st.sampled_from(["complete", "unprepare", "remove"]), who=st.integers(0, 3)),
    st.builds(Op, kind=st.just("release"), who=st.integers(0, 2)),
)


def expected_busy(ledger: Ledger, me: object, uses: tuple[tuple[str, Mode], ...]) -> bool:
    """Oracle straight from the Kubernetes rules, independent of the ledger's own check."""
    current: list[tuple[object, str, Mode]] = []
    for c in ledger.claims():
        for d in c.devices:
            mode: Mode = "admin" if d.admin_access else "excl" if d.exclusive else "shared"
            current.append((("claim", c.uid), d.device, mode))
    for h in ledger.plugin_holds():
        current.extend((("plugin", h.pod_uid), r.device, "excl") for r in h.devices)
    return any(
        holder != me
        and dev == device
        and m != "admin"
        and theirs != "admin"
        and "excl" in (m, theirs)
        for device, m in uses
        for holder, dev, theirs in current
    )


def assert_no_double_exclusive(ledger: Ledger) -> None:
    for device in DEVICES:
        users = [h for h in ledger.holders("pool-a", device) if not h.admin_access]
        if any(h.exclusive for h in users):
            assert len(users) == 1, f"{device} held by {users}"


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(ops, max_size=15))
def test_property_no_double_exclusive_and_round_trip(sequence: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.json"
        ledger = Ledger.load(path)
        for op in sequence:
            uid = f"uid-{op.who}"
            pod = f"pod-{op.who}"
            if op.kind == "prepare":
                existing = ledger.get_claim(uid)
                devices = [make_device(d, m, op.who) for d, m in op.uses]
                try:
                    ledger.begin_prepare(uid, "ns", f"c{op.who}", devices)
                except ClaimMismatchError:
                    assert existing is not None
                except DeviceBusy:
                    assert expected_busy(ledger, ("claim", uid), op.uses)
                else:
                    if existing is None:
                        assert not expected_busy(ledger, ("claim", uid), op.uses)
            elif op.kind == "hold":
                existing_hold = ledger.get_plugin_hold(pod, "c")
                try:
                    ledger.begin_plugin_hold("r", pod, "c", [ref(d) for d, _ in op.uses])
                except DeviceBusy:
                    assert expected_busy(ledger, ("plugin", pod), op.uses)
                else:
                    if existing_hold is None:
                        assert not expected_busy(ledger, ("plugin", pod), op.uses)
            elif op.kind == "complete":
                entry = ledger.get_claim(uid)
                if entry is not None and entry.state != "unpreparing":
                    assert ledger.complete_prepare(uid).state == "prepared"
            elif op.kind == "unprepare":
                ledger.begin_unprepare(uid)
            elif op.kind == "remove":
                ledger.remove_claim(uid)
            else:
                ledger.release_plugin_hold(pod, "c")
            assert_no_double_exclusive(ledger)

        reloaded = Ledger.load(path)
        assert reloaded.data() == ledger.data()
        assert reloaded.recovered_from_corruption is None


def test_failed_write_changes_nothing_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    path.mkdir()  # os.replace onto a directory fails after the temp file is written
    ledger = Ledger(path)
    with pytest.raises(OSError):
        ledger.begin_prepare("uid-1", "ns", "a", [excl("dev-0")])
    assert ledger.get_claim("uid-1") is None
    assert ledger.held_devices() == set()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.json", "ledger.json.lock"]


def test_two_ledgers_on_one_file_see_each_other(tmp_path: Path) -> None:
    """Two plugin processes during a rolling update share one ledger file."""
    path = tmp_path / "ledger.json"
    first, second = Ledger.load(path), Ledger.load(path)
    first.begin_prepare("uid-1", "ns", "a", [excl("dev-0")])
    with pytest.raises(DeviceBusy, match="uid-1"):
        second.begin_prepare("uid-2", "ns", "b", [excl("dev-0")])
    assert second.get_claim("uid-1") is not None
    second.remove_claim("uid-1")
    assert first.get_claim("uid-1") is None
    first.begin_prepare("uid-2", "ns", "b", [excl("dev-0")])
