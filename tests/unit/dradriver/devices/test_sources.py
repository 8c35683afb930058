"""Device sources on real files: mock devices, /dev-style globs, a fake and the real sysfs."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dradriver.devices.attributes import IntAttribute, StringAttribute
from dradriver.devices.config import parse_config
from dradriver.devices.devglob import DevGlobSource, device_name_for_path
from dradriver.devices.model import Device
from dradriver.devices.pci import PciSource, device_name_for_address
from dradriver.devices.sourceconfig import DevGlobSourceConfig, PciSourceConfig, StaticSourceConfig
from dradriver.devices.sources import (
    DeviceSource,
    DuplicateDeviceError,
    build_sources,
    discover_all,
)
from dradriver.devices.static import StaticSource, create_mock_device, is_mock_device
from dradriver.devices.topology import PCIE_ROOT_ATTRIBUTE
from dradriver.k8s.names import validate_dns_label

DRIVER = "dradriver.dev"


def _by_name(devices: list[Device]) -> dict[str, Device]:
    return {d.name: d for d in devices}


def make_device_node(path: Path) -> None:
    """A character device like those devglob finds in /dev (with /dev/null's numbers)."""
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))


# --------------------------------------------------------------------------------------------
# static
# --------------------------------------------------------------------------------------------


def test_static_mock_dir_creates_device_nodes_and_health_follows_them(tmp_path: Path) -> None:
    mock_dir = tmp_path / "state" / "mock"
    config = StaticSourceConfig.model_validate(
        {"mockDir": str(mock_dir), "devices": [{"count": 3, "attributes": {"model": "m"}}]}
    )
    source = StaticSource("sources[0] (static)", config)
    assert not mock_dir.exists()  # nothing happens before the first discovery

    devices = source.discover()
    assert [d.name for d in devices] == ["dev-0", "dev-1", "dev-2"]
    assert all(d.healthy for d in devices)
    for device in devices:
        path = mock_dir / device.name
        assert is_mock_device(path.lstat())  # a char device 1:3, what a runtime accepts
        assert device.health_files == (str(path),)
        assert device.edits.to_cdi() == {
            "env": [
                f"DRADRIVER_DEVICE_{device.name.upper().replace('-', '_')}="
                f"/dev/dradriver/{device.name}"
            ],
            "deviceNodes": [{"path": f"/dev/dradriver/{device.name}", "hostPath": str(path)}],
        }
    assert devices[1].attributes["index"] == IntAttribute(value=1)

    (mock_dir / "dev-1").unlink()
    after = _by_name(source.discover())
    assert not after["dev-1"].healthy
    assert after["dev-0"].healthy and after["dev-2"].healthy
    assert after["dev-1"].to_api(DRIVER)["taints"][0]["key"] == "dradriver.dev/unhealthy"

    assert create_mock_device(str(mock_dir / "dev-1")) == "created"
    assert all(d.healthy for d in source.discover())


def test_static_mock_device_edits_merge_with_configured_edits(tmp_path: Path) -> None:
    config = StaticSourceConfig.model_validate(
        {"mockDir": str(tmp_path), "devices": [{"name": "gpu", "edits": {"env": {"X": "1"}}}]}
    )
    (device,) = StaticSource("s", config).discover()
    assert device.edits.env == {"DRADRIVER_DEVICE_GPU": "/dev/dradriver/gpu", "X": "1"}


def test_static_without_mock_dir_uses_configured_health_files(tmp_path: Path) -> None:
    flag = tmp_path / "present"
    config = StaticSourceConfig.model_validate(
        {"devices": [{"name": "a", "healthFiles": [str(flag)]}, {"name": "b"}]}
    )
    source = StaticSource("s", config)
    assert [d.healthy for d in source.discover()] == [False, True]
    flag.touch()
    assert [d.healthy for d in source.discover()] == [True, True]
    assert source.discover()[1].edits.is_empty()


# --------------------------------------------------------------------------------------------
# devglob
# --------------------------------------------------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: string attributes (like ``path``) hold 64 characters."""
    directory = Path(tempfile.mkdtemp(prefix="dg"))
    yield directory
    shutil.rmtree(directory)


def test_devglob_one_device_per_matching_path(short_dir: Path) -> None:
    tmp_path = short_dir
    for name in ("fake0", "fake1", "Fake_GPU.2", "other"):
        make_device_node(tmp_path / name)
    config = DevGlobSourceConfig.model_validate(
        {"glob": str(tmp_path / "*ake*"), "attributes": {"kind": "fake"}}
    )
    source = DevGlobSource("sources[1] (devglob)", config)
    devices = _by_name(source.discover())
    assert sorted(devices) == ["fake-gpu-2", "fake0", "fake1"]
    fake0 = devices["fake0"]
    path = str(tmp_path / "fake0")
    assert fake0.attributes == {
        "kind": StringAttribute(value="fake"),
        "path": StringAttribute(value=path),
    }
    assert fake0.edits.to_cdi() == {"deviceNodes": [{"path": path, "hostPath": path}]}
    assert fake0.health_files == (path,)
    assert fake0.healthy

    (tmp_path / "fake0").unlink()
    make_device_node(tmp_path / "fake3")
    devices = _by_name(source.discover())
    assert sorted(devices) == ["fake-gpu-2", "fake0", "fake1", "fake3"]
    assert not devices["fake0"].healthy  # gone, but still known: unhealthy, not forgotten
    assert devices["fake3"].healthy
    make_device_node(tmp_path / "fake0")
    assert _by_name(source.discover())["fake0"].healthy


def test_devglob_path_too_long_for_an_attribute_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / ("x" * 70)
    make_device_node(path)
    (device,) = DevGlobSource("s", DevGlobSourceConfig(glob=str(path))).discover()
    assert "path" not in device.attributes
    assert device.edits.device_nodes[0].path == str(path)


def test_devglob_names_are_dns_labels_and_unique(tmp_path: Path) -> None:
    assert device_name_for_path("/dev/Fake_GPU.0") == "fake-gpu-0"
    assert device_name_for_path("/dev/___").startswith("dev-")
    assert len(device_name_for_path("/dev/" + "x" * 100)) == 63
    make_device_node(tmp_path / "a_b")
    make_device_node(tmp_path / "a-b")
    source = DevGlobSource("s", DevGlobSourceConfig(glob=str(tmp_path / "a*")))
    names = [d.name for d in source.discover()]
    assert len(set(names)) == 2
    assert "a-b" in names
    for name in names:
        validate_dns_label(name)


@pytest.fixture
def devglob_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Capture the source's records even if log.configure() turned propagation off."""
    logger = logging.getLogger("dradriver.devices.devglob")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Distinct WARNING records as "message path=..." (a record may reach the handler twice)."""
    records = {id(r): r for r in caplog.records if r.levelno == logging.WARNING}
    return [f"{r.getMessage()} path={r.__dict__['fields']['path']}" for r in records.values()]


def test_devglob_skips_matches_that_are_not_device_nodes(
    short_dir: Path, devglob_logs: pytest.LogCaptureFixture
) -> None:
    make_device_node(short_dir / "fake0")
    (short_dir / "fake1").write_text("a plain file: a runtime refuses it as a device node\n")
    (short_dir / "fake2").mkdir()
    (short_dir / "fake3").symlink_to(short_dir / "fake3")  # a loop
    source = DevGlobSource("s", DevGlobSourceConfig(glob=str(short_dir / "fake*")))
    assert [d.name for d in source.discover()] == ["fake0"]
    assert sorted(_warnings(devglob_logs)) == [
        f"glob match cannot be resolved: Too many levels of symbolic links; skipped "
        f"(containers get device nodes only) path={short_dir / 'fake3'}",
        f"glob match is not a character or block device; skipped (containers get device "
        f"nodes only) path={short_dir / 'fake1'}",
        f"glob match is not a character or block device; skipped (containers get device "
        f"nodes only) path={short_dir / 'fake2'}",
    ]
    source.discover()
    assert len(_warnings(devglob_logs)) == 3  # said once, not at every health check

    (short_dir / "fake1").unlink()
    make_device_node(short_dir / "fake1")  # became a device node: found now
    assert [d.name for d in source.discover()] == ["fake0", "fake1"]


def test_devglob_symlink_to_a_device_node_hands_the_runtime_the_node(short_dir: Path) -> None:
    make_device_node(short_dir / "node0")
    (short_dir / "link0").symlink_to("node0")  # like /dev/disk/by-id/... -> ../../sda
    (device,) = DevGlobSource("s", DevGlobSourceConfig(glob=str(short_dir / "link*"))).discover()
    # The runtime's CDI library lstat()s the host path: it must be the node, not the link.
    assert device.edits.to_cdi() == {
        "deviceNodes": [{"path": str(short_dir / "link0"), "hostPath": str(short_dir / "node0")}]
    }
    assert device.attributes["path"] == StringAttribute(value=str(short_dir / "link0"))


# --------------------------------------------------------------------------------------------
# pci
# --------------------------------------------------------------------------------------------


def _pci_device(
    sysfs: Path,
    parents: str,
    address: str,
    vendor: str,
    device: str,
    device_class: str,
    numa: str | None = "-1",
) -> Path:
    """A device directory under ``devices/<parents>/<address>`` and its bus symlink."""
    directory = sysfs / "devices" / parents / address
    directory.mkdir(parents=True)
    (directory / "vendor").write_text(vendor + "\n")
    (directory / "device").write_text(device + "\n")
    (directory / "class").write_text(device_class + "\n")
    if numa is not None:
        (directory / "numa_node").write_text(numa + "\n")
    bus = sysfs / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / address).symlink_to(os.path.relpath(directory, bus))
    return directory


@pytest.fixture
def fake_sysfs(tmp_path: Path) -> Path:
    sysfs = tmp_path / "sys"
    _pci_device(sysfs, "pci0000:00", "0000:00:00.0", "0x8086", "0x0d57", "0x060000")
    _pci_device(sysfs, "pci0000:00", "0000:00:1c.0", "0x8086", "0x06b8", "0x060400")
    _pci_device(
        sysfs, "pci0000:00/0000:00:1c.0", "0000:02:00.0", "0x10de", "0x2330", "0x030200", "0"
    )
    _pci_device(
        sysfs, "pci0000:80/0000:80:01.0", "0000:81:00.0", "0x10DE", "0x2330", "0x030200", "1"
    )
    _pci_device(sysfs, "pci0000:80", "0000:80:02.0", "0x15b3", "0x101d", "0x020000", None)
    return sysfs


def test_pci_fake_sysfs_attributes_pcie_root_and_numa(fake_sysfs: Path) -> None:
    config = PciSourceConfig.model_validate(
        {"sysfsRoot": str(fake_sysfs), "vendor": "0x10de", "attributes": {"model": "H100"}}
    )
    devices = PciSource("sources[2] (pci)", config).discover()
    assert [d.name for d in devices] == ["pci-0000-02-00-0", "pci-0000-81-00-0"]
    first, second = devices
    # The driver's own names are published without its domain; the standard ones keep theirs.
    assert first.to_api(DRIVER)["attributes"] == {
        "class": {"string": "0x030200"},
        "deviceID": {"string": "0x2330"},
        "model": {"string": "H100"},
        "pciAddress": {"string": "0000:02:00.0"},
        "resource.kubernetes.io/numaNode": {"int": 0},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        "vendorID": {"string": "0x10de"},
    }
    assert second.attributes[PCIE_ROOT_ATTRIBUTE] == StringAttribute(value="pci0000:80")
    assert second.attributes["resource.kubernetes.io/numaNode"] == IntAttribute(value=1)
    assert "numaNode" not in second.attributes  # the standard name replaces the driver's own
    assert second.attributes["vendorID"] == StringAttribute(value="0x10de")  # lowercased
    assert first.health_files == (str(fake_sysfs / "bus/pci/devices/0000:02:00.0"),)


def test_pci_filters(fake_sysfs: Path) -> None:
    def names(**filters: str) -> list[str]:
        config = PciSourceConfig.model_validate({"sysfsRoot": str(fake_sysfs), **filters})
        return [d.name for d in PciSource("s", config).discover()]

    assert len(names()) == 5
    assert names(**{"class": "0x0604"}) == ["pci-0000-00-1c-0"]
    assert names(**{"class": "0x06"}) == ["pci-0000-00-00-0", "pci-0000-00-1c-0"]
    assert names(vendor="0x15b3") == ["pci-0000-80-02-0"]
    assert names(vendor="10de", device="0x2330") == ["pci-0000-02-00-0", "pci-0000-81-00-0"]
    assert names(vendor="0x10de", device="0x0001") == []
    mellanox = PciSource(
        "s", PciSourceConfig.model_validate({"sysfsRoot": str(fake_sysfs), "vendor": "0x15b3"})
    ).discover()[0]
    assert "resource.kubernetes.io/numaNode" not in mellanox.attributes  # no numa_node file
    (intel,) = PciSource(
        "s",
        PciSourceConfig.model_validate(
            {"sysfsRoot": str(fake_sysfs), "vendor": "0x8086", "class": "0x0600"}
        ),
    ).discover()
    # numa_node -1 (no NUMA affinity): the attribute is left out, as the standard demands
    # (a -1 would match every other NUMA-less device under matchAttribute).
    assert "resource.kubernetes.io/numaNode" not in intel.attributes


def test_pci_device_removed_from_sysfs_turns_unhealthy(fake_sysfs: Path) -> None:
    config = PciSourceConfig.model_validate({"sysfsRoot": str(fake_sysfs), "vendor": "0x15b3"})
    source = PciSource("s", config)
    assert [d.healthy for d in source.discover()] == [True]
    (fake_sysfs / "bus/pci/devices/0000:80:02.0").unlink()
    (device,) = source.discover()
    assert device.name == "pci-0000-80-02-0"
    assert not device.healthy


def test_pci_missing_sysfs_gives_no_devices(tmp_path: Path) -> None:
    assert PciSource("s", PciSourceConfig(sysfs_root=str(tmp_path))).discover() == []


def test_device_name_for_address() -> None:
    assert device_name_for_address("0000:00:01.0") == "pci-0000-00-01-0"
    assert device_name_for_address("10000:AB:1f.7") == "pci-10000-ab-1f-7"


@pytest.mark.skipif(not os.path.isdir("/sys/bus/pci/devices"), reason="no PCI bus in sysfs")
def test_pci_on_this_machines_sysfs() -> None:
    addresses = sorted(os.listdir("/sys/bus/pci/devices"))
    devices = PciSource("real", PciSourceConfig()).discover()
    assert [d.attributes["pciAddress"] for d in devices] == [
        StringAttribute(value=a) for a in addresses
    ]
    for device in devices:
        api = device.to_api(DRIVER)
        validate_dns_label(api["name"])
        assert device.healthy
        assert api["attributes"]["vendorID"]["string"].startswith("0x")
        resolved = os.path.realpath(f"/sys/bus/pci/devices/{device.attributes['pciAddress']}")
        if "/devices/pci" in resolved:
            root = api["attributes"][PCIE_ROOT_ATTRIBUTE]["string"]
            assert root.startswith("pci") and root in resolved
    # A filter nothing matches is an empty inventory, not an error.
    assert PciSource("real", PciSourceConfig(vendor="0xfffe")).discover() == []


# --------------------------------------------------------------------------------------------
# building and combining sources
# --------------------------------------------------------------------------------------------


def test_build_sources_and_discover_all(tmp_path: Path, fake_sysfs: Path) -> None:
    make_device_node(tmp_path / "fake0")
    config = parse_config(
        f"""
sources:
  - static: {{mockDir: {tmp_path / "mock"}, devices: [{{count: 2}}]}}
  - devglob: {{glob: "{tmp_path}/fake*"}}
  - pci: {{sysfsRoot: {fake_sysfs}, class: "0x03"}}
"""
    )
    sources = build_sources(config)
    assert [s.name for s in sources] == [
        "sources[0] (static)",
        "sources[1] (devglob)",
        "sources[2] (pci)",
    ]
    devices = discover_all(sources)
    assert [d.name for d in devices] == [
        "dev-0",
        "dev-1",
        "fake0",
        "pci-0000-02-00-0",
        "pci-0000-81-00-0",
    ]


def test_duplicate_names_across_sources_name_both_sources(tmp_path: Path) -> None:
    make_device_node(tmp_path / "dev-1")
    config = parse_config(
        f"""
sources:
  - static: {{devices: [{{count: 2}}]}}
  - devglob: {{glob: "{tmp_path}/dev-*"}}
"""
    )
    with pytest.raises(DuplicateDeviceError) as exc:
        discover_all(build_sources(config))
    assert str(exc.value) == (
        "device name 'dev-1' is produced by both sources[0] (static) and sources[1] (devglob)"
    )
    assert exc.value.sources == ("sources[0] (static)", "sources[1] (devglob)")


def test_a_new_source_only_needs_name_and_discover() -> None:
    class Fixed:
        name = "fixed"

        def discover(self) -> list[Device]:
            return [Device(name="z"), Device(name="a")]

    source: DeviceSource = Fixed()
    assert [d.name for d in discover_all([source])] == ["a", "z"]
