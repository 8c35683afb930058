"""The admission webhook under hostile load: latency of a small review while floods and
slow reviews are in flight.

``python -m bench.webhook [--floods 10] [--flood-mib 10] [--slow 3] [--slow-mib 1.35]
[--small 20]``

Serves the real app over TLS on 127.0.0.1 (a throw-away CA), then runs ``--floods``
clients sending ``--flood-mib`` bodies (half with a Content-Length, half chunked; refused
with 413) and ``--slow`` valid reviews of ``--slow-mib`` whose CEL selectors fill the
per-review budget, and meanwhile sends ``--small`` ordinary reviews one after another.
Prints a table: the small reviews' latency (p50, p99, max) idle and under load, how the
floods were answered and how long the slow reviews took. The helpers (raw HTTP/1.1
clients, slow claims) are also used by ``tests/unit/dradriver/webhook``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from bench.common import ms, percentile, table
from devtools.cluster.pki import CertificateAuthority, CertPair
from devtools.harness.webhook import issue_serving_cert
from dradriver.k8s.objects import Obj
from dradriver.webhook.app import build_app
from dradriver.webhook.server import WebhookServer

SMOKE_ARGS = ("--floods", "4", "--flood-mib", "5", "--slow", "1", "--small", "5")
CLUSTER = "none"  # needs no cluster

DRIVER = "dradriver.dev"
MIB = 1024 * 1024


@asynccontextmanager
async def served(app: FastAPI, cert: Path, key: Path) -> AsyncIterator[WebhookServer]:
    server = WebhookServer(app, "127.0.0.1:0", cert, key)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def client_context(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """Status and body of one HTTP/1.1 response (Content-Length framed)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def post(
    port: int, tls: ssl.SSLContext, body: bytes, path: str = "/validate"
) -> tuple[int, bytes]:
    """One POST on a new connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        return await read_response(reader)
    finally:
        writer.close()


async def flood(
    port: int, tls: ssl.SSLContext, size: int, *, chunked: bool, chunk: int = 64 * 1024
) -> tuple[int | None, int]:
    """Send a body of ``size`` bytes (declared, or chunked without a length) while reading
    the answer; stop sending once answered. (status or None if the connection was cut
    first, bytes of body sent)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    writer.write(f"POST /validate HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n".encode())
    answer = asyncio.ensure_future(read_response(reader))
    sent = 0
    payload = b"[" * chunk
    try:
        while sent < size and not answer.done():
            piece = payload if not chunked else b"%x\r\n%s\r\n" % (chunk, payload)
            writer.write(piece)
            await writer.drain()
            sent += chunk
        async with asyncio.timeout(10):
            status, _ = await answer
        return status, sent
    except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        return None, sent
    finally:
        answer.cancel()
        writer.close()


def selector(seed: str, size: int = 10_000) -> str:
    """A distinct valid selector of about ``size`` bytes (slow to compile)."""
    parts: list[str] = []
    used = 0
    while True:
        part = f'device.attributes["{DRIVER}"].model == "m{seed}x{len(parts)}"'
        if used + len(part) + 4 > size:
            return " || ".join(parts)
        parts.append(part)
        used += len(part) + 4


def claim(selectors: list[str], padding: int = 0) -> Obj:
    per_request = 4
    requests = [
        {
            "name": f"r{i}",
            "exactly": {
                "deviceClassName": DRIVER,
                "selectors": [{"cel": {"expression": e}} for e in selectors[i : i + per_request]],
            },
        }
        for i in range(0, len(selectors), per_request)
    ] or [{"name": "r0", "exactly": {"deviceClassName": DRIVER}}]
    metadata: dict[str, Any] = {"name": "c", "namespace": "ns"}
    if padding:
        metadata["annotations"] = {"example.com/padding": "p" * padding}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {"devices": {"requests": requests}},
    }


def review(obj: Obj, uid: str = "uid-1") -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
                "namespace": "ns",
                "name": "c",
                "operation": "CREATE",
                "userInfo": {"username": "tester"},
                "object": obj,
            },
        }
    ).encode()


def slow_review(seed: str, total: int = int(1.35 * MIB)) -> bytes:
    """A valid review of about ``total`` bytes whose selectors fill the default budget."""
    selectors = [selector(f"{seed}-{i}") for i in range(25)]
    base = len(review(claim(selectors)))
    return review(claim(selectors, padding=max(0, total - base)), uid=f"slow-{seed}")


async def wait_for(condition: Any, deadline: float = 30.0) -> None:
    """Poll ``condition()`` until true, failing after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {deadline} s")
        await asyncio.sleep(0.01)


async def _small_latencies(port: int, tls: ssl.SSLContext, count: int) -> list[float]:
    latencies = []
    for i in range(count):
        body = review(claim([selector(f"small-{i}", 200)]))
        started = time.perf_counter()
        status, _ = await post(port, tls, body)
        latencies.append(time.perf_counter() - started)
        if status != 200:
            raise RuntimeError(f"a small review got HTTP {status}")
    return latencies


async def _timed(coro: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = await coro
    return result, time.perf_counter() - started


async def run(args: argparse.Namespace, pki: Path) -> list[list[str]]:
    cert = issue_serving_cert(pki, pki / "serving")
    app = build_app()
    async with served(app, cert.cert, cert.key) as server:
        tls = client_context(pki / "ca.crt")
        idle = await _small_latencies(server.port, tls, args.small)
        size = int(args.flood_mib * MIB)
        floods = [
            asyncio.ensure_future(flood(server.port, tls, size, chunked=i % 2 == 1))
            for i in range(args.floods)
        ]
        bodies = [slow_review(f"bench-{i}", int(args.slow_mib * MIB)) for i in range(args.slow)]
        slow = [asyncio.ensure_future(_timed(post(server.port, tls, b))) for b in bodies]
        await wait_for(lambda: app.state.pool.large.in_flight >= min(1, args.slow))
        loaded = await _small_latencies(server.port, tls, args.small)
        refused = [status for status, _ in await asyncio.gather(*floods)]
        slow_answers = await asyncio.gather(*slow)
    slow_times = [seconds for _, seconds in slow_answers]
    allowed = sum(
        1
        for (status, body), _ in slow_answers
        if status == 200 and json.loads(body)["response"]["allowed"] is True
    )
    rows = []
    for name, values in (("small review, idle", idle), ("small review, under load", loaded)):
        rows.append(
            [name, str(len(values))]
            + [ms(percentile(values, q)) for q in (0.5, 0.99)]
            + [ms(max(values))]
        )
    answered = sum(1 for status in refused if status == 413)
    rows.append(
        [f"flood of {args.flood_mib:g} MiB (413: {answered})", str(len(refused))] + ["-"] * 3
    )
    if slow_times:
        rows.append(
            [f"slow review of {args.slow_mib:g} MiB (allowed: {allowed})", str(len(slow_times))]
            + [ms(percentile(slow_times, q)) for q in (0.5, 0.99)]
            + [ms(max(slow_times))]
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.webhook", description=__doc__)
    parser.add_argument("--floods", type=int, default=10)
    parser.add_argument("--flood-mib", type=float, default=10.0)
    parser.add_argument("--slow", type=int, default=3)
    parser.add_argument("--slow-mib", type=float, default=1.35)
    parser.add_argument("--small", type=int, default=20)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        pki = Path(tmp)
        CertificateAuthority(CertPair(pki / "ca.crt", pki / "ca.key"), "bench-ca")
        rows = asyncio.run(run(args, pki))
    print(table(["what", "count", "p50 ms", "p99 ms", "max ms"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
