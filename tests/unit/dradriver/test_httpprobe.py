"""The HTTP endpoint on a unix socket and the exec probe that reads it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dradriver import httpprobe
from dradriver.httpserver import HTTPEndpoint, build_app, unix_socket_path
from dradriver.metrics import Registry


def test_a_unix_socket_endpoint_answers_the_probe(tmp_path: Path) -> None:
    sock = tmp_path / "http.sock"
    state = {"ready": False}

    def ready() -> tuple[bool, str]:
        return state["ready"], "registered" if state["ready"] else "not registered yet"

    async def scenario() -> list[tuple[bool, str]]:
        endpoint = HTTPEndpoint(build_app(ready, Registry()), f"unix:{sock}")
        await endpoint.start()
        try:
            answers = [await asyncio.to_thread(httpprobe.probe, f"unix:{sock}", "/readyz")]
            state["ready"] = True
            answers.append(await asyncio.to_thread(httpprobe.probe, f"unix:{sock}", "/readyz"))
            answers.append(await asyncio.to_thread(httpprobe.probe, f"unix:{sock}", "/healthz"))
            return answers
        finally:
            await endpoint.stop()

    assert asyncio.run(scenario()) == [
        (False, "503 not ready: not registered yet"),
        (True, "200 ok: registered"),
        (True, "200 ok"),
    ]


def test_the_probe_fails_without_a_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert httpprobe.main([f"unix:{tmp_path / 'none.sock'}", "/readyz"]) == 1
    assert "No such file or directory" in capsys.readouterr().err
    assert httpprobe.main(["127.0.0.1:8080", "/readyz"]) == 1
    assert httpprobe.main(["unix:/x"]) == 2


@pytest.mark.parametrize("address", ["unix:relative.sock", "unix:/" + "a" * 120])
def test_a_bad_socket_address_is_refused(address: str) -> None:
    with pytest.raises(ValueError, match="unix socket needs an absolute path"):
        unix_socket_path(address)
    assert unix_socket_path("127.0.0.1:8080") is None
