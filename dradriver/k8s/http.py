"""HTTP/1.1 for the apiserver on asyncio streams: what :class:`~dradriver.k8s.client.KubeClient`
needs from HTTP, and nothing else.

Why not httpx here: its layers (client, httpcore's pool, anyio's TLS stream, h11) cost
about as much CPU per request as the apiserver's own work (a claim GET on loopback:
3.8 ms p50 through httpx, 1.9 ms through this module, same connection settings), and its
imports about 11 MiB of RSS that a long-running process never gives back. The node
plugin makes at least one request per prepared claim and the controller several per
allocated claim, so both pay it on their hot paths. (The blocking
:class:`~dradriver.k8s.client.SyncKubeClient` of the dev tools runs over it too.)

Scope: requests with a body or without, responses framed by Content-Length, chunked
transfer coding or the end of the connection; streamed responses (watches); keep-alive
connections in a bounded pool (LIFO, so a burst reuses the warmest ones), plain ``http``
(tests, proxies on loopback) or TLS with the caller's context. No redirects, cookies,
proxies, compression (none is asked for: on loopback gzip only costs both sides CPU) or
HTTP/2.

Failures that leave the request without an answer raise :class:`TransportError` (an
``OSError``), timeouts :class:`TransportTimeout` (also a ``TimeoutError``); an answer,
whatever its status, is a :class:`Response`. A request that failed on a reused connection
before any byte of the answer arrived (the server closed it while it sat idle) is sent
once more on a new connection if its method is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

# Past this an idle connection is closed rather than reused: the apiserver drops idle
# connections after 90 s, and a request racing that close would fail.
IDLE_SECONDS = 60.0
# Response heads and chunk-size lines longer than this are refused as malformed.
LINE_LIMIT = 1 << 20
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class TransportError(OSError):
    """No answer: the connection could not be made, broke, or carried no valid response."""


class TransportTimeout(TransportError, TimeoutError):
    """No answer within the connect or read timeout."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]  # names lower-cased; a repeated header's values joined by ", "
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.requests = 0
        self.idle_since = time.monotonic()

    def reusable(self) -> bool:
        return (
            not self.writer.is_closing()
            and not self.reader.at_eof()
            and time.monotonic() - self.idle_since < IDLE_SECONDS
        )

    def close(self) -> None:
        self.writer.close()


class _Head:
    """Status and headers of a response, and how its body is framed."""

    def __init__(self, raw: bytes, method: str) -> None:
        try:
            text = raw.decode("latin-1")
            status_line, *lines = text[:-4].split("\r\n")
            version, code, *_ = status_line.split(" ", 2)
            if not version.startswith("HTTP/1."):
                raise ValueError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
            self.status = int(code)
        except (ValueError, IndexError) as e:
            raise TransportError(f"malformed response head: {e}") from None
        headers: dict[str, str] = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if not sep:
                raise TransportError(f"malformed response header: {line[:80]!r}")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        self.headers = headers
        connection = headers.get("connection", "").lower()
        self.keep_alive = version == "HTTP/1.1" and "close" not in connection
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.length: int | None = None
        if method == "HEAD" or self.status in (204, 304) or 100 <= self.status < 200:
            self.length = 0
        elif not self.chunked and "content-length" in headers:
            try:
                self.length = int(headers["content-length"])
            except ValueError:
                raise TransportError("malformed Content-Length") from None
            if self.length < 0:
                raise TransportError("negative Content-Length")
        if not self.chunked and self.length is None:
            self.keep_alive = False  # the body ends where the connection does


class StreamedResponse:
    """A response whose body is read as it arrives (:meth:`aiter_bytes`)."""

    def __init__(self, head: _Head, conn: _Connection, read_timeout: float) -> None:
        self.status = head.status
        self.headers: Mapping[str, str] = head.headers
        self._head = head
        self._conn = conn
        self._read_timeout = read_timeout
        self.complete = False  # the whole body was read: the connection may be reused

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        reader = self._conn.reader
        try:
            if self._head.chunked:
                async for data in _chunks(reader, self._read_timeout):
                    yield data
            elif self._head.length is not None:
                left = self._head.length
                while left:
                    async with asyncio.timeout(self._read_timeout):
                        data = await reader.read(min(left, 1 << 16))
                    if not data:
                        raise TransportError("connection closed inside the response body")
                    left -= len(data)
                    yield data
            else:
                while True:
                    async with asyncio.timeout(self._read_timeout):
                        data = await reader.read(1 << 16)
                    if not data:
                        break
                    yield data
        except TimeoutError:
            raise TransportTimeout("no data from the server within the read timeout") from None
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            raise TransportError(f"malformed or truncated response body: {e}") from None
        except ConnectionError as e:
            raise TransportError(f"connection lost: {e}") from None
        self.complete = True

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_bytes()])


async def _chunks(reader: asyncio.StreamReader, read_timeout: float | None) -> AsyncIterator[bytes]:
    """A chunked body's chunks, up to and past its trailers; each chunk read within
    ``read_timeout`` (None: the caller bounds the whole answer)."""
    while True:
        async with asyncio.timeout(read_timeout):
            size = _chunk_size(await reader.readuntil(b"\r\n"))
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
                return
            data = await reader.readexactly(size + 2)
        if data[-2:] != b"\r\n":
            raise TransportError("chunk not followed by CRLF")
        yield data[:-2]


def _chunk_size(line: bytes) -> int:
    try:
        size = int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise TransportError(f"malformed chunk size {line[:40]!r}") from None
    if size < 0:
        raise TransportError("negative chunk size")
    return size


class ConnectionPool:
    """Keep-alive connections to one server; at most ``max_connections`` open at once
    (more requests wait for one). A streamed response holds its connection until its
    ``stream`` block ends."""

    def __init__(
        self,
        base_url: str,
        tls: ssl.SSLContext,
        max_connections: int = 100,
        connect_timeout: float = 30.0,
        read_timeout: float = 330.0,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"server {base_url!r}: an http:// or https:// URL is needed")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = tls if url.scheme == "https" else None
        self.host_header = url.netloc
        self.prefix = url.path.rstrip("/")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._closed = False
        self.opened = 0  # connections made (tests, metrics)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def request(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None = None
    ) -> Response:
        """Send one request and read the whole answer."""
        data = self._encode(method, target, headers, body)
        async with self._slots:
            for attempt in (1, 2):
                conn = await self._checkout()
                received = False
                try:
                    await self._send(conn, data)
                    async with asyncio.timeout(self.read_timeout):
                        raw = await conn.reader.readuntil(b"\r\n\r\n")
                        received = True
                        head = _Head(raw, method)
                        content = await self._read_body(conn, head)
                except Exception as e:
                    conn.close()
                    stale = attempt == 1 and conn.requests > 1 and not received and _is_stale(e)
                    if stale and method in IDEMPOTENT:
                        continue
                    raise _transport_error(e, method, target) from e
                except BaseException:  # cancelled: what the connection carries is unknown
                    conn.close()
                    raise
                self._checkin(conn, head.keep_alive)
                return Response(head.status, head.headers, content)
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, target: str, headers: Mapping[str, str]
    ) -> AsyncIterator[StreamedResponse]:
        """Send a request and hand out the answer while its body is still arriving."""
        data = self._encode(method, target, headers, None)
        async with self._slots:
            conn = await self._checkout()
            try:
                await self._send(conn, data)
                async with asyncio.timeout(self.read_timeout):
                    head = _Head(await conn.reader.readuntil(b"\r\n\r\n"), method)
            except Exception as e:
                conn.close()
                raise _transport_error(e, method, target) from e
            except BaseException:
                conn.close()
                raise
            response = StreamedResponse(head, conn, self.read_timeout)
            try:
                yield response
            except BaseException:
                conn.close()
                raise
            if response.complete:
                self._checkin(conn, head.keep_alive)
            else:  # left before the end of the body: what is still coming is unread
                conn.close()

    async def _checkout(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable():
                conn.requests += 1
                return conn
            conn.close()
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self.tls,
                    server_hostname=self.host if self.tls is not None else None,
                    limit=LINE_LIMIT,
                )
        except TimeoutError:
            raise TransportTimeout(
                f"connecting to {self.host_header}: no answer in {self.connect_timeout:g} s"
            ) from None
        except OSError as e:  # refused, unreachable, TLS (ssl.SSLError is an OSError)
            raise TransportError(f"connecting to {self.host_header}: {e}") from e
        self.opened += 1
        conn = _Connection(reader, writer)
        conn.requests = 1
        return conn

    def _checkin(self, conn: _Connection, keep_alive: bool) -> None:
        if keep_alive and not self._closed and conn.reusable():
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()

    def _encode(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None
    ) -> bytes:
        lines = [f"{method} {self.prefix}{target} HTTP/1.1", f"Host: {self.host_header}"]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r}: line breaks are not allowed")
            lines.append(f"{name}: {value}")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head + body if body else head

    @staticmethod
    async def _send(conn: _Connection, data: bytes) -> None:
        conn.writer.write(data)
        await conn.writer.drain()

    async def _read_body(self, conn: _Connection, head: _Head) -> bytes:
        reader = conn.reader
        if head.chunked:
            return b"".join([chunk async for chunk in _chunks(reader, None)])
        if head.length is not None:
            return await reader.readexactly(head.length) if head.length else b""
        return await reader.read()  # until the server closes


def _is_stale(e: Exception) -> bool:
    """The server had closed the connection before the request reached it."""
    return isinstance(e, asyncio.IncompleteReadError | ConnectionError) and not (
        isinstance(e, asyncio.IncompleteReadError) and e.partial
    )


def _transport_error(e: Exception, method: str, target: str) -> TransportError:
    """``e`` as the TransportError it means, naming the request (not its query)."""
    where = f"{method} {target.split('?', 1)[0]}"
    if isinstance(e, TimeoutError):
        return TransportTimeout(f"{where}: no answer within the read timeout")
    if isinstance(e, asyncio.IncompleteReadError):
        return TransportError(f"{where}: connection closed before the answer was complete")
    if isinstance(e, asyncio.LimitOverrunError):
        return TransportError(f"{where}: response head longer than {LINE_LIMIT} bytes")
    return TransportError(f"{where}: {e or type(e).__name__}")
