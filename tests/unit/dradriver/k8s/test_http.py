"""The asyncio HTTP/1.1 transport of KubeClient (dradriver.k8s.http) against a real server.

The server is a real TCP server on loopback that answers each request with bytes the test
scripts, so framing (Content-Length, chunked, close-delimited), keep-alive, a connection
closed while idle, malformed answers and timeouts are all exercised over a socket.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from dradriver.k8s.http import ConnectionPool, TransportError, TransportTimeout


@dataclass
class Request:
    connection: int
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


# What the server does with a request: the bytes to send back, or None to close the
# connection without an answer. It may await (to hold an answer back).
Script = Callable[[Request], Awaitable[bytes | None]]


@dataclass
class Server:
    script: Script
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # set at each request
    port: int = 0

    async def until_requests(self, count: int) -> None:
        while len(self.requests) < count:
            self.arrived.clear()
            await self.arrived.wait()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                first, *lines = head.decode("latin-1")[:-4].split("\r\n")
                method, target, _ = first.split(" ")
                headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                request = Request(number, method, target, headers, body)
                self.requests.append(request)
                self.arrived.set()
                answer = await self.script(request)
                if answer is None:
                    return
                writer.write(answer)
                await writer.drain()
                if b"Connection: close" in answer:
                    return
        finally:
            self.open_now -= 1
            writer.close()
            self.closed.set()


_listening: list[asyncio.Server] = []


async def start(script: Script) -> Server:
    """A server answering by ``script``, closed when the test's ``run`` ends."""
    state = Server(script)
    srv = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    state.port = srv.sockets[0].getsockname()[1]
    _listening.append(srv)
    return state


def pool(server: Server, **kwargs: float) -> ConnectionPool:
    return ConnectionPool(f"http://127.0.0.1:{server.port}", ssl.create_default_context(), **kwargs)  # type: ignore[arg-type]


def answer(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    async def main() -> None:
        try:
            await asyncio.wait_for(test(), 30)
        finally:
            while _listening:
                _listening.pop().close()

    asyncio.run(main())


async def echo(request: Request) -> bytes:
    return answer(f"{request.method} {request.target} {request.body.decode()}".encode())


def test_keep_alive_reuses_one_connection_and_sends_the_request_as_given() -> None:
    async def body() -> None:
        server = await start(echo)
        http = pool(server)
        first = await http.request("GET", "/a?x=1", {"Accept": "*/*"})
        second = await http.request("POST", "/b", {"Content-Type": "application/json"}, b'{"k":1}')
        await http.aclose()
        assert (first.status, first.content) == (200, b"GET /a?x=1 ")
        assert second.content == b'POST /b {"k":1}'
        assert [r.connection for r in server.requests] == [1, 1]
        assert http.opened == 1
        assert server.requests[1].headers["content-length"] == "7"
        assert server.requests[0].headers["host"] == f"127.0.0.1:{server.port}"

    run(body)


def test_chunked_and_close_delimited_bodies_are_read_whole() -> None:
    async def body() -> None:
        async def script(request: Request) -> bytes:
            if request.target == "/chunked":
                return (
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n"
                )
            return b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end"

        server = await start(script)
        http = pool(server)
        chunked = await http.request("GET", "/chunked", {})
        again = await http.request("GET", "/chunked", {})
        closing = await http.request("GET", "/close", {})
        after = await http.request("GET", "/chunked", {})
        await http.aclose()
        assert chunked.content == again.content == after.content == b"hello world"
        assert closing.content == b"until the end"
        # Chunked answers keep the connection; the close-delimited one ends it.
        assert [r.connection for r in server.requests] == [1, 1, 1, 2]

    run(body)


def test_a_connection_the_server_closed_while_idle_is_not_an_error_for_a_get() -> None:
    async def body() -> None:
        answered: list[int] = []

        async def script(request: Request) -> bytes | None:
            # The second request on a connection finds it closed (the server's idle timeout
            # racing the request): no answer, the socket closes.
            if sum(1 for r in server.requests if r.connection == request.connection) == 2:
                return None
            answered.append(request.connection)
            return answer(b"ok")

        server = await start(script)
        http = pool(server)
        assert (await http.request("GET", "/x", {})).content == b"ok"
        assert (await http.request("GET", "/x", {})).content == b"ok"
        assert answered == [1, 2]  # sent again on a new connection
        # A POST is not sent twice: it may have been acted on.
        with pytest.raises(TransportError, match="POST /y: connection closed"):
            await http.request("POST", "/y", {}, b"{}")
        await http.aclose()

    run(body)


def test_malformed_answers_and_silence_are_transport_errors() -> None:
    async def body() -> None:
        hold = asyncio.Event()

        async def script(request: Request) -> bytes | None:
            if request.target == "/garbage":
                return b"SMTP ready\r\n\r\n"
            if request.target == "/bad-chunk":
                return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
            if request.target == "/short":
                return b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 10\r\n\r\nabc"
            await hold.wait()
            return None

        server = await start(script)
        http = pool(server, read_timeout=0.2)
        with pytest.raises(TransportError, match="GET /garbage: malformed response head"):
            await http.request("GET", "/garbage", {})
        with pytest.raises(TransportError, match="malformed chunk size"):
            await http.request("GET", "/bad-chunk", {})
        with pytest.raises(TransportError, match="closed before the answer was complete"):
            await http.request("GET", "/short", {})
        with pytest.raises(TransportTimeout, match="GET /silent: no answer") as timed_out:
            await http.request("GET", "/silent?token=secret", {})
        assert isinstance(timed_out.value, TimeoutError)
        assert "secret" not in str(timed_out.value)  # the query is not logged
        hold.set()
        with pytest.raises(ValueError, match="line breaks"):
            await http.request("GET", "/x", {"X-Evil": "a\r\nHost: elsewhere"})
        await http.aclose()

    run(body)


def test_nothing_listening_is_a_transport_error_naming_the_server() -> None:
    async def body() -> None:
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        http = ConnectionPool(f"http://127.0.0.1:{port}", ssl.create_default_context())
        with pytest.raises(TransportError, match=f"connecting to 127.0.0.1:{port}"):
            await http.request("GET", "/", {})

    run(body)


def test_a_cancelled_request_closes_its_connection() -> None:
    async def body() -> None:
        release = asyncio.Event()

        async def script(request: Request) -> bytes:
            if request.target == "/slow":
                await release.wait()
            return answer(b"ok")

        server = await start(script)
        http = pool(server)
        task = asyncio.create_task(http.request("GET", "/slow", {}))
        await server.until_requests(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        # The late answer to /slow is never read as the answer to the next request.
        assert (await http.request("GET", "/next", {})).content == b"ok"
        assert [r.connection for r in server.requests] == [1, 2]
        await http.aclose()

    run(body)


def test_at_most_max_connections_are_open() -> None:
    async def body() -> None:
        release = asyncio.Event()

        async def script(request: Request) -> bytes:
            await release.wait()
            return answer(request.target.encode())

        server = await start(script)
        http = pool(server, max_connections=2)
        tasks = [asyncio.create_task(http.request("GET", f"/{i}", {})) for i in range(6)]
        await server.until_requests(2)
        release.set()
        results = await asyncio.gather(*tasks)
        await http.aclose()
        assert sorted(r.content for r in results) == [f"/{i}".encode() for i in range(6)]
        assert server.most_open == 2 and http.opened == 2

    run(body)


def test_a_stream_hands_out_chunks_as_they_arrive() -> None:
    async def body() -> None:
        got_first = asyncio.Event()

        async def script(request: Request) -> bytes | None:
            return None  # the stream's answer is written by the handler below

        server = await start(script)

        async def watch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nevent1\r\n")
            await writer.drain()
            await got_first.wait()  # the second event only after the client saw the first
            writer.write(b"6\r\nevent2\r\n0\r\n\r\n")
            await writer.drain()
            await reader.read()
            writer.close()

        srv = await asyncio.start_server(watch, "127.0.0.1", 0)
        server.port = srv.sockets[0].getsockname()[1]
        http = pool(server)
        seen = []
        async with http.stream("GET", "/watch", {}) as response:
            assert response.status == 200
            async for chunk in response.aiter_bytes():
                seen.append(chunk)
                got_first.set()
        assert seen == [b"event1", b"event2"]
        await http.aclose()
        srv.close()

    run(body)


def test_the_two_apps_load_no_http_or_kubernetes_client_library() -> None:
    # Their imports are RSS a process never gives back (bench.plugin_rss): the apps talk to
    # the apiserver through this transport, httpx is the dev tools' sync client only.
    # dradriver.metrics writes /metrics: prometheus_client's exposition module would load
    # the standard library's HTTP servers and clients with it. (The email package itself
    # stays: pydantic's plugin loader imports importlib.metadata, which needs it.)
    script = (
        "import sys\nimport kubeletplugin.main, controller.main\n"
        "heavy = ('httpx', 'httpcore', 'anyio', 'kubernetes', 'fastapi', 'uvicorn',\n"
        "         'prometheus_client', 'http.server', 'http.client', 'wsgiref',\n"
        "         'urllib.request', 'email.parser', 'email.feedparser')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
