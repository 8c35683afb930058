"""The local-cluster harness: config parsing, PKI, process tracking, clear errors."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from devtools.cluster import binaries, pki
from devtools.cluster.config import (
    Layout,
    Ports,
    format_feature_gates,
    kubelet_config,
    parse_feature_gates,
)
from devtools.cluster.local import ClusterError, LocalCluster
from devtools.cluster.process import ManagedProcess, ProcessDied, ProcessRecord
from devtools.cluster.wait import WaitTimeout, wait_until


def test_feature_gates_round_trip() -> None:
    gates = parse_feature_gates("DRADeviceTaintRules=true, DRAListTypeAttributes=False")
    assert gates == {"DRADeviceTaintRules": True, "DRAListTypeAttributes": False}
    assert format_feature_gates(gates) == "DRADeviceTaintRules=true,DRAListTypeAttributes=false"
    assert parse_feature_gates("") == {}


@pytest.mark.parametrize("bad", ["Foo", "Foo=yes", "=true"])
def test_feature_gates_reject_bad_input(bad: str) -> None:
    with pytest.raises(ValueError, match="Name=true"):
        parse_feature_gates(bad)


def test_kubelet_config_has_the_settings_this_machine_needs(tmp_path: Path) -> None:
    layout = Layout(state_dir=tmp_path)
    cfg = kubelet_config(
        layout.node(1), tmp_path / "ca", tmp_path / "c", tmp_path / "k", {"X": True}
    )
    assert cfg["failCgroupV1"] is False
    assert cfg["address"] == "127.0.0.1"
    assert cfg["readOnlyPort"] == 0
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["containerRuntimeEndpoint"] == f"unix://{layout.cri_socket}"
    assert cfg["featureGates"] == {"X": True}
    yaml.safe_dump(cfg)


def test_pki_chains_to_the_ca_and_keys_are_private(tmp_path: Path) -> None:
    ca = pki.CertificateAuthority(pki.CertPair(tmp_path / "ca.crt", tmp_path / "ca.key"), "ca")
    pair = ca.issue(
        pki.CertPair(tmp_path / "n.crt", tmp_path / "n.key"),
        "system:node:node-1",
        orgs=("system:nodes",),
        client=True,
        ips=("127.0.0.1",),
    )
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    ca_cert = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca_cert)
    assert "O=system:nodes" in cert.subject.rfc4514_string()
    assert (pair.key.stat().st_mode & 0o777) == 0o600
    # A second CA object over the same files reuses the existing key.
    again = pki.CertificateAuthority(pki.CertPair(tmp_path / "ca.crt", tmp_path / "ca.key"), "ca")
    assert again.pair.cert.read_bytes() == (tmp_path / "ca.crt").read_bytes()


def test_dead_component_is_named_with_its_log_tail(tmp_path: Path) -> None:
    comp = ManagedProcess.start(
        "boomer",
        [sys.executable, "-c", "import sys; print('cannot start: boom'); sys.exit(3)"],
        log_path=tmp_path / "boomer.log",
        cwd=tmp_path / "work",
    )
    with pytest.raises(ProcessDied) as info:
        wait_until("never", lambda: False, timeout=30, watch=[comp])
    assert "boomer died (exit code 3)" in str(info.value)
    assert "cannot start: boom" in str(info.value)


def test_process_record_does_not_match_a_reused_pid(tmp_path: Path) -> None:
    comp = ManagedProcess.start(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        log_path=tmp_path / "s.log",
        cwd=tmp_path / "w",
    )
    assert comp.record.alive()
    impostor = ManagedProcess.adopt(ProcessRecord("x", comp.pid, "/bin/true", ""))
    assert not impostor.alive()
    impostor.stop()  # must not signal the sleeper
    assert comp.alive() and comp.record.alive()
    # Stopped from its record alone, as `dradriver cluster down` does from another process.
    ManagedProcess.adopt(comp.record).stop()
    assert not comp.record.alive()


def _python(tmp_path: Path, name: str, code: str) -> ManagedProcess:
    return ManagedProcess.start(
        name,
        [sys.executable, "-c", code],
        log_path=tmp_path / f"{name}.log",
        cwd=tmp_path / f"{name}.cwd",
    )


def _logged(process: ManagedProcess, text: str) -> bool:
    process.check()
    return text in process.log_path.read_text()


# Children say "ready" once their SIGTERM handler is installed, so no signal can come early.
IGNORES_SIGTERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(120)
"""
EXITS_7_ON_SIGTERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
print("ready", flush=True)
time.sleep(120)
"""


def test_process_runs_in_its_own_cwd_and_session_with_its_log(tmp_path: Path) -> None:
    process = _python(
        tmp_path,
        "where",
        "import os; print(os.getcwd(), os.getsid(0) == os.getpid(), flush=True)",
    )
    wait_until("where exited", lambda: process.returncode is not None, 30)
    assert process.log_path.read_text() == f"{tmp_path / 'where.cwd'} True\n"
    assert list((tmp_path / "where.cwd").iterdir()) == []
    assert process.record.exe == os.path.realpath(sys.executable)
    assert process.record.argv[0] == sys.executable


def test_terminate_returns_the_exit_code(tmp_path: Path) -> None:
    process = _python(tmp_path, "graceful", EXITS_7_ON_SIGTERM)
    try:
        process.wait_ready("handler installed", lambda: _logged(process, "ready"), 30)
        assert process.terminate() == 7
        assert not process.alive()
    finally:
        process.kill()


def test_stop_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    process = _python(tmp_path, "stubborn", IGNORES_SIGTERM)
    try:
        process.wait_ready("handler installed", lambda: _logged(process, "ready"), 30)
        with pytest.raises(WaitTimeout, match="did not exit"):
            process.terminate(timeout=0.2)
        assert process.alive()
        assert process.stop(timeout=0.2) == -signal.SIGKILL
    finally:
        process.kill()


def test_readiness_timeout_carries_the_log_tail(tmp_path: Path) -> None:
    process = _python(
        tmp_path, "slow", "import time; print('still booting', flush=True); time.sleep(120)"
    )
    try:
        process.wait_ready("booting logged", lambda: _logged(process, "still booting"), 30)
        with pytest.raises(WaitTimeout) as info:
            process.wait_ready("never", lambda: False, timeout=0.2)
        assert "timed out after 0s waiting for never" in str(info.value)
        assert str(info.value).endswith("slow.log:\nstill booting")
    finally:
        process.kill()


def test_wait_until_treats_only_ignored_errors_as_not_yet() -> None:
    attempts: list[int] = []

    def refused_twice() -> str | None:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionRefusedError("not listening yet")
        return "up"

    assert wait_until("up", refused_twice, 30, 0.01, ignore=(ConnectionRefusedError,)) == "up"
    attempts.clear()
    with pytest.raises(ConnectionRefusedError):
        wait_until("up", refused_twice, 30, 0.01)


def test_taken_port_is_reported(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        layout = Layout(
            state_dir=tmp_path / "state",
            kubelet_root=tmp_path / "kubelet",
            ports=Ports(apiserver=port),
        )
        with pytest.raises(ClusterError, match=f"{port} \\(kube-apiserver\\)"):
            LocalCluster(layout).up()


def test_missing_go_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRADRIVER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(binaries.BinaryError, match="Go toolchain is not on PATH"):
        binaries.ensure_binaries()


def test_envtest_assets_must_hold_both_binaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    (tmp_path / "etcd").write_text("")
    (tmp_path / "etcd").chmod(0o755)
    with pytest.raises(binaries.BinaryError, match="lacks executable kube-apiserver"):
        binaries._envtest_overrides()


def test_source_key_follows_the_go_module(tmp_path: Path) -> None:
    (tmp_path / "cmd" / "x").mkdir(parents=True)
    (tmp_path / "go.mod").write_text("module a\n")
    (tmp_path / "go.sum").write_text("")
    (tmp_path / "cmd" / "x" / "main.go").write_text("package main\n")
    cmd = tmp_path / "cmd"
    before = binaries.source_key(tmp_path, "v1.37.2", cmd)
    assert binaries.source_key(tmp_path, "v1.37.2", cmd) == before
    (tmp_path / "go.mod").write_text("module a\nrequire b v1\n")
    assert binaries.source_key(tmp_path, "v1.37.2", cmd) != before


def test_extra_nodes_get_their_own_root_ports_and_device_plugin_dir(tmp_path: Path) -> None:
    layout = Layout(state_dir=tmp_path, nodes=3)
    nodes = layout.all_nodes()
    assert [n.name for n in nodes] == ["node-1", "node-2", "node-3"]
    assert nodes[0].root == Path("/var/lib/kubelet") and nodes[0].device_plugins is None
    assert nodes[1].root == Path("/var/lib/kubelet-node-2")
    ports = [p for n in nodes for p in (n.port, n.healthz_port)]
    assert len(set(ports)) == len(ports)
    assert len({n.cri_socket for n in nodes}) == 3
    assert all(n.device_plugins for n in nodes[1:])
