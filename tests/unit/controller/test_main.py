"""dradriver-controller: flags, option checks and readiness (no cluster)."""

from __future__ import annotations

import asyncio

import pytest

from controller.app import RETRY_CAP, ControllerApp, Options
from controller.main import build_parser, main, options_from
from dradriver.k8s.client import KubeClient


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
    assert options.scheduler_catchup == 75  # the reflector's longest wait (60 s) + margin


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--http-address", "nowhere"], "--http-address"),
        (["--workers", "0"], "--workers"),
        (["--allocation-timeout", "0"], "--allocation-timeout must be a positive number"),
        (["--scheduler-catchup", "-1"], "--scheduler-catchup must be 0 (off) or a number"),
        (["--renew-deadline", "20"], "lease_duration must be greater than renew_deadline"),
        (["--retry-period", "9"], "renew_deadline must be greater than retry_period"),
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
