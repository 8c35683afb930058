"""Informer against a scripted list/watch client: resume, bookmarks, 410 relist, backoff,
and objects it cannot use (nested too deep, malformed), also through the real client."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, cast

import pytest

from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.jsondecode import decode_list
from dradriver.k8s.objects import Obj
from dradriver.runtime import Backoff, Informer, RuntimeMetrics
from tests.fakes.httpapiserver import ScriptedHTTPAPIServer
from tests.metricsample import sample_value

DEADLINE = 5.0


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))


async def eventually(what: str, cond: Callable[[], bool], deadline: float = DEADLINE) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out after {deadline}s waiting for {what}")
        await asyncio.sleep(0.005)


def cm(name: str, rv: int, ns: str = "ns") -> Obj:
    return {"metadata": {"namespace": ns, "name": name, "resourceVersion": str(rv)}}


def ev(kind: str, obj: Obj) -> Obj:
    return {"type": kind, "object": obj}


def gone() -> Obj:
    return ev("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})


class Stream:
    """One scripted watch: events, then an optional error, then end (or hang)."""

    def __init__(self, events: list[Obj], error: Exception | None = None, hang: bool = False):
        self.events, self.error, self.hang = events, error, hang


class FakeClient:
    """Serves scripted lists and watches; records every call."""

    def __init__(self) -> None:
        self.lists: list[Obj | Exception] = []
        self.streams: list[Stream | Exception] = []
        self.list_calls: list[dict[str, Any]] = []
        self.watch_calls: list[tuple[str, dict[str, Any]]] = []
        self.watch_times: list[float] = []  # the event loop's clock at each watch call
        self.on_watch: Callable[[int], None] = lambda calls: None
        self.closed = 0

    async def list(self, path: str, **params: Any) -> Obj:
        self.list_calls.append(params)
        if not self.lists:
            raise AssertionError("unexpected list")
        answer = self.lists.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def watch(self, path: str, resource_version: str, **params: Any) -> AsyncIterator[Obj]:
        self.watch_calls.append((resource_version, params))
        self.watch_times.append(asyncio.get_running_loop().time())
        self.on_watch(len(self.watch_calls))
        if not self.streams:
            await asyncio.Event().wait()  # nothing scripted: stay open
        script = self.streams.pop(0)
        if isinstance(script, Exception):
            raise script
        try:
            for event in script.events:
                yield event
            if script.error is not None:
                raise script.error
            if script.hang:
                await asyncio.Event().wait()
        finally:
            self.closed += 1


def page(items: list[Obj], rv: int, cont: str | None = None) -> Obj:
    meta: Obj = {"resourceVersion": str(rv)}
    if cont:
        meta["continue"] = cont
    return {"items": items, "metadata": meta}


class Recorder:
    def __init__(self, informer: Informer) -> None:
        self.events: list[tuple[str, str, str]] = []
        informer.add_handler(
            on_add=lambda o: self.events.append(("add", *self._id(o))),
            on_update=lambda old, new: self.events.append(("update", *self._id(new))),
            on_delete=lambda o: self.events.append(("delete", *self._id(o))),
        )

    @staticmethod
    def _id(o: Obj) -> tuple[str, str]:
        return o["metadata"]["name"], o["metadata"]["resourceVersion"]


def informer_for(client: FakeClient, **kwargs: Any) -> Informer:
    kwargs.setdefault("backoff", Backoff(base=0.001, cap=0.01))
    return Informer(client, "/api/v1/configmaps", name="configmaps", **kwargs)


def test_list_then_watch_from_list_rv_and_apply_events() -> None:
    async def scenario() -> None:
        client = FakeClient()
        client.lists = [page([cm("a", 5), cm("b", 6)], 10)]
        client.streams = [
            Stream(
                [
                    ev("ADDED", cm("c", 11)),
                    ev("MODIFIED", cm("a", 12)),
                    ev("DELETED", cm("b", 13)),
                ],
                hang=True,
            )
        ]
        informer = informer_for(client, label_selector="app=x", field_selector="metadata.name!=z")
        rec = Recorder(informer)
        assert not informer.has_synced
        informer.start()
        await asyncio.wait_for(informer.wait_for_sync(), DEADLINE)
        await eventually("three events", lambda: len(rec.events) == 5)
        assert rec.events == [
            ("add", "a", "5"),
            ("add", "b", "6"),
            ("add", "c", "11"),
            ("update", "a", "12"),
            ("delete", "b", "13"),
        ]
        assert sorted(informer.keys()) == ["ns/a", "ns/c"]
        assert informer.get("ns/a") == cm("a", 12)
        assert informer.resource_version == "13"
        rv, params = client.watch_calls[0]
        assert rv == "10"
        assert params["labelSelector"] == "app=x"
        assert params["fieldSelector"] == "metadata.name!=z"
        assert client.list_calls[0]["labelSelector"] == "app=x"
        await informer.stop()
        assert client.closed == 1  # the stream was closed on stop

    run(scenario())


def test_paged_list_is_followed_to_the_end() -> None:
    async def scenario() -> None:
        client = FakeClient()
        client.lists = [
            page([cm("a", 1)], 20, "tok1"),
            page([cm("b", 2)], 20, "tok2"),
            page([], 20),
        ]
        informer = informer_for(client, page_size=1)
        informer.start()
        await asyncio.wait_for(informer.wait_for_sync(), DEADLINE)
        assert sorted(informer.keys()) == ["ns/a", "ns/b"]
        assert [c.get("continue") for c in client.list_calls] == [None, "tok1", "tok2"]
        assert all(c["limit"] == 1 for c in client.list_calls)
        await eventually("watch", lambda: bool(client.watch_calls))
        assert client.watch_calls[0][0] == "20"
        await informer.stop()

    run(scenario())


def test_normal_stream_end_resumes_from_last_event_or_bookmark_without_relisting() -> None:
    async def scenario() -> None:
        client = FakeClient()
        client.lists = [page([], 100)]
        client.streams = [
            Stream([ev("ADDED", cm("a", 101))]),
            Stream([ev("BOOKMARK", {"metadata": {"resourceVersion": "150"}})]),
            Stream([]),
            Stream([ev("MODIFIED", cm("a", 160))], hang=True),
        ]
        informer = informer_for(client)
        rec = Recorder(informer)
        informer.start()
        await eventually("fourth watch", lambda: len(client.watch_calls) == 4)
        await eventually("update", lambda: len(rec.events) == 2)
        assert [rv for rv, _ in client.watch_calls] == ["100", "101", "150", "150"]
        assert informer.lists == 1 and informer.bookmarks == 1
        assert rec.events == [("add", "a", "101"), ("update", "a", "160")]
        await informer.stop()

    run(scenario())


@pytest.mark.parametrize("how", ["error-event", "http-410"])
def test_gone_relists_and_emits_the_difference(how: str) -> None:
    async def scenario() -> None:
        client = FakeClient()
        client.lists = [
            page([cm("keep", 1), cm("change", 2), cm("vanish", 3)], 10),
            page([cm("keep", 1), cm("change", 30), cm("new", 31)], 40),
        ]
        expired: Stream | Exception = (
            Stream([ev("ADDED", cm("seen", 11)), gone()])
            if how == "error-event"
            else KubeAPIError("WATCH", "/x", 410, {"reason": "Expired", "message": "too old"})
        )
        client.streams = [expired, Stream([], hang=True)]
        metrics = RuntimeMetrics()
        informer = informer_for(client, metrics=metrics)
        rec = Recorder(informer)
        informer.start()
        await eventually("second watch", lambda: len(client.watch_calls) == 2)
        assert informer.lists == 2 and informer.expired == 1
        assert client.watch_calls[1][0] == "40"
        after_first_list = rec.events[3:]
        expected = [("update", "change", "30"), ("add", "new", "31"), ("delete", "vanish", "3")]
        if how == "error-event":
            # "seen" arrived by watch, then vanished from the relist: deleted too.
            expected = [("add", "seen", "11"), *expected, ("delete", "seen", "11")]
        assert sorted(after_first_list) == sorted(expected)
        assert sorted(informer.keys()) == ["ns/change", "ns/keep", "ns/new"]
        relists = sample_value(
            metrics.registry, "dradriver_informer_relists_total", {"resource": "configmaps"}
        )
        assert relists == 2
        await informer.stop()

    run(scenario())


def test_errors_back_off_list_is_retried_and_watch_resumes() -> None:
    async def scenario() -> None:
        client = FakeClient()
        client.lists = [
            KubeAPIError("GET", "/x", 503, {"message": "unavailable"}),
            ConnectionError("refused"),
            page([cm("a", 1)], 10),
        ]
        client.streams = [
            Stream([ev("MODIFIED", cm("a", 11))], error=ConnectionResetError("reset")),
            KubeAPIError("WATCH", "/x", 500, {"message": "boom"}),
            Stream([ev("ERROR", {"code": 500, "message": "internal"})]),
            Stream([], hang=True),
        ]
        informer = informer_for(client)
        rec = Recorder(informer)
        informer.start()
        await asyncio.wait_for(informer.wait_for_sync(), DEADLINE)
        await eventually("fourth watch", lambda: len(client.watch_calls) == 4)
        assert informer.lists == 3
        assert informer.errors == 5
        # Errors other than 410 resume from the last resourceVersion seen.
        assert [rv for rv, _ in client.watch_calls] == ["10", "11", "11", "11"]
        assert rec.events == [("add", "a", "1"), ("update", "a", "11")]
        await informer.stop()

    run(scenario())


def test_restart_watch_from_an_old_version_leads_to_relist() -> None:
    async def scenario() -> None:
        client = FakeClient()
        client.lists = [page([cm("a", 1)], 10), page([cm("a", 1)], 50)]
        client.streams = [
            Stream([], hang=True),
            KubeAPIError("WATCH", "/x", 410, {"message": "too old resource version"}),
            Stream([], hang=True),
        ]
        informer = informer_for(client)
        informer.start()
        await eventually("first watch", lambda: len(client.watch_calls) == 1)
        informer.restart_watch("1")
        await eventually("third watch", lambda: len(client.watch_calls) == 3)
        assert [rv for rv, _ in client.watch_calls] == ["10", "1", "50"]
        assert informer.expired == 1 and informer.lists == 2
        await informer.stop()

    run(scenario())


def test_handler_added_late_gets_cached_objects_and_handler_errors_are_contained() -> None:
    async def scenario() -> None:
        client = FakeClient()
        client.lists = [page([cm("a", 1)], 10)]
        client.streams = [Stream([ev("ADDED", cm("b", 11))], hang=True)]
        informer = informer_for(client)

        def broken(obj: Obj) -> None:
            raise RuntimeError("handler bug")

        informer.add_handler(on_add=broken)
        informer.start()
        await asyncio.wait_for(informer.wait_for_sync(), DEADLINE)
        await eventually("b cached", lambda: informer.get("ns/b") is not None)
        late = Recorder(informer)
        assert sorted(late.events) == [("add", "a", "1"), ("add", "b", "11")]
        await informer.stop()

    run(scenario())


def test_resync_redelivers_cached_objects_as_updates() -> None:
    async def scenario() -> None:
        client = FakeClient()
        client.lists = [page([cm("a", 1)], 10)]
        informer = informer_for(client, resync_period=0.02)
        rec = Recorder(informer)
        informer.start()
        await eventually("resync", lambda: ("update", "a", "1") in rec.events)
        await informer.stop()

    run(scenario())


def test_stop_wins_even_if_the_stream_turns_cancellation_into_an_error() -> None:
    """httpx may end a cancelled stream with ReadError; the informer must still stop."""

    class Client(FakeClient):
        async def watch(
            self, path: str, resource_version: str, **params: Any
        ) -> AsyncIterator[Obj]:
            self.watch_calls.append((resource_version, params))
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise ConnectionResetError("read error") from None
            yield {}

    async def scenario() -> None:
        client = Client()
        client.lists = [page([], 1)]
        informer = informer_for(client)
        task = informer.start()
        await eventually("watching", lambda: bool(client.watch_calls))
        await asyncio.wait_for(informer.stop(), DEADLINE)
        assert task.cancelled()
        assert informer.errors == 0

    run(scenario())


# ----- one object that cannot be used costs that object, not the cache -------------------

# The apiserver accepts JSON nested up to 10,000 levels, e.g. in a claim's status.devices[].data.
APISERVER_MAX_DEPTH = 10_000


def deep_cm_json(name: str, rv: int, depth: int) -> bytes:
    """A ConfigMap-like object whose data nests ``depth`` levels, as JSON text."""
    meta = json.dumps({"namespace": "ns", "name": name, "resourceVersion": str(rv)})
    return f'{{"metadata":{meta},"data":{{"x":{"[" * depth}{"]" * depth}}}}}'.encode()


def event_json(kind: str, obj: bytes) -> bytes:
    return b'{"type":"' + kind.encode() + b'","object":' + obj + b"}"


def list_json(items: list[bytes], rv: int) -> bytes:
    meta = json.dumps({"resourceVersion": str(rv)}).encode()
    return b'{"kind":"List","metadata":' + meta + b',"items":[' + b",".join(items) + b"]}"


def skipped(metrics: RuntimeMetrics, reason: str) -> float | None:
    return sample_value(
        metrics.registry,
        "dradriver_informer_skipped_total",
        {"resource": "configmaps", "reason": reason},
    )


class InformerLog(logging.Handler):
    """The informer's log records with their fields (propagation may be off)."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: list[dict[str, Any]] = []
        self._logger = logging.getLogger("dradriver.informer")

    def emit(self, record: logging.LogRecord) -> None:
        self.fields.append({"msg": record.getMessage(), **getattr(record, "fields", {})})

    def __enter__(self) -> InformerLog:
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)


class CopyingRecorder:
    """Deep-copies every object it is given, as reconcilers do, and records the events;
    :attr:`done` is set once ``last`` arrives."""

    def __init__(self, informer: Informer, last: tuple[str, str, str]) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.uncopyable: list[str] = []
        self.done = asyncio.Event()
        self._last = last
        informer.add_handler(
            on_add=lambda o: self._record("add", o),
            on_update=lambda old, new: self._record("update", new),
            on_delete=lambda o: self._record("delete", o),
        )

    def _record(self, what: str, obj: Obj) -> None:
        try:
            copy.deepcopy(obj)
        except RecursionError:
            self.uncopyable.append(obj["metadata"]["name"])
        self.events.append((what, obj["metadata"]["name"], obj["metadata"]["resourceVersion"]))
        if self.events[-1] == self._last:
            self.done.set()


def test_an_object_nested_too_deep_is_left_out_of_the_list_and_the_watch() -> None:
    """Over a socket, through the real client: a deep list item, a deep ADDED and a
    MODIFIED deep enough that deep-copying it would fail are skipped by name; the list
    syncs, later events arrive and the next watch starts after the skipped ones."""

    async def scenario() -> None:
        server = ScriptedHTTPAPIServer()
        await server.start()
        server.lists = [
            list_json([json.dumps(cm("a", 5)).encode(), deep_cm_json("deep", 6, 10_000)], 10)
        ]
        server.watches = [
            [
                event_json("ADDED", deep_cm_json("deeper", 11, APISERVER_MAX_DEPTH)),
                event_json("MODIFIED", deep_cm_json("a", 12, 600)),  # json.loads copes
                event_json("ADDED", json.dumps(cm("b", 13)).encode()),
            ]
        ]
        client = server.client()
        metrics = RuntimeMetrics()
        informer = informer_for(cast(FakeClient, client), metrics=metrics)
        informer.add_handler()  # a handler with nothing set is fine too
        rec = CopyingRecorder(informer, ("add", "b", "13"))
        try:
            with InformerLog() as logs:
                informer.start()
                await asyncio.wait_for(informer.wait_for_sync(), DEADLINE)
                await asyncio.wait_for(rec.done.wait(), DEADLINE)
                await eventually("the second watch", lambda: len(server.requests) == 3)
        finally:
            await informer.stop()
            await client.aclose()
            await server.stop()
        # Skipped, not gone: "a" keeps its last good version, nothing was deleted.
        assert rec.events == [("add", "a", "5"), ("add", "b", "13")]
        assert rec.uncopyable == []
        assert sorted(informer.keys()) == ["ns/a", "ns/b"]
        assert informer.get("ns/a") == cm("a", 5)
        assert server.requests[2][1]["resourceVersion"] == "13"
        assert informer.errors == 0 and informer.lists == 1
        assert informer.skipped == 3
        assert skipped(metrics, "too_deep") == 3
        named = [(f["namespace"], f["name"], f["event"]) for f in logs.fields if "reason" in f]
        assert named == [("ns", "deep", "list"), ("ns", "deeper", "ADDED"), ("ns", "a", "MODIFIED")]
        assert all(f["kind"] == "configmaps" for f in logs.fields if "reason" in f)
        assert all("nested deeper than" in f["reason"] for f in logs.fields if "reason" in f)

    run(scenario())


def test_a_too_deep_modification_keeps_the_last_good_version_until_deleted() -> None:
    async def scenario() -> None:
        server = ScriptedHTTPAPIServer()
        await server.start()
        server.lists = [list_json([json.dumps(cm("a", 5)).encode()], 10)]
        server.watches = [
            [
                event_json("MODIFIED", deep_cm_json("a", 11, APISERVER_MAX_DEPTH)),
                event_json("DELETED", deep_cm_json("a", 12, APISERVER_MAX_DEPTH)),
            ]
        ]
        client = server.client()
        informer = informer_for(cast(FakeClient, client))
        rec = CopyingRecorder(informer, ("delete", "a", "5"))
        try:
            informer.start()
            await asyncio.wait_for(rec.done.wait(), DEADLINE)
        finally:
            await informer.stop()
            await client.aclose()
            await server.stop()
        # The deletion is real, whatever the deleted object looked like: handlers get
        # the version they knew.
        assert rec.events == [("add", "a", "5"), ("delete", "a", "5")]
        assert len(informer) == 0
        assert informer.resource_version == "12"

    run(scenario())


def test_a_relist_keeps_the_last_good_version_of_an_object_that_turned_too_deep() -> None:
    async def scenario() -> None:
        server = ScriptedHTTPAPIServer()
        await server.start()
        server.lists = [
            list_json([json.dumps(cm("a", 5)).encode()], 10),
            list_json([deep_cm_json("a", 20, 5_000), json.dumps(cm("b", 21)).encode()], 30),
        ]
        server.watches = [[json.dumps(gone()).encode()]]
        client = server.client()
        informer = informer_for(cast(FakeClient, client))
        rec = CopyingRecorder(informer, ("add", "b", "21"))
        try:
            informer.start()
            await asyncio.wait_for(rec.done.wait(), DEADLINE)
        finally:
            await informer.stop()
            await client.aclose()
            await server.stop()
        assert rec.events == [("add", "a", "5"), ("add", "b", "21")]
        assert informer.get("ns/a") == cm("a", 5)
        assert informer.lists == 2 and informer.skipped == 1

    run(scenario())


def test_malformed_events_are_skipped_and_the_watch_goes_on() -> None:
    async def scenario() -> None:
        client = FakeClient()
        client.lists = [page([], 10)]
        malformed: list[Any] = [
            "not an object",
            ev("ADDED", cast(Obj, ["not", "an", "object"])),
            ev("ADDED", {"metadata": ["x"]}),
            ev("ADDED", {"metadata": {"namespace": "ns"}}),
            ev("MODIFIED", {"metadata": {"name": 7, "resourceVersion": "12"}}),
            ev("ADDED", {"metadata": {"name": "n", "namespace": ["ns"]}}),
            ev("ADDED", {"metadata": {"name": "r", "resourceVersion": 13}}),
        ]
        client.streams = [
            Stream(
                [
                    *malformed,
                    {"type": ["ADDED"], "object": cm("t", 14)},  # an event type that is not one
                    ev("ERROR", cast(Obj, "gone?")),
                ],
            ),
            Stream([ev("ADDED", cm("b", 15))], hang=True),
        ]
        metrics = RuntimeMetrics()
        informer = informer_for(client, metrics=metrics)
        rec = CopyingRecorder(informer, ("add", "b", "15"))
        informer.start()
        await asyncio.wait_for(rec.done.wait(), DEADLINE)
        await informer.stop()
        assert rec.events == [("add", "b", "15")]
        assert informer.keys() == ["ns/b"]
        assert informer.skipped == len(malformed)
        assert skipped(metrics, "malformed") == len(malformed)
        # The ERROR event without a Status ended that watch; the next resumed after "12".
        assert informer.errors == 1
        assert [rv for rv, _ in client.watch_calls] == ["10", "12"]
        # An event type that is not one is counted as "other": the label set stays bounded.
        other = sample_value(
            metrics.registry,
            "dradriver_informer_events_total",
            {"resource": "configmaps", "type": "other"},
        )
        assert other == 1

    run(scenario())


def test_an_event_is_one_newline_terminated_line_whatever_unicode_breaks_it_holds() -> None:
    """The apiserver sends U+0085 (and, from other encoders, U+2028) unescaped inside
    strings; an event must not be cut there, or it is never decodable and the watch
    retries it forever."""

    async def scenario() -> None:
        server = ScriptedHTTPAPIServer()
        await server.start()
        server.lists = [list_json([], 10)]
        odd = cm("odd", 11)
        odd["metadata"]["annotations"] = {"note": "a\x85b\u2028c\u2029d\x0be\x1cf\rg"}
        odd_line = json.dumps(ev("ADDED", odd), ensure_ascii=False).encode()
        server.watches = [[odd_line, json.dumps(ev("ADDED", cm("b", 12))).encode()]]
        client = server.client()
        informer = informer_for(cast(FakeClient, client))
        rec = CopyingRecorder(informer, ("add", "b", "12"))
        try:
            informer.start()
            await asyncio.wait_for(rec.done.wait(), DEADLINE)
        finally:
            await informer.stop()
            await client.aclose()
            await server.stop()
        assert rec.events == [("add", "odd", "11"), ("add", "b", "12")]
        assert informer.get("ns/odd") == odd
        assert informer.errors == 0

    run(scenario())


# ----- an object too deep to decode is shown apart, never as a silent gap ---------------


def deep_claim_json(name: str, rv: int, device: str, depth: int = APISERVER_MAX_DEPTH) -> bytes:
    """A claim allocated ``device`` whose ``status.devices[].data`` nests ``depth`` levels."""
    result = {"request": "r", "driver": "d.dev", "pool": "p", "device": device}
    claim = {
        "kind": "ResourceClaim",
        "metadata": {"namespace": "ns", "name": name, "resourceVersion": str(rv)},
        "status": {"allocation": {"devices": {"results": [result]}}, "devices": ["DATA"]},
    }
    return json.dumps(claim).replace('"DATA"', "[" * depth + "]" * depth).encode()


class UnreadableRecorder:
    """Records the unreadable handlers' calls as (what, name, rv, devices readable)."""

    def __init__(self, informer: Informer, last: tuple[str, str, str]) -> None:
        self.events: list[tuple[str, str, str, list[str]]] = []
        self.done = asyncio.Event()
        self._last = last
        informer.add_unreadable_handler(
            lambda key, obj: self._record("unreadable", key, obj),
            lambda key, obj: self._record("cleared", key, obj),
        )

    def _record(self, what: str, key: str, obj: Obj) -> None:
        results = obj["status"]["allocation"]["devices"]["results"]
        rv = obj["metadata"]["resourceVersion"]
        self.events.append((what, key, rv, [r["device"] for r in results]))
        if (what, key, rv) == self._last:
            self.done.set()


def test_a_too_deep_object_is_shown_as_unreadable_until_readable_or_deleted() -> None:
    """Through the real client: the cut version of a too-deep claim, with its allocation
    readable, goes to the unreadable handlers (list, newer cut versions), never to the
    normal ones; a readable version or a deletion clears it, and a relist that no longer
    has it clears it too."""

    async def scenario() -> None:
        server = ScriptedHTTPAPIServer()
        await server.start()
        server.lists = [
            list_json([deep_claim_json("a", 5, "dev-0"), json.dumps(cm("b", 6)).encode()], 10),
            list_json([deep_claim_json("c", 20, "dev-2")], 30),
        ]
        server.watches = [
            [
                event_json("MODIFIED", deep_claim_json("a", 11, "dev-1")),
                event_json("MODIFIED", json.dumps(cm("a", 12)).encode()),  # readable again
                event_json("MODIFIED", deep_claim_json("a", 13, "dev-1")),
                event_json("DELETED", deep_claim_json("a", 14, "dev-1")),
                event_json("ADDED", deep_claim_json("c", 15, "dev-2")),
                json.dumps(gone()).encode(),
            ],
            [event_json("ADDED", deep_claim_json("d", 31, "dev-3"))],
        ]
        client = server.client()
        informer = informer_for(cast(FakeClient, client))
        rec = CopyingRecorder(informer, ("delete", "c", "15"))
        cut = UnreadableRecorder(informer, ("unreadable", "ns/d", "31"))
        try:
            informer.start()
            await asyncio.wait_for(cut.done.wait(), DEADLINE)
        finally:
            await informer.stop()
            await client.aclose()
            await server.stop()
        assert cut.events == [
            ("unreadable", "ns/a", "5", ["dev-0"]),
            ("unreadable", "ns/a", "11", ["dev-1"]),
            ("cleared", "ns/a", "11", ["dev-1"]),
            ("unreadable", "ns/a", "13", ["dev-1"]),
            ("cleared", "ns/a", "13", ["dev-1"]),  # the deletion of a too-deep object
            ("unreadable", "ns/c", "15", ["dev-2"]),
            ("unreadable", "ns/c", "20", ["dev-2"]),  # the relist's newer cut version
            ("unreadable", "ns/d", "31", ["dev-3"]),
        ]
        # The normal handlers and the cache see readable versions only; every one of
        # them can be deep-copied.
        assert rec.events == [
            ("add", "b", "6"),
            ("add", "a", "12"),
            ("delete", "a", "12"),  # the deleted object was too deep: the last good one
            ("delete", "b", "6"),  # gone from the relist
        ]
        assert rec.uncopyable == []
        assert informer.keys() == [] and sorted(informer.unreadable) == ["ns/c", "ns/d"]
        # A late handler is told what is unreadable now.
        late: list[str] = []
        informer.add_unreadable_handler(lambda key, obj: late.append(key))
        assert sorted(late) == ["ns/c", "ns/d"]

    run(scenario())


def test_a_relist_clears_an_unreadable_object_that_is_gone() -> None:
    async def scenario() -> None:
        client = FakeClient()
        client.lists = [
            decode_list(list_json([deep_claim_json("a", 5, "dev-0")], 10)),
            page([cm("b", 21)], 30),
        ]
        client.streams = [Stream([gone()]), Stream([], hang=True)]
        informer = informer_for(client)
        cut = UnreadableRecorder(informer, ("cleared", "ns/a", "5"))
        informer.start()
        try:
            await asyncio.wait_for(cut.done.wait(), DEADLINE)
        finally:
            await informer.stop()
        assert [e[:3] for e in cut.events] == [
            ("unreadable", "ns/a", "5"),
            ("cleared", "ns/a", "5"),
        ]
        assert dict(informer.unreadable) == {} and informer.keys() == ["ns/b"]

    run(scenario())
