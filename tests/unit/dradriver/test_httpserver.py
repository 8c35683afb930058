"""The health, readiness and metrics endpoint: a real server on a port, real clients.

Hostile clients are real too: a head larger than the bound, a client that never
finishes its head, a method the endpoint does not serve. Whether FastAPI or uvicorn
was imported is checked in a fresh interpreter (this test process may have them).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from dradriver.httpserver import HTTPEndpoint, build_app
from dradriver.metrics import CONTENT_TYPE, Counter, Registry

DEADLINE = 30.0  # for the server to close a connection (never reached when all is well)


class Readiness:
    def __init__(self) -> None:
        self.state: tuple[bool, str] = (False, "not registered with the kubelet")

    def __call__(self) -> tuple[bool, str]:
        return self.state


def endpoint(ready: Callable[[], tuple[bool, str]], read_seconds: float = 10.0) -> HTTPEndpoint:
    registry = Registry()
    Counter("dradriver_test_prepares", "prepares", registry=registry).inc(3)
    return HTTPEndpoint(build_app(ready, registry), "127.0.0.1:0", read_seconds=read_seconds)


async def started(server: HTTPEndpoint) -> AsyncIterator[str]:
    await server.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.stop()


def test_health_readiness_and_metrics() -> None:
    ready = Readiness()

    async def main() -> list[tuple[int, str]]:
        out = []
        async for url in started(endpoint(ready)):
            async with httpx.AsyncClient(base_url=url) as http:
                for path in ("/healthz", "/readyz"):
                    resp = await http.get(path)
                    out.append((resp.status_code, resp.text))
                ready.state = (True, "registered")
                resp = await http.get("/readyz?verbose")
                out.append((resp.status_code, resp.text))
                metrics = await http.get("/metrics")
                out.append((metrics.status_code, metrics.headers["content-type"]))
                assert "dradriver_test_prepares_total 3.0" in metrics.text
                head = await http.head("/healthz")
                out.append((head.status_code, head.text))
                missing = await http.get("/nothing")
                out.append((missing.status_code, missing.text))
                post = await http.post("/healthz", content=b"x")
                out.append((post.status_code, post.text))
        return out

    assert asyncio.run(main()) == [
        (200, "ok\n"),
        (503, "not ready: not registered with the kubelet\n"),
        (200, "ok: registered\n"),
        (200, CONTENT_TYPE),
        (200, ""),
        (404, "not found\n"),
        (405, "only GET and HEAD\n"),
    ]


def test_a_failing_readiness_check_is_a_500_and_the_server_goes_on() -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    async def main() -> list[tuple[int, str]]:
        async for url in started(endpoint(broken)):
            async with httpx.AsyncClient(base_url=url) as http:
                return [
                    ((r := await http.get(p)).status_code, r.text) for p in ("/readyz", "/healthz")
                ]
        return []

    assert asyncio.run(main()) == [(500, "internal error: RuntimeError('boom')\n"), (200, "ok\n")]


async def raw(port: int, data: bytes) -> bytes:
    """Send ``data`` and read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        async with asyncio.timeout(DEADLINE):
            return await reader.read()
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("request_bytes", "answer"),
    [
        (b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * 10_000 + b"\r\n\r\n", b"HTTP/1.1 431 "),
        (b"GARBAGE\r\n\r\n", b"HTTP/1.1 400 "),
        (b"GET healthz HTTP/1.1\r\n\r\n", b"HTTP/1.1 400 "),
        (b"GET /\xff HTTP/1.1\r\n\r\n", b"HTTP/1.1 400 "),
        (b"GET /healthz HTTP/1.1\r\n", b""),  # never finished: closed after the deadline
    ],
    ids=["head-too-large", "no-request-line", "not-a-path", "not-ascii", "slow-client"],
)
def test_a_hostile_request_gets_an_error_or_a_closed_connection(
    request_bytes: bytes, answer: bytes
) -> None:
    async def main() -> bytes:
        server = endpoint(Readiness(), read_seconds=0.5)
        async for _ in started(server):
            return await raw(server.port, request_bytes)
        return b"?"

    got = asyncio.run(main())
    assert got.startswith(answer) if answer else got == b""


def test_serving_probes_imports_no_web_framework() -> None:
    script = (
        "import sys\nimport dradriver.httpserver\n"
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'starlette') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
