"""The serving certificate is re-read when its files change; TLS 1.2+ with AEAD only."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

import pytest

from bench import webhook as hostile
from devtools.cluster.pki import CertificateAuthority, CertPair
from devtools.harness.webhook import issue_serving_cert
from dradriver.webhook.app import build_app
from dradriver.webhook.tls import server_context


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    """A Kubernetes secret volume: tls.crt and tls.key -> ..data/…, ..data -> a dated dir;
    pairs A and B (and a mismatched one) issued by one CA."""
    CertificateAuthority(CertPair(tmp_path / "ca.crt", tmp_path / "ca.key"), "test-ca")
    for name in ("a", "b"):
        pair = issue_serving_cert(tmp_path, tmp_path / f"..{name}")
        pair.cert.rename(pair.cert.with_name("tls.crt"))
        pair.key.rename(pair.key.with_name("tls.key"))
    mismatched = tmp_path / "..mismatched"
    mismatched.mkdir()
    (mismatched / "tls.crt").write_bytes((tmp_path / "..b" / "tls.crt").read_bytes())
    (mismatched / "tls.key").write_bytes((tmp_path / "..a" / "tls.key").read_bytes())
    mount = tmp_path / "mount"
    mount.mkdir()
    os.symlink(tmp_path / "..a", mount / "..data")
    for name in ("tls.crt", "tls.key"):
        os.symlink(f"..data/{name}", mount / name)
    return tmp_path


def swap(volume: Path, to: str) -> None:
    """What the kubelet does: a new ..data symlink renamed over the old one."""
    staging = volume / "mount" / "..data_tmp"
    os.symlink(volume / f"..{to}", staging)
    os.replace(staging, volume / "mount" / "..data")


def der(volume: Path, name: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert((volume / f"..{name}" / "tls.crt").read_text())


async def peer_cert(port: int, tls: ssl.SSLContext) -> bytes:
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    try:
        cert = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert isinstance(cert, bytes)
        return cert
    finally:
        writer.close()


async def get_healthz(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    status, _ = await hostile.read_response(reader)
    return status


def test_new_connections_get_the_new_certificate_and_old_ones_keep_working(
    volume: Path,
) -> None:
    async def run() -> None:
        mount = volume / "mount"
        async with hostile.served(build_app(), mount / "tls.crt", mount / "tls.key") as s:
            tls = hostile.client_context(volume / "ca.crt")
            assert await peer_cert(s.port, tls) == der(volume, "a")
            reader, writer = await asyncio.open_connection("127.0.0.1", s.port, ssl=tls)
            assert await get_healthz(reader, writer) == 200
            swap(volume, "b")
            assert await peer_cert(s.port, tls) == der(volume, "b")
            assert await get_healthz(reader, writer) == 200  # the kept-alive connection
            assert writer.get_extra_info("ssl_object").getpeercert(True) == der(volume, "a")
            # A pair that does not match: B stays, and is not re-tried until it changes.
            swap(volume, "mismatched")
            assert await peer_cert(s.port, tls) == der(volume, "b")
            assert await peer_cert(s.port, tls) == der(volume, "b")
            assert s.certificate.reloads == 1
            # Files gone (mid-swap): B stays.
            (mount / "..data").unlink()
            assert await peer_cert(s.port, tls) == der(volume, "b")
            swap(volume, "a")
            assert await peer_cert(s.port, tls) == der(volume, "a")
            assert s.certificate.reloads == 2
            assert await get_healthz(reader, writer) == 200
            writer.close()

    asyncio.run(run())


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_only_tls_1_2_and_up_with_aead_ciphers(volume: Path) -> None:
    context = server_context(volume / "..a" / "tls.crt", volume / "..a" / "tls.key")
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.options & ssl.OP_NO_COMPRESSION
    tls12 = [c for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 and all(c["aead"] for c in tls12)
    assert not any(
        weak in c["name"] for c in context.get_ciphers() for weak in ("CBC", "RC4", "DES")
    )

    async def run() -> None:
        mount = volume / "mount"
        async with hostile.served(build_app(), mount / "tls.crt", mount / "tls.key") as s:
            old = hostile.client_context(volume / "ca.crt")
            old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
            with pytest.raises((ssl.SSLError, ConnectionError)):
                await peer_cert(s.port, old)
            cbc = hostile.client_context(volume / "ca.crt")
            cbc.maximum_version = ssl.TLSVersion.TLSv1_2
            cbc.set_ciphers("ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA384")
            with pytest.raises((ssl.SSLError, ConnectionError)):
                await peer_cert(s.port, cbc)
            aead = hostile.client_context(volume / "ca.crt")
            aead.maximum_version = ssl.TLSVersion.TLSv1_2
            assert await peer_cert(s.port, aead) == der(volume, "a")

    asyncio.run(run())
