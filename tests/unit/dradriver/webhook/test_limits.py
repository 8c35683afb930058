"""The webhook's limits as flags of dradriver-webhook and dradriver-controller: parsed,
checked (an out-of-range value names its flag) and in force in the app they build."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from bench.webhook import claim, review
from controller.app import ControllerApp
from controller.main import build_parser as controller_parser
from controller.main import main as controller_main
from controller.main import options_from
from dradriver.k8s.client import KubeClient
from dradriver.webhook import limits
from dradriver.webhook.pool import PoolLimits
from dradriver.webhook.server import app_from_args
from dradriver.webhook.server import build_parser as webhook_parser
from dradriver.webhook.server import main as webhook_main

TIGHT = {
    "max-body-bytes": "70000",
    "max-selectors": "2",
    "max-selector-bytes": "5000",
    "small-body-bytes": "1000",
    "small-workers": "1",
    "small-queue": "3",
    "large-workers": "1",
    "large-queue": "0",
    "review-timeout": "2.5",
}


def argv(prefix: str, values: dict[str, str]) -> list[str]:
    return [f"--{prefix}{name}={value}" for name, value in values.items()]


class _NoServer(KubeClient):
    def __init__(self) -> None:  # never talks to a server
        pass


def controller_app(extra: list[str]) -> FastAPI:
    async def build() -> FastAPI:
        options = options_from(controller_parser().parse_args(extra))
        return ControllerApp(options, _NoServer()).webhook_app()

    return asyncio.run(build())


def assert_tight_limits_in_force(app: FastAPI) -> None:
    """The app enforces TIGHT: the body limit, the selector budget, the lanes."""
    pool = app.state.pool
    assert pool.limits == PoolLimits(
        small_body_bytes=1000,
        small_workers=1,
        small_queue=3,
        large_workers=1,
        large_queue=0,
        timeout=2.5,
    )
    assert (pool.small.capacity, pool.large.capacity, pool.small.deadline) == (4, 1, 2.5)
    with TestClient(app) as client:
        too_big = client.post("/validate", content=b"x" * 70001)
        assert too_big.status_code == 413 and "at most 70000 bytes" in too_big.text
        answer = client.post("/validate", content=review(claim(["true"] * 3))).json()
        assert answer["response"]["allowed"] is False
        assert "more than 2 CEL selectors" in answer["response"]["status"]["message"]
        ok = client.post("/validate", content=review(claim(["true"] * 2))).json()
        assert ok["response"]["allowed"] is True


def test_dradriver_webhook_flags_reach_the_app() -> None:
    app = app_from_args(webhook_parser().parse_args(argv("", TIGHT)))
    try:
        assert_tight_limits_in_force(app)
    finally:
        app.state.pool.close()


def test_controller_flags_reach_its_webhook_app() -> None:
    app = controller_app(argv("webhook-", TIGHT))
    try:
        assert_tight_limits_in_force(app)
    finally:
        app.state.pool.close()


def test_defaults_are_the_modules_defaults() -> None:
    given = limits.from_args(controller_parser().parse_args([]), "webhook-")
    assert given == limits.WebhookLimits()
    assert given.max_body_bytes == 3 * 1024 * 1024 and given.pool == PoolLimits()


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("max-body-bytes", "3", "max-body-bytes: 3 is out of range; give at least 65536"),
        ("max-selectors", "0", "max-selectors: 0 is out of range; give at least 1"),
        ("small-workers", "0", "small-workers: 0 is out of range; give at least 1"),
        ("large-queue", "-1", "large-queue: -1 is out of range; give at least 0"),
        ("review-timeout", "0", "review-timeout: 0 is out of range; give seconds above 0"),
        ("review-timeout", "30", "below 30 (the apiserver waits at most that long)"),
        ("small-body-bytes", "3145728", "small-body-bytes: 3145728 is not below"),
    ],
)
def test_out_of_range_values_name_the_flag(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert controller_main([f"--webhook-{flag}={value}"]) == 2
    err = capsys.readouterr().err
    assert f"--webhook-{flag}" in err and message.split(": ", 1)[-1] in err
    with pytest.raises(SystemExit) as info:
        webhook_main(["--cert=/nonexistent", "--key=/nonexistent", f"--{flag}={value}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"--{flag}" in err and message.split(": ", 1)[-1] in err


def test_help_describes_every_limit(capsys: pytest.CaptureFixture[str]) -> None:
    for main, prefix in ((controller_main, "--webhook-"), (webhook_main, "--")):
        with pytest.raises(SystemExit):
            main(["--help"])
        out = " ".join(capsys.readouterr().out.split())
        for name in TIGHT:
            assert f"{prefix}{name}" in out
        assert "get HTTP 413 before they are read" in out
        assert "one more gets a 429 denial at once" in out
