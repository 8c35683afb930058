"""Informer: a watch that the server ends at once, without an event, again and again, is
retried after a growing backoff, not in a tight loop; an event resets the backoff."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from dradriver.runtime import Backoff, Informer
from tests.unit.dradriver.runtime.test_informer import (
    FakeClient,
    Recorder,
    Stream,
    cm,
    ev,
    eventually,
    informer_for,
    page,
    run,
)


def test_a_watch_that_ends_at_once_again_and_again_is_not_reopened_in_a_tight_loop() -> None:
    """A server (or proxy) that accepts every watch and closes it at once, without an
    event: with the default backoff (0.8 s, doubling) that is two attempts in 1.5 s."""

    async def scenario() -> None:
        client = FakeClient()
        client.lists = [page([cm("a", 1)], 10)]
        client.streams = [Stream([]) for _ in range(1000)]
        too_many = asyncio.Event()
        client.on_watch = lambda calls: too_many.set() if calls > 3 else None
        informer = Informer(client, "/api/v1/configmaps", name="configmaps")
        informer.start()
        with pytest.raises(TimeoutError):  # the window: 1.5 s without a fourth attempt
            await asyncio.wait_for(too_many.wait(), 1.5)
        attempts = len(client.watch_calls)
        assert 1 <= attempts <= 3
        assert informer.lists == 1 and informer.errors == attempts
        assert "without an event" in informer.last_error
        assert informer.has_synced and informer.keys() == ["ns/a"]
        await informer.stop()

    run(scenario())


def test_the_backoff_grows_up_to_its_cap_and_an_event_resets_it() -> None:
    async def scenario() -> None:
        client = FakeClient()
        client.lists = [page([], 10)]
        client.streams = [
            *(Stream([]) for _ in range(5)),  # ends at once: 5 failures
            Stream([ev("ADDED", cm("a", 11))]),  # works, then ends: resumed at once
            Stream([]),  # ends at once: backs off from the start again
            Stream([], hang=True),
        ]
        backoff = Backoff(base=0.05, cap=0.2, jitter=0)
        informer = informer_for(client, backoff=backoff)
        rec = Recorder(informer)
        informer.start()
        await eventually("eighth watch", lambda: len(client.watch_calls) == 8)
        times = client.watch_times
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        waits = [0.05, 0.1, 0.2, 0.2, 0.2, 0.0, 0.05]  # the delays the informer must wait
        assert all(gap >= wait - 0.005 for gap, wait in zip(gaps, waits, strict=True)), gaps
        assert [rv for rv, _ in client.watch_calls] == ["10"] * 6 + ["11", "11"]
        assert rec.events == [("add", "a", "11")]
        assert informer.lists == 1 and informer.errors == 6
        assert backoff.failures == 1  # reset by the event, one failure since
        await informer.stop()

    run(scenario())


def test_a_watch_that_ends_at_once_after_a_bookmark_is_no_failure() -> None:
    async def scenario() -> None:
        client = FakeClient()
        client.lists = [page([], 10)]
        client.streams = [
            *(
                Stream([ev("BOOKMARK", {"metadata": {"resourceVersion": str(rv)}})])
                for rv in (20, 30)
            ),
            Stream([], hang=True),
        ]
        informer = informer_for(client, backoff=Backoff(base=5.0, cap=5.0))
        informer.start()
        await eventually("third watch", lambda: len(client.watch_calls) == 3)
        assert [rv for rv, _ in client.watch_calls] == ["10", "20", "30"]
        assert informer.errors == 0 and informer.bookmarks == 2
        await informer.stop()

    run(scenario())
