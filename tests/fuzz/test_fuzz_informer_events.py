"""The informer's event decoding: list and watch bodies on any bytes and any JSON, and the
informer on any event sequence. Nothing but ``ValueError`` ever leaves the decoder, a
decoded object is never deeper than the limit, and no event stops later ones."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from dradriver.k8s.jsondecode import (
    CUT,
    MAX_DEPTH,
    TooDeepObject,
    decode_list,
    decode_watch_event,
    nested_deeper_than,
    was_cut,
)
from dradriver.k8s.objects import Obj
from dradriver.runtime import Informer, RuntimeMetrics
from tests.fakes.httpapiserver import ScriptedHTTPAPIServer
from tests.fuzz.strategies import deep_depths, deep_json, json_depth, json_values, tricky_text
from tests.unit.dradriver.runtime.test_informer import (
    DEADLINE,
    FakeClient,
    Stream,
    cm,
    ev,
    informer_for,
    page,
)

FUZZ = settings.get_profile("fuzz")
json_texts = st.builds(
    lambda v, ascii_only: json.dumps(v, ensure_ascii=ascii_only), json_values(), st.booleans()
)
# Bytes that look like JSON structure more often than random bytes do.
structural_junk = st.text(st.sampled_from('[]{}",:0\\ "aNn'), max_size=60) | st.builds(
    lambda n, tail: "[" * n + tail, st.integers(0, 3_000), st.text(max_size=10)
)


@settings(FUZZ, derandomize=True, max_examples=600, deadline=None)
@given(text=json_texts, limit=st.integers(0, 8))
def test_the_depth_check_is_exact(text: str, limit: int) -> None:
    expected = json_depth(json.loads(text)) > limit
    assert nested_deeper_than(text, limit) is expected
    assert nested_deeper_than(text.encode("utf-8", "surrogatepass"), limit) is expected


@settings(FUZZ, derandomize=True, max_examples=600, deadline=None)
@given(data=st.binary(max_size=200) | structural_junk.map(str.encode), limit=st.integers(1, 200))
def test_any_bytes_decode_to_an_object_or_a_value_error(data: bytes, limit: int) -> None:
    for decode in (decode_list, decode_watch_event):
        try:
            doc = decode(data, limit)
        except ValueError:
            continue
        assert isinstance(doc, dict)
        assert json_depth(doc) <= limit


def identity_fits(stand_in: TooDeepObject, original: Any) -> None:
    """A stand-in without metadata keeps the original's kind and identity, nothing else."""
    assert set(stand_in) <= {"apiVersion", "kind", "metadata"}
    for key in ("apiVersion", "kind"):
        if key in stand_in:
            assert stand_in[key] == original[key]
    for key, value in stand_in["metadata"].items():
        assert original["metadata"][key] == value


def cut_fits(stand_in: Any, original: Any) -> None:
    """A cut stand-in is the original with some containers replaced by CUT, nothing else
    changed (iterative: the original may be deep)."""
    stack = [(stand_in, original)]
    while stack:
        got, want = stack.pop()
        if got is CUT:
            assert isinstance(want, dict | list)
        elif isinstance(want, dict):
            assert isinstance(got, dict) and got.keys() == want.keys()
            stack.extend((got[k], want[k]) for k in want)
        elif isinstance(want, list):
            assert isinstance(got, list) and len(got) == len(want)
            stack.extend(zip(got, want, strict=True))
        else:
            assert got == want


objects = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({"name": tricky_text}, optional={"uid": tricky_text})},
    optional={"kind": tricky_text, "spec": json_values(), "status": json_values()},
)


@settings(FUZZ, derandomize=True, max_examples=500, deadline=None)
@given(
    items=st.lists(objects | json_values(10), max_size=5),
    extra=json_values(8),
    limit=st.integers(1, 8),
)
def test_a_list_keeps_what_fits_and_stands_in_for_what_is_too_deep(
    items: list[Any], extra: Any, limit: int
) -> None:
    body = {"metadata": {"resourceVersion": "1", "extra": extra}, "items": items}
    try:
        decoded = decode_list(json.dumps(body), limit)
    except ValueError:
        # Only for nesting outside the items: the metadata, 2 levels down.
        assert 2 + json_depth(extra) > limit
        return
    assert 2 + json_depth(extra) <= limit
    assert decoded["metadata"] == body["metadata"]
    assert len(decoded["items"]) == len(items)
    for got, original in zip(decoded["items"], items, strict=True):
        if 2 + json_depth(original) > limit:  # items sit 2 levels down
            assert isinstance(got, TooDeepObject)
            assert json_depth(got) <= max(limit - 2, 2)  # what the limit leaves, or identity
            if was_cut(got):  # the object, cut
                cut_fits(got, original)
            elif isinstance(original, dict):  # cut whole: its identity
                identity_fits(got, original)
        else:
            assert got == original and not isinstance(got, TooDeepObject)


@settings(FUZZ, derandomize=True, max_examples=60, deadline=None)
@given(
    depths=st.lists(st.none() | deep_depths, min_size=1, max_size=4),
    brackets_in_strings=st.booleans(),
)
def test_objects_as_deep_as_the_apiserver_allows_cost_only_themselves(
    depths: list[int | None], brackets_in_strings: bool
) -> None:
    leaf = json.dumps("]}" * 50) if brackets_in_strings else "0"
    items = [
        json.dumps(cm(f"o{i}", i))[:-1]
        + (f',"data":{deep_json(d, leaf, key="k")}' if d is not None else "")
        + "}"
        for i, d in enumerate(depths)
    ]
    text = '{"metadata":{"resourceVersion":"9"},"items":[' + ",".join(items) + "]}"
    decoded = decode_list(text.encode())
    for i, (got, depth) in enumerate(zip(decoded["items"], depths, strict=True)):
        assert isinstance(got, TooDeepObject) is (depth is not None and depth + 3 > MAX_DEPTH)
        assert got["metadata"]["name"] == f"o{i}"
    event = decode_watch_event(f'{{"type":"ADDED","object":{items[0]}}}')
    assert event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "o0"


# ----- the informer on any sequence of events ------------------------------------------

NAMES = ("a", "b", "c")


def too_deep(name: str, rv: int) -> TooDeepObject:
    return TooDeepObject(cm(name, rv), MAX_DEPTH)


malformed_objects = st.sampled_from(
    [
        "text",
        ["a", "list"],
        {"metadata": ["x"]},
        {"metadata": {"namespace": "ns"}},
        {"metadata": {"name": 3}},
        {"metadata": {"name": "a", "namespace": 7}},
        {"metadata": {"name": "a", "resourceVersion": 7}},
    ]
) | json_values(6)


@st.composite
def event_scripts(draw: st.DrawFn) -> list[tuple[str, str, Any]]:
    """(type, what, object): good, too deep or malformed, with rising resourceVersions."""
    out: list[tuple[str, str, Any]] = []
    for rv in range(11, 11 + draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "WEIRD"]))
        what = draw(st.sampled_from(["good", "good", "too-deep", "malformed"]))
        name = draw(st.sampled_from(NAMES))
        obj: Any = {
            "good": cm(name, rv),
            "too-deep": too_deep(name, rv),
            "malformed": draw(malformed_objects),
        }[what]
        out.append((kind, what, obj))
    return out


def model(
    initial: dict[str, Obj], script: list[tuple[str, str, Any]], unreadable: dict[str, str]
) -> tuple[dict[str, Obj], list[tuple[str, str]]]:
    """What the cache and the handlers must end with: skipped objects change nothing,
    but a deletion is one, whatever the deleted object looks like. ``unreadable`` ends
    with the resourceVersion of each key whose latest version is too deep to decode."""
    cache = dict(initial)
    calls: list[tuple[str, str]] = []
    for kind, what, obj in script:
        if kind not in ("ADDED", "MODIFIED", "DELETED") or what == "malformed":
            continue
        key = f"ns/{obj['metadata']['name']}"
        if kind != "DELETED" and what == "too-deep":
            unreadable[key] = obj["metadata"]["resourceVersion"]
        else:
            unreadable.pop(key, None)
        if kind == "DELETED":
            if key in cache:
                known = cache.pop(key)
                # Handlers get the deleted object, or the last good one if it is too deep.
                gone = obj if what == "good" else known
                calls.append(("delete", gone["metadata"]["resourceVersion"]))
        elif what == "good":
            calls.append(("update" if key in cache else "add", obj["metadata"]["resourceVersion"]))
            cache[key] = obj
    return cache, calls


@settings(FUZZ, derandomize=True, max_examples=300, deadline=None)
@given(script=event_scripts(), listed=st.sets(st.sampled_from(NAMES)))
def test_no_event_stops_the_ones_after_it(
    script: list[tuple[str, str, Any]], listed: set[str]
) -> None:
    initial = {f"ns/{n}": cm(n, 1) for n in sorted(listed)}
    sentinel = cm("sentinel", 100)
    expected_unreadable: dict[str, str] = {}
    expected_cache, expected_calls = model(initial, script, expected_unreadable)
    expected_cache["ns/sentinel"] = sentinel

    async def scenario() -> tuple[Informer, list[tuple[str, str]]]:
        client = FakeClient()
        client.lists = [page(list(initial.values()), 10)]
        events: list[Obj] = [cast(Obj, {"type": k, "object": o}) for k, _, o in script]
        client.streams = [Stream([*events, ev("ADDED", sentinel)], hang=True)]
        informer = informer_for(client, metrics=RuntimeMetrics())
        calls: list[tuple[str, str]] = []
        arrived = asyncio.Event()

        def record(what: str, obj: Obj) -> None:
            calls.append((what, obj["metadata"]["resourceVersion"]))
            if obj is sentinel:
                arrived.set()

        informer.add_handler(
            on_add=lambda o: record("add", o),
            on_update=lambda old, new: record("update", new),
            on_delete=lambda o: record("delete", o),
        )
        informer.start()
        try:
            await asyncio.wait_for(arrived.wait(), DEADLINE)
        finally:
            await informer.stop()
        return informer, calls

    informer, calls = asyncio.run(scenario())
    assert dict(zip(informer.keys(), informer.items(), strict=True)) == expected_cache
    assert calls == [("add", "1")] * len(initial) + expected_calls + [("add", "100")]
    assert informer.errors == 0 and informer.watch_starts == 1
    # A too-deep object is shown apart until deleted or readable again; never cached.
    assert {k: o["metadata"]["resourceVersion"] for k, o in informer.unreadable.items()} == (
        expected_unreadable
    )
    assert informer.skipped == sum(
        1 for k, what, _ in script if k in ("ADDED", "MODIFIED", "DELETED") and what != "good"
    )


# ----- the same over a socket, through the real client -----------------------------------

event_lines = st.one_of(
    st.builds(
        lambda kind, obj: json.dumps({"type": kind, "object": obj}, ensure_ascii=False),
        st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "X"])
        | tricky_text.filter(lambda t: t != "ERROR"),
        json_values(10),
    ),
    st.builds(
        lambda kind, depth, name: (
            f'{{"type":"{kind}","object":'
            + json.dumps(cm(name, 5))[:-1]
            + f',"data":{deep_json(depth)}}}}}'
        ),
        st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
        deep_depths,
        st.sampled_from(NAMES),
    ),
    # Any JSON object as an event, but no ERROR event: that one ends a watch by design.
    json_values(10)
    .filter(lambda v: isinstance(v, dict) and v.get("type") != "ERROR")
    .map(lambda v: json.dumps(v, ensure_ascii=False)),
)


@settings(FUZZ, derandomize=True, max_examples=60, deadline=None)
@given(lines=st.lists(event_lines, max_size=6))
def test_over_the_wire_no_json_event_stops_the_ones_after_it(lines: list[str]) -> None:
    async def scenario() -> Informer:
        server = ScriptedHTTPAPIServer()
        await server.start()
        server.lists = [b'{"metadata":{"resourceVersion":"10"},"items":[]}']
        sentinel = json.dumps(ev("ADDED", cm("sentinel", 100)))
        # Raw UTF-8 as the apiserver sends it (which never holds a lone surrogate).
        server.watches = [[line.encode("utf-8", "replace") for line in [*lines, sentinel]]]
        client = server.client()
        informer = informer_for(cast(FakeClient, client))
        arrived = asyncio.Event()
        informer.add_handler(
            on_add=lambda o: arrived.set() if o["metadata"]["name"] == "sentinel" else None
        )
        informer.start()
        try:
            await asyncio.wait_for(arrived.wait(), DEADLINE)
        finally:
            await informer.stop()
            await client.aclose()
            await server.stop()
        return informer

    informer = asyncio.run(scenario())
    assert informer.errors == 0
    for obj in informer.items():
        assert json_depth(obj) <= MAX_DEPTH
