"""Helpers for the webhook tests over real TLS sockets: a served app, raw HTTP/1.1
clients that send huge bodies, and claims that are valid but slow to validate."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from dradriver.k8s.objects import Obj
from dradriver.webhook.server import WebhookServer

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
