"""Decoding list and watch responses with an object nested deeper than Python copes with."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from dradriver.k8s.jsondecode import (
    CUT,
    MAX_DEPTH,
    TooDeepObject,
    decode_list,
    decode_watch_event,
    nested_deeper_than,
    was_cut,
)


def nest(depth: int, opener: str = "[", closer: str = "]") -> str:
    return opener * depth + closer * depth


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("1", 0),
        ("[]", 1),
        ('{"a":[{}]}', 3),
        (nest(MAX_DEPTH), MAX_DEPTH),
        ('{"a":' * 200 + "1" + "}" * 200, 200),
        # Brackets, quotes and backslashes inside strings are not structure.
        ("[" + json.dumps("]]]]" + "[" * 300 + '\\"\\') + "]", 1),
        ("[" * 150 + json.dumps('"]' * 200) + "]" * 150, 150),
        ("[" + '"\\\\",' * 200 + nest(140) + "]", 141),
    ],
)
def test_nested_deeper_than_is_exact_for_valid_json(text: str, depth: int) -> None:
    json.loads(text)  # the cases are valid JSON
    assert not nested_deeper_than(text, depth)
    assert not nested_deeper_than(text.encode(), depth)
    if depth:
        assert nested_deeper_than(text, depth - 1)


def test_a_deep_list_item_is_kept_cut_and_the_others_are_kept_whole() -> None:
    deep = {"metadata": {"name": "d", "namespace": "ns", "uid": "u1", "resourceVersion": "7"}}
    deep_text = json.dumps(deep)[:-1] + ',"status":{"data":' + nest(10_000) + "}}"
    good = {"metadata": {"name": "g"}, "data": json.loads(nest(MAX_DEPTH - 3))}
    text = (
        '{"metadata":{"resourceVersion":"9"},"items":[' + json.dumps(good) + "," + deep_text + "]}"
    )
    page = decode_list(text.encode())
    assert page["metadata"] == {"resourceVersion": "9"}
    kept, stand_in = page["items"]
    assert kept == good and type(kept) is dict
    assert isinstance(stand_in, TooDeepObject)
    # The object, with the containers deeper than the limit cut: its identity and what
    # sits above the cut stay readable, the deep part is one CUT marker.
    assert stand_in["metadata"] == deep["metadata"]
    data = stand_in["status"]["data"]
    for _ in range(MAX_DEPTH - 4):  # data is at depth 5: the list (1), items (2), ...
        assert isinstance(data, list) and len(data) == 1
        data = data[0]
    assert data is CUT and was_cut(stand_in) and not was_cut(kept)
    assert stand_in.reason == f"nested deeper than {MAX_DEPTH} levels"
    copied = copy.deepcopy(page)  # whatever comes out can be walked, and copies keep CUT
    assert copied["items"][1] == stand_in and was_cut(copied["items"][1])
    assert pickle.loads(pickle.dumps(CUT)) is CUT


def test_a_deep_claim_keeps_its_allocation_results_readable() -> None:
    """The fields that say which devices a claim holds sit about 8 levels down: a claim
    nested too deep in its status data or managedFields still says them."""
    results = [{"request": "r", "driver": "d.dev", "pool": "p", "device": "dev-0"}]
    claim = {
        "kind": "ResourceClaim",
        "metadata": {"name": "a", "namespace": "ns", "managedFields": [{"f": "X"}]},
        "status": {
            "allocation": {"devices": {"results": results}},
            "devices": [{"driver": "d.dev", "pool": "p", "device": "dev-0", "data": "Y"}],
        },
    }
    text = json.dumps({"type": "MODIFIED", "object": claim})
    text = text.replace('"X"', nest(10_000)).replace('"Y"', nest(10_000, '{"k":', "}"))
    event = decode_watch_event(text)
    obj = event["object"]
    assert isinstance(obj, TooDeepObject) and event["type"] == "MODIFIED"
    assert obj["status"]["allocation"] == {"devices": {"results": results}}
    assert obj["metadata"]["name"] == "a" and was_cut(obj["metadata"]["managedFields"])
    assert was_cut(obj["status"]["devices"]) and not was_cut(obj["status"]["allocation"])


def test_a_deep_watch_object_is_kept_cut() -> None:
    line = '{"type":"MODIFIED","object":{"kind":"ResourceClaim","metadata":{"name":"c"},"x":'
    event = decode_watch_event(line + nest(MAX_DEPTH + 1) + "}}")
    assert event["type"] == "MODIFIED"
    obj = event["object"]
    assert isinstance(obj, TooDeepObject)
    assert {k: obj[k] for k in ("kind", "metadata")} == {
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
    }
    assert was_cut(obj["x"])


def test_a_deep_object_without_metadata_is_its_identity_only() -> None:
    event = decode_watch_event('{"type":"ADDED","object":{"kind":"K","x":' + nest(500) + "}}")
    assert event["object"] == {"kind": "K", "metadata": {}}
    assert isinstance(event["object"], TooDeepObject)


@pytest.mark.parametrize(
    "text",
    [
        nest(10_000),  # not an object
        '{"metadata":' + nest(5_000) + ',"items":[]}',  # deep outside the items
        "[" * 10_000,  # never closed
        '{"a":"' + "[" * 3_000,  # an unterminated string
        '{"items":[' + "[" * 3_000 + "}" * 3_000 + "]}",  # brackets that do not match
        "\xff\xfe{",
    ],
)
def test_text_that_is_not_a_list_response_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        decode_list(text)
