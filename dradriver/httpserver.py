"""Health, readiness and metrics endpoints: a small HTTP/1.1 server in the driver's loop.

Three GET routes with fixed answers need no web framework, and FastAPI with uvicorn
costs every process that imports them about 12 MiB of memory (the kubelet plugin runs
on every node). The admission webhook, which reads request bodies, keeps FastAPI
(:mod:`dradriver.webhook`).

Every request is hostile until read: its head must arrive within a deadline and fit a
bound (8 KiB, the body is never read), only GET and HEAD are answered, every connection
carries one request (``Connection: close``), and at most :data:`MAX_CONNECTIONS` are
served at once; the others wait their turn.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

from dradriver.metrics import CONTENT_TYPE, Registry

MAX_HEAD_BYTES = 8 * 1024
READ_SECONDS = 10.0
WRITE_SECONDS = 10.0
MAX_CONNECTIONS = 32
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class ProbeApp:
    """What the endpoint answers: ``ready()`` returns (ready?, reason); /readyz answers
    503 with the reason when not ready."""

    ready: Callable[[], tuple[bool, str]]
    registry: Registry
    title: str = "dradriver"

    def respond(self, target: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of ``target``."""
        route = target.split("?", 1)[0]
        if route == "/healthz":
            return 200, TEXT, b"ok\n"
        if route == "/readyz":
            ok, reason = self.ready()
            text = f"{'ok' if ok else 'not ready'}: {reason}\n"
            return (200 if ok else 503), TEXT, text.encode()
        if route == "/metrics":
            return 200, CONTENT_TYPE, self.registry.exposition()
        return 404, TEXT, b"not found\n"


def build_app(
    ready: Callable[[], tuple[bool, str]],
    registry: Registry,
    title: str = "dradriver",
) -> ProbeApp:
    """``ready()`` returns (ready?, reason); /readyz answers 503 with the reason when not."""
    return ProbeApp(ready, registry, title)


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


def _response(status: int, content_type: str, body: bytes, head_only: bool = False) -> bytes:
    reason = HTTPStatus(status).phrase
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + (b"" if head_only else body)


class HTTPEndpoint:
    """Serves the app until stopped; ``port`` is the bound port (useful with port 0).

    ``address`` is ``HOST:PORT`` or ``unix:/path``: a pod in the host's network namespace
    (hostNetwork) serves on a socket in its own filesystem instead, so two pods of a
    DaemonSet on one node (a rolling update with maxSurge) never compete for a host port;
    its probes then run :mod:`dradriver.httpprobe`.
    """

    def __init__(self, app: ProbeApp, address: str, read_seconds: float = READ_SECONDS) -> None:
        self.app = app
        self.unix_path = unix_socket_path(address)
        self.host, self._port = ("", 0) if self.unix_path else parse_address(address)
        self.read_seconds = read_seconds
        self._server: asyncio.Server | None = None
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listen; raises OSError if the address cannot be bound (port taken...)."""
        if self.unix_path is not None:
            self._server = await asyncio.start_unix_server(
                self._accept, self.unix_path, limit=MAX_HEAD_BYTES
            )
            return
        self._server = await asyncio.start_server(
            self._accept, self.host, self._port, limit=MAX_HEAD_BYTES
        )

    @property
    def port(self) -> int:
        sockets = self._server.sockets if self._server is not None else ()
        if self.unix_path is not None or not sockets:
            return 0
        return int(sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        for task in list(self._handlers):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            async with self._slots:
                await self._serve(reader, writer)
        except (ConnectionError, TimeoutError):
            pass  # the client went away or was too slow: nothing to answer
        finally:
            writer.close()
            if task is not None:
                self._handlers.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self.read_seconds):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            writer.write(_response(431, TEXT, b"request head too large\n"))
            return
        except asyncio.IncompleteReadError:
            return  # closed before the head was complete
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not parts[1].startswith(b"/"):
            writer.write(_response(400, TEXT, b"bad request\n"))
        elif parts[0] not in (b"GET", b"HEAD"):
            writer.write(_response(405, TEXT, b"only GET and HEAD\n"))
        else:
            try:
                status, content_type, body = self.app.respond(parts[1].decode("ascii"))
            except UnicodeDecodeError:
                status, content_type, body = 400, TEXT, b"bad request\n"
            except Exception as e:  # a failing readiness check must not kill the server
                # No logger here (this layer is below dradriver.log): the prober sees why.
                status, content_type, body = 500, TEXT, f"internal error: {e!r}\n".encode()
            writer.write(_response(status, content_type, body, head_only=parts[0] == b"HEAD"))
        async with asyncio.timeout(WRITE_SECONDS):
            await writer.drain()
