"""The plugin refuses to start when a hook declares a capability the process lacks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dradriver.devices.config import parse_config
from dradriver.devices.configyaml import DriverConfigError
from dradriver.host.capabilities import NAMES, effective
from kubeletplugin.privileges import MissingCapabilities, missing, require
from tests.unit.dradriver.devices.test_static import KUBECONFIG

CONFIG = """
hooks:
  setup: {command: [/bin/true], capabilities: [NET_ADMIN]}
  teardown: {command: [/bin/true]}
devicePlugin:
  enabled: true
  resources: [{resourceName: example.com/x}]
  preStart: {command: [/bin/true], capabilities: [SYS_ADMIN, NET_ADMIN]}
"""


def status_with(tmp_path: Path, names: set[str]) -> Path:
    mask = sum(1 << NAMES.index(n) for n in names)
    path = tmp_path / "status"
    path.write_text(f"Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t{mask:016x}\n")
    return path


def test_capability_names_are_checked_naming_the_field() -> None:
    with pytest.raises(DriverConfigError) as info:
        parse_config("hooks: {setup: {command: [a], capabilities: [CAP_NET_ADMIN]}}")
    assert "hooks.setup.capabilities[0]: write" in str(info.value)
    assert "'NET_ADMIN' without the CAP_ prefix" in str(info.value)
    with pytest.raises(DriverConfigError, match="'NET_ADMINN' is not a Linux capability"):
        parse_config("hooks: {setup: {command: [a], capabilities: [NET_ADMINN]}}")


def test_effective_set_is_read_bit_by_bit(tmp_path: Path) -> None:
    assert effective(
        status_with(tmp_path, {"MKNOD", "NET_ADMIN", "CHECKPOINT_RESTORE"})
    ) == frozenset(
        {
            "MKNOD",
            "NET_ADMIN",
            "CHECKPOINT_RESTORE",
        }
    )
    assert effective(tmp_path / "absent") is None
    assert effective(Path("/proc/self/status")) is not None


def test_every_missing_capability_is_named_with_its_hook(tmp_path: Path) -> None:
    config = parse_config(CONFIG)
    assert missing(config, frozenset({"NET_ADMIN"})) == [
        "devicePlugin.preStart.capabilities: SYS_ADMIN"
    ]
    with pytest.raises(MissingCapabilities) as info:
        require(config, status_with(tmp_path, {"MKNOD"}))
    assert str(info.value).startswith(
        "hooks need capabilities this process does not have: hooks.setup.capabilities: "
        "NET_ADMIN; devicePlugin.preStart.capabilities: SYS_ADMIN; "
        "devicePlugin.preStart.capabilities: NET_ADMIN. Add them to the container's "
        "securityContext.capabilities.add"
    )
    require(config, status_with(tmp_path, {"NET_ADMIN", "SYS_ADMIN"}))
    require(config, tmp_path / "unreadable")  # unknown: a warning, not a refusal


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_the_real_plugin_without_net_admin_stops_at_start_naming_the_hook(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {"hooks": {"setup": {"command": ["/bin/true"], "capabilities": ["NET_ADMIN"]}}}
        )
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(KUBECONFIG))
    plugin = Path(sys.executable).parent / "dradriver-kubeletplugin"
    proc = subprocess.run(
        [
            *["setpriv", "--bounding-set", "-net_admin", "--inh-caps", "-net_admin"],
            str(plugin),
            f"--config={config}",
            "--node-name=node-1",
            f"--kubeconfig={kubeconfig}",
            f"--state-dir={tmp_path / 'state'}",
            f"--kubelet-root={tmp_path / 'kubelet'}",
            f"--cdi-dir={tmp_path / 'cdi'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert line.startswith(
        "dradriver-kubeletplugin: error: hooks need capabilities this process does not "
        "have: hooks.setup.capabilities: NET_ADMIN."
    )
    assert not (tmp_path / "kubelet").exists(), "stopped before creating anything"
