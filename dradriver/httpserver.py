"""Health, readiness and metrics endpoints (FastAPI), served by uvicorn in the driver's loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def build_app(
    ready: Callable[[], tuple[bool, str]],
    registry: CollectorRegistry,
    title: str = "dradriver",
) -> FastAPI:
    """``ready()`` returns (ready?, reason); /readyz answers 503 with the reason when not."""
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok\n", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        ok, reason = ready()
        return Response(
            f"{'ok' if ok else 'not ready'}: {reason}\n",
            media_type="text/plain",
            status_code=200 if ok else 503,
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


UNIX_PREFIX = "unix:"


def unix_socket_path(address: str) -> str | None:
    """The socket path of ``unix:/abs/path``, else None (a TCP address)."""
    if not address.startswith(UNIX_PREFIX):
        return None
    path = address.removeprefix(UNIX_PREFIX)
    if not path.startswith("/") or "\0" in path or len(path.encode()) > 107:
        raise ValueError(f"address {address!r}: a unix socket needs an absolute path (<108 bytes)")
    return path


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` (host may be empty for all interfaces)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"address {address!r} must look like HOST:PORT, e.g. 127.0.0.1:8080")
    return host or "0.0.0.0", int(port)


class HTTPEndpoint:
    """Runs the app until stopped; ``port`` is the bound port (useful with port 0).

    ``address`` is ``HOST:PORT`` or ``unix:/path``: a pod in the host's network namespace
    (hostNetwork) serves on a socket in its own filesystem instead, so two pods of a
    DaemonSet on one node (a rolling update with maxSurge) never compete for a host port;
    its probes then run :mod:`dradriver.httpprobe`.
    """

    def __init__(self, app: FastAPI, address: str) -> None:
        uds = unix_socket_path(address)
        if uds is not None:
            config = uvicorn.Config(
                app, uds=uds, log_level="warning", access_log=False, lifespan="off"
            )
        else:
            host, port = parse_address(address)
            config = uvicorn.Config(
                app, host=host, port=port, log_level="warning", access_log=False, lifespan="off"
            )
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                await self._task  # re-raise why it could not start (port taken...)
                raise RuntimeError("HTTP endpoint stopped during start-up")
            await asyncio.sleep(0.01)

    @property
    def port(self) -> int:
        sockets = self._server.servers[0].sockets if self._server.servers else []
        return int(sockets[0].getsockname()[1]) if sockets else 0

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
