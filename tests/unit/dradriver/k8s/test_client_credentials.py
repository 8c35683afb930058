"""Kubeconfig credentials that expire: each request gets a token that is still valid.

The kubeconfig's ``user.exec`` runs a real credential plugin (a script in tmp_path) that
counts its runs and says how long its token lives. The client library treats a token as
expired five minutes before its ``expirationTimestamp``, so a token that lives one second
is already stale when the next request asks, and one that lives an hour is not: no test
has to wait for a clock.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from dradriver.k8s.client import load_connection

PLUGIN = """\
import json, sys
from datetime import datetime, timedelta, timezone
counter, lifetime = sys.argv[1], float(sys.argv[2])
try:
    n = int(open(counter).read()) + 1
except FileNotFoundError:
    n = 1
open(counter, "w").write(str(n))
expires = datetime.now(timezone.utc) + timedelta(seconds=lifetime)
status = {"token": f"token-{n}", "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}
print(json.dumps({
    "apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status
}))
"""


def exec_kubeconfig(tmp_path: Path, lifetime_seconds: int) -> tuple[Path, Path]:
    """A kubeconfig whose user runs the counting plugin; returns it and the counter file."""
    plugin = tmp_path / "credential-plugin.py"
    plugin.write_text(PLUGIN)
    counter = tmp_path / "runs"
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True},
            }
        ],
        "users": [
            {
                "name": "u",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": sys.executable,
                        "args": [str(plugin), str(counter), str(lifetime_seconds)],
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    return path, counter


def test_an_expired_exec_token_is_replaced_before_the_next_request(tmp_path: Path) -> None:
    path, _ = exec_kubeconfig(tmp_path, lifetime_seconds=1)
    conn = load_connection(str(path))
    first = conn.bearer()
    second = conn.bearer()
    assert first is not None and second is not None
    assert first != second, "the expired exec token was sent again"
    assert first.startswith("token-") and second.startswith("token-")


def test_a_valid_exec_token_is_reused_without_running_the_plugin(tmp_path: Path) -> None:
    path, counter = exec_kubeconfig(tmp_path, lifetime_seconds=3600)
    conn = load_connection(str(path))
    assert conn.bearer() == conn.bearer() == "token-1"
    assert counter.read_text() == "1", "the plugin ran again for a token that is still valid"
