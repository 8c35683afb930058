"""`dradriver-kubeletplugin doctor` and the plugin's start-up check: what the configuration
needs, the table, the exit status, and the failures logged once with their fix."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dradriver.devices.config import parse_config
from kubeletplugin.doctor.cli import log_failures, needs_of
from kubeletplugin.main import main
from tests.unit.kubeletplugin.doctor.test_checks import make_roots, touch

CONFIG = """
sources:
- host: {name: kvm, nodes: [{path: /dev/kvm}], share: 4}
- host: {name: loop, nodes: [{path: "/dev/loop[0-7]"}]}
- devglob: {glob: /dev/fuse}
"""


def test_needs_follow_the_host_profiles_and_device_globs() -> None:
    needs = needs_of(parse_config(CONFIG))
    assert needs.kinds == {"kvm", "loop", "fuse"}
    assert needs.paths == ("/dev/kvm", "/dev/loop[0-7]", "/dev/fuse")


def test_the_doctor_command_prints_the_table_and_fails_on_a_missing_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "driver.yaml"
    config.write_text(CONFIG)
    host = tmp_path / "host"
    touch(host / "dev/kvm")  # the node, but no kvm module in /sys/module
    assert main(["doctor", f"--config={config}", f"--host-root={host}"]) == 1
    out = capsys.readouterr().out
    assert "STATUS" in out.splitlines()[0]
    assert "fail" in out and "kvm" in out and "fix:" in out


def test_a_configuration_that_cannot_be_read_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "driver.yaml"
    config.write_text("sources: [{host: {name: kvm}}]\n")
    assert main(["doctor", f"--config={config}", f"--host-root={tmp_path}"]) == 2
    assert "sources[0].host.nodes" in capsys.readouterr().err


def test_start_up_logs_each_failing_check_with_its_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    roots = make_roots(tmp_path)
    with caplog.at_level(logging.WARNING, logger="dradriver.kubeletplugin.doctor"):
        failed = log_failures(parse_config(CONFIG), roots)
    assert failed, "a bare tree fails the CDI directory and module checks"
    logged = [getattr(r, "fields", {}) for r in caplog.records if r.msg == "node check failed"]
    assert [f["check"] for f in logged] == [r.name for r in failed]
    assert all(f["fix"] for f in logged)
