"""Decoding list and watch responses with an object nested deeper than Python copes with."""

from __future__ import annotations

import copy
import json

import pytest

from dradriver.k8s.jsondecode import (
    MAX_DEPTH,
    TooDeepObject,
    decode_list,
    decode_watch_event,
    nested_deeper_than,
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


def test_a_deep_list_item_becomes_its_identity_and_the_others_are_kept() -> None:
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
    assert stand_in == deep  # identity only: nothing of the deep status
    assert stand_in.reason == f"nested deeper than {MAX_DEPTH} levels"
    copy.deepcopy(page)  # whatever comes out can be walked


def test_a_deep_watch_object_becomes_its_identity() -> None:
    line = '{"type":"MODIFIED","object":{"kind":"ResourceClaim","metadata":{"name":"c"},"x":'
    event = decode_watch_event(line + nest(MAX_DEPTH + 1) + "}}")
    assert event == {
        "type": "MODIFIED",
        "object": {"kind": "ResourceClaim", "metadata": {"name": "c"}},
    }
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
