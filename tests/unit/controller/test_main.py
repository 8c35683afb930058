"""dradriver-controller: flags, option checks and readiness (no cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest

from controller.app import (
    RETRY_CAP,
    SLOW_LANE_NICE,
    ControllerApp,
    Options,
    allocation_workers,
)
from controller.claims.slicesync import SliceSnapshot
from controller.claims.worker import START_TIMEOUT, AllocationJob
from controller.main import build_parser, main, options_from
from dradriver.k8s.client import KubeClient
from dradriver.runtime import LeaderElectionConfig, LeaderElector
from tests.unit.dradriver.runtime.test_leaderelection import (
    LEASE,
    RENEW,
    RETRY,
    LeaseStore,
    eventually,
)


def test_help_lists_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--kubeconfig",
        "--driver-name",
        "--leader-elect",
        "--no-leader-elect",
        "--lease-namespace",
        "--lease-name",
        "--http-address",
        "--log-level",
    ):
        assert flag in out


def test_defaults() -> None:
    options = options_from(build_parser().parse_args([]))
    assert options.driver_name == "dradriver.dev"
    assert options.leader_elect
    assert (options.lease_duration, options.renew_deadline, options.retry_period) == (15, 10, 2)
    assert options.lease_name == "dradriver-controller"
    assert options.allocation_drivers == ()  # only claims of its own driver's classes
    given = ["--allocation-driver", "*.test.example.com", "--allocation-driver", "x.example.org"]
    wider = options_from(build_parser().parse_args(given))
    assert wider.allocation_drivers == ("*.test.example.com", "x.example.org")
    assert options.scheduler_catchup == 75  # the reflector's longest wait (60 s) + margin


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--http-address", "nowhere"], "--http-address"),
        (["--workers", "0"], "--workers"),
        (["--allocation-timeout", "0"], "--allocation-timeout must be a positive number"),
        (["--allocation-turn", "-1"], "--allocation-turn must be a positive number"),
        (["--scheduler-catchup", "-1"], "--scheduler-catchup must be 0 (off) or a number"),
        (["--renew-deadline", "20"], "lease_duration must be greater than renew_deadline"),
        (["--retry-period", "9"], "renew_deadline must be greater than retry_period"),
        (["--allocation-driver", "*"], "--allocation-driver '*': name '*' is not a DNS"),
        (["--allocation-driver", "Bad_Name"], "--allocation-driver 'Bad_Name'"),
    ],
)
def test_bad_options_exit_2_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


class _NoServer(KubeClient):
    def __init__(self) -> None:  # never talks to a server
        pass


def test_readiness_standby_needs_synced_caches() -> None:
    async def scenario() -> None:
        app = ControllerApp(Options(driver_name="dradriver.dev"), _NoServer())
        ok, reason = app.ready()
        assert not ok and reason == (
            "caches not synced: resourceclaims, deviceclaimparameters, resourceslices, "
            "deviceclasses, nodes, unscheduled-pods, networkdevicepools"
        )
        app.parameters.last_error = "403 Forbidden"
        assert "deviceclaimparameters (403 Forbidden)" in app.ready()[1]
        for informer in app.informers:
            informer._synced.set()
        ok, reason = app.ready()
        assert ok and reason == "standby with synced caches (leader: none)"

        single = ControllerApp(
            Options(driver_name="dradriver.dev", leader_elect=False), _NoServer()
        )
        assert not single.ready()[0]
        for informer in single.informers:
            informer._synced.set()
        assert single.ready() == (True, "caches synced (no leader election)")

    asyncio.run(scenario())


def test_every_cache_retries_a_failed_list_or_watch_within_a_second() -> None:
    """After an apiserver outage the caches must catch up at once: each informer's retry
    delay stays at most ``RETRY_CAP`` (plus jitter) however many attempts have failed."""

    async def scenario() -> None:
        app = ControllerApp(Options(driver_name="dradriver.dev"), _NoServer())
        for informer in app.informers:
            delays = [informer._backoff.next() for _ in range(20)]  # a long outage
            assert max(delays) <= RETRY_CAP * (1 + informer._backoff.jitter), informer.name

    asyncio.run(scenario())


def test_the_fresh_lanes_worker_starts_when_leadership_is_won_the_slow_lanes_when_needed() -> None:
    """A replica that wins the Lease starts the fresh lane's allocation worker process at
    once: the first claim does not wait for a child to start (about 0.5 s). No claim exists
    here (the informers are never started), so only the leadership can have started it.
    The slow lane's child starts with its first job, at a lower CPU priority (nice +10)."""

    async def scenario() -> None:
        app = ControllerApp(Options(driver_name="dradriver.dev", allocation_workers=2), _NoServer())
        store = LeaseStore()
        config = LeaderElectionConfig(
            "ns", "lease", "me", lease_duration=LEASE, renew_deadline=RENEW, retry_period=RETRY
        )
        app.elector = LeaderElector(store.client(), config, app._lead)
        fresh_worker, slow_worker = app.allocation_workers
        assert (fresh_worker.pid, slow_worker.pid) == (None, None)
        electing = asyncio.create_task(app.elector.run())
        try:
            await eventually("leadership", lambda: app.is_leader())
            await eventually(
                "the fresh lane's child", lambda: fresh_worker.pid is not None, START_TIMEOUT
            )
            fresh = fresh_worker.pid
            assert fresh is not None and fresh != os.getpid()
            os.kill(fresh, 0)  # alive
            assert slow_worker.pid is None  # nothing was slow
            assert app.claims.items() == []
            assert fresh_worker.stats.jobs == 0
            # The slow lane's first job starts its child, at nice +10.
            claim = {"metadata": {"name": "c", "namespace": "ns"}, "spec": {"devices": {}}}
            await slow_worker.allocate(AllocationJob(claim, {}, (), 5.0), SliceSnapshot(1, (), ()))
            slow = slow_worker.pid
            assert slow is not None and slow != fresh
            mine = os.getpriority(os.PRIO_PROCESS, 0)
            await eventually(  # the child lowers its priority first thing as it starts
                "the slow lane's child at nice +10",
                lambda: os.getpriority(os.PRIO_PROCESS, slow) == min(19, mine + SLOW_LANE_NICE),
                START_TIMEOUT,
            )
            assert os.getpriority(os.PRIO_PROCESS, fresh) == mine
        finally:
            electing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await electing
            for w in app.allocation_workers:
                await w.close()

    asyncio.run(scenario())


def test_two_allocation_workers_where_cores_allow() -> None:
    assert allocation_workers(1) == 1 and allocation_workers(2) == 2
    assert allocation_workers(0) == (2 if (os.cpu_count() or 1) >= 2 else 1)
