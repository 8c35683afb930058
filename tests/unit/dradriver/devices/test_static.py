"""Mock devices are real character device nodes, made idempotently, or start-up fails clearly.

A container runtime's CDI library takes a device node's type and numbers from its host
path and refuses a plain file (see /work/shared/reference/real-runtime.md), so these tests
look at what is on disk with ``lstat``, the way the runtime does.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dradriver.devices.sourceconfig import StaticSourceConfig
from dradriver.devices.static import (
    MOCK_DEVICE_MODE,
    MockDeviceError,
    StaticSource,
    create_mock_device,
)

pytestmark = pytest.mark.unit


def source_for(mock_dir: Path, *names: str) -> StaticSource:
    config = StaticSourceConfig.model_validate(
        {"mockDir": str(mock_dir), "devices": [{"name": n} for n in names]}
    )
    return StaticSource("sources[0] (static)", config)


def assert_mock_node(path: Path) -> None:
    st = path.lstat()
    assert stat.S_ISCHR(st.st_mode), f"{path} is not a character device"
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)  # /dev/null's numbers
    assert stat.S_IMODE(st.st_mode) == MOCK_DEVICE_MODE == 0o666


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def test_nodes_are_created_with_mode_0666_whatever_the_umask(
    tmp_path: Path, umask_077: None
) -> None:
    mock_dir = tmp_path / "mock"
    source_for(mock_dir, "dev-0", "dev-1").discover()
    assert sorted(os.listdir(mock_dir)) == ["dev-0", "dev-1"]  # no temp files left behind
    for name in ("dev-0", "dev-1"):
        assert_mock_node(mock_dir / name)


def test_what_an_older_version_left_is_replaced_and_a_good_node_is_kept(tmp_path: Path) -> None:
    old_file = tmp_path / "old"
    old_file.write_text("old\n")  # what dradriver wrote before mock devices were nodes
    old_file.chmod(0o600)
    (tmp_path / "link").symlink_to("/dev/null")  # the runtime does not follow symlinks
    os.mknod(tmp_path / "other", stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero's
    os.mknod(tmp_path / "kept", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    kept_inode = (tmp_path / "kept").lstat().st_ino

    assert [create_mock_device(str(tmp_path / n)) for n in ("old", "link", "other", "kept")] == [
        "replaced",
        "replaced",
        "replaced",
        "kept",
    ]
    for name in ("old", "link", "other", "kept"):
        assert_mock_node(tmp_path / name)
    assert (tmp_path / "kept").lstat().st_ino == kept_inode  # only its mode was corrected
    assert sorted(os.listdir(tmp_path)) == ["kept", "link", "old", "other"]


def test_discovery_twice_and_a_second_process_change_nothing(tmp_path: Path) -> None:
    source_for(tmp_path, "dev-0").discover()
    inode = (tmp_path / "dev-0").lstat().st_ino
    next_pod = source_for(tmp_path, "dev-0")  # e.g. the new pod of a rolling update
    next_pod.discover()
    next_pod.discover()
    assert (tmp_path / "dev-0").lstat().st_ino == inode
    assert create_mock_device(str(tmp_path / "dev-0")) == "kept"


def test_a_directory_in_the_way_fails_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "gpu").mkdir()
    with pytest.raises(MockDeviceError) as exc:
        source_for(tmp_path, "gpu").discover()
    assert str(exc.value) == (
        f"mock device {tmp_path / 'gpu'}: is a directory, not a device node; remove it"
    )


KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    # Never contacted: the plugin stops before it talks to the apiserver.
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
    "users": [{"name": "u", "user": {"token": "t"}}],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "c",
}


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_without_cap_mknod_the_plugin_stops_at_start_with_one_line(tmp_path: Path) -> None:
    # The real fault: the real plugin, started without CAP_MKNOD in its capability set.
    mock_dir = tmp_path / "mock"
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {"sources": [{"static": {"mockDir": str(mock_dir), "devices": [{"count": 2}]}}]}
        )
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(KUBECONFIG))
    plugin = Path(sys.executable).parent / "dradriver-kubeletplugin"
    without_mknod = ["setpriv", "--bounding-set", "-mknod", "--inh-caps", "-mknod"]
    proc = subprocess.run(
        [
            *without_mknod,
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
    assert proc.stderr.splitlines() == [
        f"dradriver-kubeletplugin: error: mock device {mock_dir / 'dev-0'}: cannot make a "
        "character device node (mknod 1:3): Operation not permitted; mock devices need "
        "CAP_MKNOD: run dradriver-kubeletplugin as root with CAP_MKNOD (the chart's DaemonSet "
        "adds it for a static source with mockDir), or remove mockDir from the static source"
    ]
    assert os.listdir(mock_dir) == []  # no temp node or partial state left
