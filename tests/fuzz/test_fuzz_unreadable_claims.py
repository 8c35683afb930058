"""Unreadable means held, on any claim cut anywhere: whatever the decoder's limit cuts out
of a claim, every device its allocation holds is either still held or in a blocked pool
(issue 21, finding 3), and reading the cut claim never raises."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.claims.unreadable import read_cut_claim
from dradriver.k8s.jsondecode import TooDeepObject, decode_list, decode_watch_event
from tests.fuzz.strategies import deep_json, json_values

FUZZ = settings.get_profile("fuzz")
OWN = "own.dev"

results = st.lists(
    st.fixed_dictionaries(
        {
            "request": st.sampled_from(["r", "s"]),
            "driver": st.sampled_from([OWN, "other.dev"]),
            "pool": st.sampled_from(["p", "q"]),
            "device": st.sampled_from(["dev-0", "dev-1", "dev-2"]),
        },
        optional={
            "shareID": st.just("share"),
            "consumedCapacity": st.just({"memory": "1Gi"}),
            "adminAccess": st.booleans(),
        },
    ),
    max_size=4,
)


@settings(FUZZ, derandomize=True, max_examples=400, deadline=None)
@given(
    held=results,
    config=json_values(6),
    deep=st.sampled_from(["data", "config", "managedFields", "results", "none"]),
    depth=st.integers(1, 400),
    limit=st.integers(2, 14),
    as_list=st.booleans(),
)
def test_every_device_a_cut_claim_holds_is_held_or_blocked(
    held: list[dict[str, Any]], config: Any, deep: str, depth: int, limit: int, as_list: bool
) -> None:
    deep_text = deep_json(depth)
    results_text = json.dumps(held)
    if deep == "results" and held:  # a deep field inside the first result
        results_text = results_text.replace('"request"', '"x":' + deep_text + ',"request"', 1)
    managed = deep_text if deep == "managedFields" else "[]"
    data = deep_text if deep == "data" else "0"
    cfg = deep_text if deep == "config" else json.dumps(config)
    claim = (
        '{"kind":"ResourceClaim","metadata":{"name":"a","namespace":"ns",'
        '"resourceVersion":"3","managedFields":' + managed + '},"status":{"allocation":'
        '{"devices":{"results":' + results_text + ',"config":' + cfg + "}},"
        '"devices":[{"driver":"' + OWN + '","pool":"p","device":"dev-0","data":' + data + "}]}}"
    )  # fmt: skip
    if as_list:
        obj = decode_list('{"metadata":{},"items":[' + claim + "]}", limit)["items"][0]
    else:
        obj = decode_watch_event('{"type":"MODIFIED","object":' + claim + "}", limit)["object"]
    if not isinstance(obj, TooDeepObject):
        return  # decoded whole: the informer's cache has it
    got = read_cut_claim(obj, OWN)
    kept: dict[tuple[str, str, str], set[str | None]] = {}
    for r in ((got.allocation or {}).get("devices") or {}).get("results") or []:
        kept.setdefault((r["driver"], r["pool"], r["device"]), set()).add(r.get("shareID"))
    for result in held:
        device = (result["driver"], result["pool"], result["device"])
        # Held as it was (a share stays a share), held whole (its share was cut), or in
        # a blocked pool; a device of another driver may be unnamed only when nothing of
        # the allocation could be read (then the controller's own pools are blocked).
        if device in kept:
            assert result.get("shareID") in kept[device] or None in kept[device]
            continue
        covered = got.blocks_device(device) or (result["driver"] != OWN and OWN in got.drivers)
        assert covered, (device, got)
