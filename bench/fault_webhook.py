"""The webhook against the clients of findings 4, 5 and 6 of issue 21: rows of ``bench.faults``.

``python -m bench.fault_webhook [--post-mib 300] [--big 5] [--big-mib 1.35]
[--baseline REV]``

Every figure is read from a real webhook process over TLS on 127.0.0.1: in
``bench.faults`` the controller replica that serves it; run alone, ``dradriver-webhook``
started from this checkout (or with ``--baseline REV`` from that revision's sources, the
"before" side) with a throw-away CA.

(f4) one ``--post-mib`` POST, with a Content-Length and then chunked: the answers, what the
    client could send before them, and the serving process's RSS before, at its peak
    (sampled every 5 ms while the POSTs run) and after.
(f5) ``--big`` valid reviews of ``--big-mib`` each (CEL selectors filling the per-review
    budget) sent in parallel, while another tenant sends small reviews one after another:
    the small reviews' latency (p50, max) while a big one is in flight, and how the big
    ones were answered.
(f6) the certificate and key files replaced by a new pair from the same CA (key first, as
    a copy tool would, so for a moment they do not match) while one kept-alive
    connection and a stream of new connections send reviews: how long until a new
    connection gets the new certificate, and how many requests failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from bench.common import baseline_source, free_port, percentile, rss_kib, table
from bench.webhook import (
    MIB,
    claim,
    client_context,
    flood,
    post,
    read_response,
    review,
    slow_review,
)
from bench.webhook import selector as cel_selector
from devtools.cluster.pki import CertificateAuthority, CertPair
from devtools.harness.controller import ControllerProcess
from devtools.harness.webhook import issue_serving_cert

SMOKE_ARGS = ("--post-mib", "20", "--big", "2", "--big-mib", "0.3")  # as QUICK
CLUSTER = "none"  # a dradriver-webhook process of its own

LATENCY_PROMISE = 1.0  # seconds: another tenant's review under load (issue 21)
REQUEST_TIMEOUT = 60.0
SAMPLE_EVERY = 0.005
PACE = 0.02  # seconds between the rotation's requests (pacing, not synchronisation)
CHECKOUT = Path(__file__).resolve().parents[1]
MIN_AFTER = 5  # new connections served with the new certificate before the rotation ends

Cells = tuple[str, int, str, str, str]
"""(fault, runs, metric, value, promised): a row of ``bench.faults``."""


@dataclass(frozen=True)
class Target:
    """A webhook process to measure: its port and PID, the CA clients trust, the files it
    serves, and the CA directory (``ca.crt``, ``ca.key``) that issues a replacement pair."""

    port: int
    pid: int
    ca: Path
    cert: Path
    key: Path
    pki: Path


class PeakRss:
    """Samples a process's VmRSS every :data:`SAMPLE_EVERY` s in a thread; ``peak`` KiB."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_kib(pid)[0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss_kib(self.pid)[0])

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_kib(self.pid)[0])


def mib(kib: float) -> str:
    return f"{kib / 1024:.0f}"


async def _flood(
    port: int, tls: ssl.SSLContext, size: int, *, chunked: bool
) -> tuple[int | str | None, int]:
    """:func:`bench.webhook.flood`; a server that has not answered 10 s after the whole body
    was sent (one that buffers and parses it) gives ``"none in 10 s"``."""
    try:
        return await flood(port, tls, size, chunked=chunked)
    except TimeoutError:
        return "none in 10 s", size


async def big_post(target: Target, tls: ssl.SSLContext, size_mib: float) -> list[Cells]:
    """(f4): one huge POST with a declared length, one chunked."""
    fault = f"(f4) one {size_mib:g} MiB POST to the webhook"
    before = rss_kib(target.pid)[0]
    size = int(size_mib * MIB)
    with PeakRss(target.pid) as rss:
        async with asyncio.timeout(REQUEST_TIMEOUT * 2):
            declared = await _flood(target.port, tls, size, chunked=False)
            chunked = await _flood(target.port, tls, size, chunked=True)
    after = rss_kib(target.pid)[0]
    answers = [declared[0], chunked[0]]
    return [
        (fault, 2, "answers (Content-Length, chunked)", ", ".join(map(str, answers)), "413, 413"),
        (
            fault,
            2,
            "MiB the client sent before the answer",
            f"{declared[1] / MIB:.1f}, {chunked[1] / MIB:.1f}",
            "a few",
        ),
        (
            fault,
            1,
            "serving process RSS MiB: before, peak, after",
            f"{mib(before)}, {mib(rss.peak)}, {mib(after)}",
            "peak < before + 64",
        ),
    ]


async def _timed_post(port: int, tls: ssl.SSLContext, body: bytes) -> tuple[int, bytes, float]:
    started = time.perf_counter()
    async with asyncio.timeout(REQUEST_TIMEOUT):
        status, answer = await post(port, tls, body)
    return status, answer, time.perf_counter() - started


async def parallel_big_reviews(
    target: Target, tls: ssl.SSLContext, count: int, size_mib: float
) -> list[Cells]:
    """(f5): ``count`` big reviews at once; another tenant's small reviews meanwhile."""
    fault = f"(f5) {count} parallel {size_mib:g} MB reviews"
    bodies = [slow_review(f"fault-{i}", int(size_mib * MIB)) for i in range(count)]
    big = [asyncio.ensure_future(_timed_post(target.port, tls, b)) for b in bodies]
    small: list[float] = []
    failed = 0
    while not all(task.done() for task in big):  # each small one is sent under load
        body = review(claim([cel_selector(f"tenant-{len(small)}", 200)]), uid="tenant")
        status, answer, seconds = await _timed_post(target.port, tls, body)
        small.append(seconds)
        failed += not (status == 200 and _allowed(answer))
    answers = await asyncio.gather(*big)
    allowed = sum(1 for status, answer, _ in answers if status == 200 and _allowed(answer))
    refused = sum(1 for _, answer, _ in answers if _code(answer) == 429)
    slowest = max(seconds for _, _, seconds in answers)
    p50, worst = percentile(small, 0.5), max(small)
    return [
        (
            fault,
            len(small),
            "another tenant's small review p50 / max ms",
            f"{p50 * 1000:.0f} / {worst * 1000:.0f}",
            f"< {LATENCY_PROMISE * 1000:.0f}",
        ),
        (fault, len(small), "another tenant's reviews not allowed", str(failed), "0"),
        (
            fault,
            count,
            "big reviews allowed / refused (429) / slowest ms",
            f"{allowed} / {refused} / {slowest * 1000:.0f}",
            "-",
        ),
    ]


def _response(answer: bytes) -> dict[str, Any]:
    try:
        response = json.loads(answer)["response"]
    except (ValueError, KeyError, TypeError):
        return {}
    return response if isinstance(response, dict) else {}


def _allowed(answer: bytes) -> bool:
    return _response(answer).get("allowed") is True


def _code(answer: bytes) -> object:
    return (_response(answer).get("status") or {}).get("code")


def serial(cert: Path) -> int:
    return x509.load_pem_x509_certificate(cert.read_bytes()).serial_number


def served_serial(der: bytes) -> int:
    return x509.load_der_x509_certificate(der).serial_number


@dataclass
class _Rotation:
    kept_ok: int = 0
    kept_failed: int = 0
    new: list[tuple[float, int, bool]] | None = None  # (sent, serial served, answered 200)
    stop: bool = False


async def _kept_alive(target: Target, tls: ssl.SSLContext, state: _Rotation) -> None:
    """One connection for the whole rotation, a review at a time on it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", target.port, ssl=tls)
    body = review(claim([]), uid="kept-alive")
    head = (
        "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    try:
        while not state.stop:
            try:
                writer.write(head + body)
                async with asyncio.timeout(REQUEST_TIMEOUT):
                    await writer.drain()
                    status, _ = await read_response(reader)
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                state.kept_failed += 1
                return  # the connection is gone: counted, and nothing more to send on it
            if status == 200:
                state.kept_ok += 1
            else:
                state.kept_failed += 1
            await asyncio.sleep(PACE)
    finally:
        writer.close()


async def _new_connection(target: Target, tls: ssl.SSLContext) -> tuple[int, bool]:
    """(serial of the certificate served, answered 200) of one review on a new connection."""
    async with asyncio.timeout(REQUEST_TIMEOUT):
        reader, writer = await asyncio.open_connection("127.0.0.1", target.port, ssl=tls)
        try:
            ssl_object = writer.get_extra_info("ssl_object")
            served = served_serial(ssl_object.getpeercert(binary_form=True))
            body = review(claim([]), uid="new-connection")
            writer.write(
                (
                    "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n"
                ).encode()
                + body
            )
            await writer.drain()
            status, _ = await read_response(reader)
            return served, status == 200
        finally:
            writer.close()


def replace_pair(target: Target, work: Path) -> int:
    """Issue a new pair from the same CA and rename it over the served files, key first;
    the new certificate's serial."""
    pair = issue_serving_cert(target.pki, work)
    os.replace(pair.key, target.key)
    os.replace(pair.cert, target.cert)
    return serial(target.cert)


async def rotation(target: Target, tls: ssl.SSLContext, work: Path) -> list[Cells]:
    """(f6): the served files replaced while connections old and new send reviews."""
    fault = "(f6) webhook certificate files replaced"
    old = serial(target.cert)
    state = _Rotation(new=[])
    assert state.new is not None
    kept = asyncio.ensure_future(_kept_alive(target, tls, state))
    new_serial = 0
    rotated_at = 0.0
    try:
        while True:
            sent = time.monotonic()
            try:
                served, ok = await _new_connection(target, tls)
            except (OSError, ssl.SSLError, asyncio.IncompleteReadError, TimeoutError):
                served, ok = 0, False
            state.new.append((sent, served, ok))
            if not rotated_at and len(state.new) >= MIN_AFTER and state.kept_ok >= MIN_AFTER:
                new_serial = await asyncio.to_thread(replace_pair, target, work)
                rotated_at = time.monotonic()
            after = [s for t, s, _ in state.new if rotated_at and t >= rotated_at]
            if after.count(new_serial) >= MIN_AFTER:
                break
            if rotated_at and time.monotonic() - rotated_at > REQUEST_TIMEOUT:
                break  # never reloaded: the row says so
            await asyncio.sleep(PACE)
    finally:
        state.stop = True
        await kept
    first_new = min((t for t, s, _ in state.new if s == new_serial), default=None)
    reload = "never" if first_new is None else f"{max(0.0, first_new - rotated_at):.2f}"
    old_after = sum(1 for t, s, _ in state.new if t >= rotated_at and s == old)
    failed_new = sum(1 for _, _, ok in state.new if not ok)
    return [
        (
            fault,
            len(state.new),
            "seconds until a new connection gets the new certificate",
            reload,
            "next handshake",
        ),
        (
            fault,
            len(state.new),
            "new connections given the old certificate after the swap",
            str(old_after),
            "0",
        ),
        (
            fault,
            len(state.new) + state.kept_ok + state.kept_failed,
            "requests failed (new connections, kept-alive connection)",
            f"{failed_new + state.kept_failed}",
            "0",
        ),
    ]


def measure(target: Target, work: Path, post_mib: float, big: int, big_mib: float) -> list[Cells]:
    """Rows (f4), (f5) and (f6) against ``target``, in that order (rotation last)."""

    async def run() -> list[Cells]:
        tls = client_context(target.ca)
        rows = await big_post(target, tls, post_mib)
        rows += await parallel_big_reviews(target, tls, big, big_mib)
        return rows + await rotation(target, tls, work)

    return asyncio.run(run())


QUICK = (20.0, 2, 0.3)
FULL = (300.0, 5, 1.35)
"""(POST MiB, big reviews, their MB): ``bench.faults --quick`` and a full run."""


def controller_rows(
    controller: ControllerProcess, pki: Path, work: Path, quick: bool
) -> list[Cells]:
    """Rows (f4), (f5), (f6) against the webhook a controller replica serves; ``pki`` holds the
    CA that issued its certificate (the rotation issues the new pair there)."""
    tls, process = controller.webhook, controller.process
    assert tls is not None and process is not None, "a running controller with a webhook"
    target = Target(controller.webhook_port, process.pid, tls.ca, tls.cert, tls.key, pki)
    work.mkdir(parents=True, exist_ok=True)
    return measure(target, work, *(QUICK if quick else FULL))


@contextlib.contextmanager
def webhook_process(work: Path, baseline: str | None) -> Iterator[Target]:
    """``dradriver-webhook`` on a free port with a new CA (from ``baseline``'s sources if
    given), stopped at the end."""
    pki = work / "pki"
    CertificateAuthority(CertPair(pki / "ca.crt", pki / "ca.key"), "fault-webhook-ca")
    pair = issue_serving_cert(pki, work / "serving")
    # The sources on PYTHONPATH, run from the work dir: ``-m`` puts the current directory
    # first on sys.path, which would shadow a baseline with this checkout.
    source = CHECKOUT if baseline is None else baseline_source(baseline, work / "baseline")
    env = {**os.environ, "PYTHONPATH": str(source)}
    port = free_port()
    argv = [sys.executable, "-m", "dradriver.webhook", f"--address=127.0.0.1:{port}"]
    argv += [f"--cert={pair.cert}", f"--key={pair.key}", "--log-level=warning"]
    log = (work / "webhook.log").open("wb")
    process = subprocess.Popen(argv, env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT)
    try:
        tls = client_context(pki / "ca.crt")
        deadline = time.monotonic() + 60
        while True:  # the process prints nothing when it listens: try to connect
            if process.poll() is not None:
                raise RuntimeError(
                    f"dradriver-webhook exited: {(work / 'webhook.log').read_text()}"
                )
            try:
                with contextlib.closing(ssl_probe(port, tls)):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("dradriver-webhook did not listen within 60 s") from None
                time.sleep(0.05)
        yield Target(port, process.pid, pki / "ca.crt", pair.cert, pair.key, pki)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def ssl_probe(port: int, tls: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=2)
    return tls.wrap_socket(raw, server_hostname="127.0.0.1")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fault_webhook", description=__doc__)
    parser.add_argument("--post-mib", type=float, default=300.0)
    parser.add_argument("--big", type=int, default=5)
    parser.add_argument("--big-mib", type=float, default=1.35)
    parser.add_argument("--baseline", help="serve from this git revision's sources (before)")
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="drfw-") as tmp,
        webhook_process(Path(tmp), args.baseline) as target,
    ):
        rows = measure(target, Path(tmp), args.post_mib, args.big, args.big_mib)
    which = f"dradriver-webhook from {args.baseline}" if args.baseline else "dradriver-webhook"
    print(f"\nWebhook faults ({which}):\n")
    print(
        table(
            ["fault", "runs", "metric", "value", "promised"],
            [[f, str(n), m, v, p] for f, n, m, v, p in rows],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
