"""A plain-HTTP endpoint that answers list and watch requests with scripted bytes.

For what a real apiserver sends but cannot be made to send on demand in the unit
tier: an object nested 10,000 levels deep (the apiserver accepts that; writing
one takes a cluster), a watch line that is not JSON. The real
:class:`~dradriver.k8s.client.KubeClient` talks to it over a socket, so its
decoding is what is under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from urllib.parse import parse_qs, urlsplit

from dradriver.k8s.client import Connection, KubeClient

_STATUS_500 = b'{"kind":"Status","code":500,"message":"nothing scripted"}'


class ScriptedHTTPAPIServer:
    """``GET <path>`` answers the next of :attr:`lists`; ``GET <path>?watch=true`` streams the
    next of :attr:`watches` line by line and closes (the watch ends), or, with none left,
    stays open until :meth:`stop`. Requests are recorded as ``(path, query)``."""

    def __init__(self) -> None:
        self.lists: list[bytes] = []
        self.watches: list[list[bytes]] = []
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._server: asyncio.Server | None = None
        self._stopping = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def client(self) -> KubeClient:
        return KubeClient(Connection(server=self.url, tls=ssl.create_default_context()))

    async def stop(self) -> None:
        self._stopping.set()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            target = head.split(b"\r\n", 1)[0].split(b" ")[1].decode()
            url = urlsplit(target)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            self.requests.append((url.path, query))
            if query.get("watch") == "true":
                await self._watch(writer)
            else:
                await self._list(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _list(self, writer: asyncio.StreamWriter) -> None:
        status, body = (b"200 OK", self.lists.pop(0)) if self.lists else (b"500 Error", _STATUS_500)
        writer.write(
            b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
        )
        await writer.drain()

    async def _watch(self, writer: asyncio.StreamWriter) -> None:
        # No Content-Length: the body runs until the connection closes, as a watch does.
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
        )
        if not self.watches:
            await writer.drain()
            await self._stopping.wait()
            return
        for line in self.watches.pop(0):
            writer.write(line.rstrip(b"\n") + b"\n")
        await writer.drain()
