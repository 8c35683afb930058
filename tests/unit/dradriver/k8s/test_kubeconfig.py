"""Kubeconfigs with static credentials, and the pod's service account, without the client library.

A real TLS server (a CA and certificates from the local cluster's PKI code) requires a
client certificate and records what each request presented; the connection under test
comes from a kubeconfig written the way kubeadm and kind write them (data inline, or
files relative to the kubeconfig). Whether the ``kubernetes`` package was imported is
checked in a fresh interpreter, since this test process may have imported it already.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.cluster.pki import CertificateAuthority, CertPair
from dradriver.k8s import client as k8s_client
from dradriver.k8s.client import KubeClient, load_connection
from dradriver.k8s.kubeconfig import KubeconfigError, read_static_kubeconfig


class Pki:
    def __init__(self, root: Path) -> None:
        self.ca = CertificateAuthority(CertPair(root / "ca.crt", root / "ca.key"), "test-ca")
        self.server = self.ca.issue(
            CertPair(root / "server.crt", root / "server.key"),
            "server",
            server=True,
            ips=("127.0.0.1",),
        )
        self.client = self.ca.issue(
            CertPair(root / "client.crt", root / "client.key"), "the-plugin", client=True
        )


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path / "pki")


class Seen:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str | None]] = []  # (client cert CN, Authorization)


async def serve(pki: Pki, seen: Seen) -> tuple[asyncio.Server, int]:
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca.pair.cert))
    tls.load_cert_chain(str(pki.server.cert), str(pki.server.key))
    tls.verify_mode = ssl.CERT_REQUIRED

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        auth = next(
            (
                line.split(":", 1)[1].strip()
                for line in head.split("\r\n")
                if line.lower().startswith("authorization:")
            ),
            None,
        )
        peer: Any = writer.get_extra_info("peercert")
        cn = dict(x[0] for x in peer["subject"])["commonName"]
        seen.requests.append((cn, auth))
        body = json.dumps({"kind": "APIVersions"}).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=tls)
    return server, int(server.sockets[0].getsockname()[1])


def write_kubeconfig(path: Path, port: int, pki: Pki, *, inline: bool) -> Path:
    def b64(file: Path) -> str:
        return base64.b64encode(file.read_bytes()).decode()

    cluster: dict[str, Any] = {"server": f"https://127.0.0.1:{port}"}
    user: dict[str, Any] = {"token": "static-token"}
    if inline:
        cluster["certificate-authority-data"] = b64(pki.ca.pair.cert)
        user["client-certificate-data"] = b64(pki.client.cert)
        user["client-key-data"] = b64(pki.client.key)
    else:  # relative to the kubeconfig's directory
        cluster["certificate-authority"] = "pki/ca.crt"
        user["client-certificate"] = "pki/client.crt"
        user["client-key"] = "pki/client.key"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "here",
                "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u"}}],
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
            }
        )
    )
    return path


@pytest.mark.parametrize("inline", [True, False], ids=["data", "files"])
def test_a_static_kubeconfig_authenticates_with_its_certificate_and_token(
    tmp_path: Path, pki: Pki, inline: bool
) -> None:
    seen = Seen()

    async def main() -> dict[str, Any]:
        server, port = await serve(pki, seen)
        path = write_kubeconfig(tmp_path / "kubeconfig", port, pki, inline=inline)
        client = KubeClient(load_connection(str(path)))
        try:
            return await client.get("/api")
        finally:
            await client.aclose()
            server.close()

    assert asyncio.run(main()) == {"kind": "APIVersions"}
    assert seen.requests == [("the-plugin", "Bearer static-token")]
    assert list(tmp_path.glob("**/dradriver-kubeconfig-*")) == []  # no key left on disk


def test_a_static_kubeconfig_does_not_import_the_client_library(tmp_path: Path, pki: Pki) -> None:
    path = write_kubeconfig(tmp_path / "kubeconfig", 6443, pki, inline=True)
    script = (
        "import sys\nfrom dradriver.k8s.client import load_connection\n"
        f"conn = load_connection({str(path)!r})\n"
        "print(conn.server, conn.token, 'kubernetes' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["https://127.0.0.1:6443", "static-token", "False"]


def test_an_exec_or_oidc_kubeconfig_is_left_to_the_client_library(tmp_path: Path) -> None:
    base = {
        "current-context": "x",
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
    }
    for user in (
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "true"}},
        {"auth-provider": {"name": "oidc", "config": {}}},
        {"username": "a", "password": "b"},
    ):
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump({**base, "users": [{"name": "u", "user": user}]}))
        assert read_static_kubeconfig(str(path)) is None, user


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ("- a list\n", "the document is not a mapping"),
        ("current-context: x\ncontexts: []\n", "no context named 'x'"),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "clusters: [{name: c, cluster: {server: 'https://h', "
            "certificate-authority-data: '***'}}]\nusers: [{name: u, user: {}}]\n",
            "clusters[c].certificate-authority-data is not base64",
        ),
        (
            "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
            "clusters: [{name: c, cluster: {server: 'ftp://h'}}]\nusers: [{name: u, user: {}}]\n",
            "clusters[c].server is not an http(s) URL",
        ),
        ("a: " + "x" * (1 << 20) + "\n", "larger than"),
    ],
)
def test_a_bad_kubeconfig_is_an_error_naming_the_field(
    tmp_path: Path, content: str, names: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(content)
    with pytest.raises(KubeconfigError, match=re.escape(names)):
        read_static_kubeconfig(str(path))


def test_in_a_pod_the_service_account_token_is_read_again_for_every_request(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(pki.ca.pair.cert.read_bytes())
    (sa / "token").write_text("first\n")
    monkeypatch.setattr(k8s_client, "SA_DIR", sa)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    conn = load_connection(None)
    assert conn.server == "https://[fd00::1]:443"
    assert conn.bearer() == "first"
    (sa / "token").write_text("rotated\n")  # projected tokens rotate
    assert conn.bearer() == "rotated"
    assert [c["subject"] for c in conn.tls.get_ca_certs()] == [((("commonName", "test-ca"),),)]
