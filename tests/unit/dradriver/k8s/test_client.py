"""The REST client's two faces: KubeClient (asyncio) and SyncKubeClient send the same
requests and turn the answers into the same results and errors.

The server is a real HTTP server on loopback that records what it receives, so the
requests are checked as they go over the wire.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from dradriver.k8s.client import Connection, KubeClient, SyncKubeClient
from dradriver.k8s.errors import KubeAPIError
from dradriver.k8s.objects import Obj


@dataclass(frozen=True)
class Received:
    method: str
    target: str
    content_type: str | None
    accept: str | None
    authorization: str | None
    body: Any
    raw: bytes


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        self.server.received.append(
            Received(
                self.command,
                self.path,
                self.headers.get("Content-Type"),
                self.headers.get("Accept"),
                self.headers.get("Authorization"),
                json.loads(raw) if raw else None,
                raw,
            )
        )
        if self.path.startswith("/missing"):
            status, body = 404, json.dumps({"reason": "NotFound", "message": "not there"})
        elif self.path.startswith("/text"):
            status, body = 200, "ok"
        elif self.path.startswith("/broken"):
            status, body = 500, "internal error"
        else:
            status, body = 200, json.dumps({"kind": "Echo", "method": self.command})
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    received: list[Received]


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.received = []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def connection(srv: _Server) -> Connection:
    host, port = srv.server_address[:2]
    return Connection(
        server=f"http://{host!s}:{port}", tls=ssl.create_default_context(), token="t0k"
    )


CM: Obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
# (method name, args, kwargs): every public call both clients have, with the answers
# that need decoding (404, non-JSON success, non-JSON failure).
CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("get", ("/ok",), {"labelSelector": "a=b"}),
    ("list", ("/ok",), {"limit": 5}),
    ("create", ("/ok", {"a": 1}), {}),
    ("replace", ("/ok", {"a": 2}), {}),
    ("merge_patch", ("/ok", {"b": None}), {}),
    ("apply", ("/ok", CM, "tester"), {}),
    ("apply", ("/ok", CM, "tester"), {"force": False}),
    ("request", ("GET", "/ok"), {"accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}),
    ("request", ("DELETE", "/ok", {"gracePeriodSeconds": 0}), {}),
    ("delete", ("/ok",), {"propagationPolicy": "Foreground"}),
    ("get_or_none", ("/missing",), {}),
    ("delete", ("/missing",), {}),
    ("delete", ("/missing",), {"missing_ok": False}),
    ("get", ("/missing",), {}),
    ("get", ("/text",), {}),
    ("get", ("/broken",), {}),
]


def run_sync(srv: _Server) -> tuple[list[Any], int]:
    """Each call's result, or the error it raised as (status, reason, body)."""
    results: list[Any] = []
    with SyncKubeClient(connection(srv)) as client:
        for name, args, kwargs in CALLS:
            try:
                results.append(("ok", getattr(client, name)(*args, **kwargs)))
            except KubeAPIError as e:
                results.append(("error", e.status, e.reason, e.body))
    return results, client.write_count


async def run_async(srv: _Server) -> tuple[list[Any], int]:
    client = KubeClient(connection(srv))
    results: list[Any] = []
    try:
        for name, args, kwargs in CALLS:
            try:
                results.append(("ok", await getattr(client, name)(*args, **kwargs)))
            except KubeAPIError as e:
                results.append(("error", e.status, e.reason, e.body))
    finally:
        await client.aclose()
    return results, client.write_count


def test_both_clients_send_the_same_requests_and_decode_alike(server: _Server) -> None:
    sync_results, sync_writes = run_sync(server)
    sync_requests = list(server.received)
    server.received.clear()
    async_results, async_writes = asyncio.run(run_async(server))
    assert server.received == sync_requests
    assert async_results == sync_results
    assert async_writes == sync_writes == 9  # all but the GETs


def test_requests_and_answers_on_the_wire(server: _Server) -> None:
    results, _ = run_sync(server)
    sent = server.received
    assert len(sent) == len(results) == len(CALLS)
    assert sent[0].target == "/ok?labelSelector=a%3Db"
    assert sent[0].authorization == "Bearer t0k"
    assert sent[0].content_type is None and sent[0].body is None
    assert results[0] == ("ok", {"kind": "Echo", "method": "GET"})
    assert (sent[2].content_type, sent[2].body) == ("application/json", {"a": 1})
    # Compact JSON: the apiserver keeps opaque config bytes as sent, and a spaced copy
    # makes every later merge patch of the claim an "immutable spec" change.
    assert sent[2].raw == b'{"a":1}'
    assert sent[4].content_type == "application/merge-patch+json"
    assert (sent[5].method, sent[5].content_type, sent[5].body) == (
        "PATCH",
        "application/apply-patch+yaml",
        CM,
    )
    assert sent[5].target == "/ok?fieldManager=tester&force=true"
    assert sent[6].target == "/ok?fieldManager=tester&force=false"
    assert sent[7].accept == "application/json;as=Table;v=v1;g=meta.k8s.io"
    assert sent[8].body == {"gracePeriodSeconds": 0}
    assert sent[9].target == "/ok?propagationPolicy=Foreground"
    assert results[10] == ("ok", None)  # get_or_none of a 404
    assert results[11] == ("ok", None)  # deleting what is gone is fine by default
    not_found = ("error", 404, "NotFound", {"reason": "NotFound", "message": "not there"})
    assert results[12] == results[13] == not_found
    assert results[14] == ("ok", {"message": "ok"})  # a success that is not JSON
    assert results[15] == ("error", 500, "", {"message": "internal error"})


def test_plain_text_answers_and_their_refusals(server: _Server) -> None:
    with SyncKubeClient(connection(server)) as client:
        assert client.get_text("/text", limitBytes=10) == "ok"
        with pytest.raises(KubeAPIError) as refused:
            client.get_text("/broken")
    assert refused.value.status == 500 and refused.value.body == {"message": "internal error"}
    assert server.received[0].target == "/text?limitBytes=10"
    assert server.received[0].authorization == "Bearer t0k"


def test_the_sync_client_works_under_a_running_event_loop(server: _Server) -> None:
    # Its requests run on a loop of its own, so a caller inside a coroutine (a test, a
    # dev tool's async main) can still block on it.
    async def caller() -> Obj:
        with SyncKubeClient(connection(server)) as client:
            return client.get("/ok")

    assert asyncio.run(caller()) == {"kind": "Echo", "method": "GET"}


def test_a_closed_sync_client_can_be_closed_again(server: _Server) -> None:
    client = SyncKubeClient(connection(server))
    client.close()
    client.close()
