"""``Ledger.load`` on any bytes: it loads the ledger or keeps the file aside and starts
empty; the only error it raises is the documented one for a newer format version, and
then the file is left alone."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from dradriver.host.state.codec import checksum
from dradriver.host.state.ledger import Ledger
from dradriver.host.state.schema import SUPPORTED_VERSION, LedgerVersionError
from tests.fuzz.strategies import deep_depths, deep_json, json_values, tricky_text

FUZZ = settings.get_profile("fuzz")


def check_load(raw: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="ledger-fuzz-") as tmp:
        path = Path(tmp) / "ledger.json"
        path.write_bytes(raw)
        try:
            ledger = Ledger.load(path)
        except LedgerVersionError:
            version = json.loads(raw)["version"]
            assert type(version) is int and version > SUPPORTED_VERSION
            assert path.read_bytes() == raw  # the newer plugin's data is left alone
            event("newer version: refused")
            return
        kept = ledger.recovered_from_corruption
        if kept is None:
            assert path.read_bytes() == raw
            event(f"loaded, {'with' if ledger.claims() or ledger.plugin_holds() else 'no'} holds")
        else:
            event("kept aside")
            assert kept.read_bytes() == raw and not path.exists()
            assert ledger.claims() == [] and ledger.plugin_holds() == []
        # What was loaded can be asked the questions prepare and Allocate ask.
        ledger.held_devices(include_shared=True)
        for claim in ledger.claims():
            for device in claim.devices:
                ledger.holders(device.pool, device.device)


# Mostly what the plugin writes, so that many files get past the schema; sometimes not.
good_names = st.sampled_from(["a", "dev-0", "dev-1", "node-1", "3f0b6c1e-3c1a", "ns"])
names = st.one_of(good_names, good_names, good_names, st.just(""), tricky_text)
good_timestamp = st.just("2026-01-02T03:04:05.000006+00:00")
timestamps = st.one_of(good_timestamp, good_timestamp, st.sampled_from(["2026-13-40", ""]), names)
claim_devices = st.fixed_dictionaries(
    {"pool": names, "device": names},
    optional={
        "request_names": st.lists(names, max_size=2),
        "share_id": st.none() | names,
        "admin_access": st.booleans() | json_values(3),
        "exclusive": st.booleans(),
        "cdi_ids": st.lists(names, max_size=2),
    },
)
claims = st.fixed_dictionaries(
    {
        "uid": names,
        "namespace": names,
        "name": names,
        "state": st.sampled_from(["preparing", "prepared", "prepared", "unpreparing", "gone"]),
    },
    optional={
        "devices": st.lists(claim_devices, max_size=3),
        "config_digest": names,
        "updated": timestamps,
    },
)
holds = st.fixed_dictionaries(
    {
        "resource": names,
        "pod_uid": names,
        "container": names,
        "state": st.sampled_from(["allocating", "allocated", "allocated", "released"]),
    },
    optional={
        "devices": st.lists(st.fixed_dictionaries({"pool": names, "device": names}), max_size=2),
        "updated": timestamps,
    },
)
structured_data = st.fixed_dictionaries(
    {},
    optional={
        "claims": st.lists(claims, max_size=3, unique_by=lambda c: c["uid"]),
        "plugin_holds": st.lists(
            holds, max_size=2, unique_by=lambda h: (h["pod_uid"], h["container"])
        ),
    },
)


def device_use(device: Any) -> tuple[Any, ...]:
    """What the ledger keeps unique within a claim: the device and its share."""
    return (device["pool"], device["device"], device.get("share_id"))


# What the plugin itself writes: any names (non-empty), valid states and timestamps.
any_name = st.text(min_size=1, max_size=12) | good_names
valid_claims = st.fixed_dictionaries(
    {
        "uid": any_name,
        "namespace": any_name,
        "name": any_name,
        "state": st.sampled_from(["preparing", "prepared", "unpreparing"]),
        "updated": good_timestamp,
        "devices": st.lists(
            st.fixed_dictionaries(
                {"pool": good_names, "device": good_names},
                optional={"share_id": any_name, "cdi_ids": st.lists(any_name, max_size=2)},
            ),
            max_size=3,
            unique_by=device_use,
        ),
    }
)
valid_data = st.fixed_dictionaries(
    {"claims": st.lists(valid_claims, max_size=3, unique_by=lambda c: c["uid"])}
)
ledger_data = st.one_of(
    valid_data,
    valid_data,
    valid_data,
    valid_data,
    structured_data,
    structured_data,
    st.dictionaries(st.sampled_from(["claims", "plugin_holds", "other"]), json_values(8)),
    json_values(8),
)
versions = st.one_of(
    st.just(SUPPORTED_VERSION),
    st.just(SUPPORTED_VERSION),
    st.sampled_from([0, -1, 2, 10**30, True, "1", 1.0, None]),
)


@st.composite
def envelopes(draw: st.DrawFn) -> bytes:
    """The file format, mostly right: a checksum that matches, so the schema is reached."""
    data = draw(ledger_data)
    doc: dict[str, Any] = {"version": draw(versions), "checksum": checksum(data), "data": data}
    if draw(st.integers(0, 3)) == 0:
        doc[draw(st.sampled_from(["checksum", "version", "data", "extra"]))] = draw(json_values(4))
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()))
    # Lone surrogates make the bytes invalid UTF-8: also something a disk can hold.
    return text.encode("utf-8", "surrogatepass")


@settings(FUZZ, derandomize=True, max_examples=300, deadline=None)
@given(raw=st.binary(max_size=300))
def test_any_bytes_load_or_are_kept_aside(raw: bytes) -> None:
    check_load(raw)


@settings(FUZZ, derandomize=True, max_examples=300, deadline=None)
@given(doc=json_values())
def test_any_json_loads_or_is_kept_aside(doc: Any) -> None:
    check_load(json.dumps(doc).encode())


@settings(FUZZ, derandomize=True, max_examples=400, deadline=None)
@given(raw=envelopes())
def test_a_well_formed_file_with_any_data_loads_or_is_kept_aside(raw: bytes) -> None:
    check_load(raw)


@settings(FUZZ, derandomize=True, max_examples=20, deadline=None)
@given(depth=deep_depths, where=st.sampled_from(["top", "data"]))
def test_a_deeply_nested_file_is_kept_aside(depth: int, where: str) -> None:
    if where == "top":
        raw = deep_json(depth)
    else:
        data = deep_json(depth, key="claims")
        raw = f'{{"version":1,"checksum":"sha256:{"0" * 64}","data":{data}}}'
    check_load(raw.encode())
