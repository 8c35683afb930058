"""The host device source on made-up /dev and sysfs trees (nodes with made-up numbers)."""

from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from dradriver.devices.attributes import IntAttribute, StringAttribute
from dradriver.devices.hostdev import identity as ident
from dradriver.devices.hostdev.config import HostSourceConfig
from dradriver.devices.hostdev.source import READ_ONLY_MOUNT_OPTIONS, HostDeviceSource
from dradriver.devices.model import Device
from dradriver.devices.sources import DeviceSource, discover_all
from dradriver.host.containeredits import DeviceNode

DRIVER = "dradriver.dev"
MAJOR = 240  # a "local/experimental" major number: no real device has it


class FakeHost:
    """A /dev and a /sys under ``root``, laid out as the kernel and udev lay them out."""

    def __init__(self, root: Path) -> None:
        self.dev = root / "dev"
        self.sys = root / "sys"
        self.dev.mkdir()
        (self.sys / "dev" / "char").mkdir(parents=True)
        (self.sys / "dev" / "block").mkdir(parents=True)

    def node(
        self,
        name: str,
        minor: int,
        *,
        subsystem: str = "misc",
        usb: dict[str, str] | None = None,
        by_id: str | None = None,
        by_path: str | None = None,
        block: bool = False,
    ) -> Path:
        path = self.dev / name
        path.parent.mkdir(parents=True, exist_ok=True)
        kind = stat.S_IFBLK if block else stat.S_IFCHR
        os.mknod(path, kind | 0o600, os.makedev(MAJOR, minor))
        class_dir = self.sys / "class" / subsystem
        class_dir.mkdir(parents=True, exist_ok=True)
        if usb is None:
            node_dir = self.sys / "devices" / "virtual" / subsystem / path.name
        else:
            usb_dir = self.sys / "devices" / "pci0000:00" / "usb1" / usb["busPath"]
            usb_dir.mkdir(parents=True, exist_ok=True)
            bus, devpath = usb["busPath"].split("-", 1)
            files = {"idVendor": usb["vendor"], "idProduct": usb["product"], "busnum": bus}
            files["devpath"] = devpath
            if "serial" in usb:
                files["serial"] = usb["serial"]
            for file, text in files.items():
                (usb_dir / file).write_text(text + "\n")
            port = usb_dir / f"{usb['busPath']}:1.0" / path.name
            port.mkdir(parents=True, exist_ok=True)
            node_dir = port / subsystem / path.name
            node_dir.mkdir(parents=True, exist_ok=True)
            (node_dir / "device").symlink_to(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        (node_dir / "subsystem").symlink_to(class_dir)
        (node_dir / "dev").write_text(f"{MAJOR}:{minor}\n")
        kind_dir = "block" if block else "char"
        (self.sys / "dev" / kind_dir / f"{MAJOR}:{minor}").symlink_to(node_dir)
        for link_dir, link in (("serial/by-id", by_id), ("serial/by-path", by_path)):
            if link is not None:
                (self.dev / link_dir).mkdir(parents=True, exist_ok=True)
                (self.dev / link_dir / link).symlink_to(os.path.relpath(path, self.dev / link_dir))
        return path

    def unplug(self, name: str) -> None:
        """The node, its udev links and its sysfs entries go (the USB device stays, unused)."""
        path = self.dev / name
        numbers = os.stat(path).st_rdev
        for link_dir in ("serial/by-id", "serial/by-path"):
            directory = self.dev / link_dir
            for link in directory.glob("*") if directory.exists() else ():
                if os.path.realpath(link) == str(path.resolve()):
                    link.unlink()
        path.unlink()
        for kind in ("char", "block"):
            entry = self.sys / "dev" / kind / f"{os.major(numbers)}:{os.minor(numbers)}"
            if entry.is_symlink():
                shutil.rmtree(entry.resolve())
                entry.unlink()

    def config(self, **fields: Any) -> HostSourceConfig:
        return HostSourceConfig.model_validate(
            {"sysfsRoot": str(self.sys), "devRoot": str(self.dev), **fields}
        )


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path)


def _string(device: Device, name: str) -> str:
    value = device.attributes[name]
    assert isinstance(value, StringAttribute)
    return value.value


def _int(device: Device, name: str) -> int:
    value = device.attributes[name]
    assert isinstance(value, IntAttribute)
    return value.value


# --------------------------------------------------------------------------------------------
# Exact nodes and sharing
# --------------------------------------------------------------------------------------------


def test_a_shared_exact_node_is_n_slot_devices_without_consumable_capacity(host: FakeHost) -> None:
    host.node("kvm", 232)
    config = host.config(name="kvm", nodes=[{"path": "/dev/kvm"}], share=3)
    source: DeviceSource = HostDeviceSource("sources[0] (host)", config)

    devices = source.discover()

    assert [d.name for d in devices] == ["kvm-0", "kvm-1", "kvm-2"]
    for slot, device in enumerate(devices):
        assert _int(device, "slot") == slot
        assert _string(device, "hostDevice") == "kvm"
        assert not device.allow_multiple_allocations
        assert device.edits.device_nodes == (
            DeviceNode(path="/dev/kvm", host_path=str(host.dev / "kvm"), permissions="rw"),
        )
        assert _string(device, "path") == "/dev/kvm"
        assert _string(device, "subsystem") == "misc"
        assert (_int(device, "major"), _int(device, "minor")) == (MAJOR, 232)


def test_a_shared_exact_node_is_one_device_with_slots_capacity_when_the_cluster_has_it(
    host: FakeHost,
) -> None:
    host.node("kvm", 232)
    config = host.config(name="kvm", nodes=[{"path": "/dev/kvm"}], share=256)
    source = HostDeviceSource("s", config, consumable_capacity=True)

    (device,) = source.discover()

    api = device.to_api(DRIVER)
    assert api["name"] == "kvm"
    assert api["allowMultipleAllocations"] is True
    assert api["capacity"] == {"slots": {"value": "256", "requestPolicy": {"default": "1"}}}
    assert "slot" not in api["attributes"]

    source.consumable_capacity = False  # the owner learnt otherwise: slots from now on
    assert len(source.discover()) == 256


def test_an_exclusive_exact_node_is_one_device_named_after_the_profile(host: FakeHost) -> None:
    host.node("net/tun", 200)
    config = host.config(
        name="tun",
        nodes=[{"path": "/dev/net/tun", "mountPath": "/dev/net/tun", "permissions": "rwm"}],
        env={"TUN": "1"},
        mounts=[{"hostPath": "/etc/tun.conf", "containerPath": "/etc/tun.conf"}],
        attributes={"kind": "tun"},
    )

    (device,) = HostDeviceSource("s", config).discover()

    assert device.name == "tun"
    assert _string(device, "kind") == "tun"
    assert _string(device, "identity") == "path:/dev/net/tun"
    (node,) = device.edits.device_nodes
    assert (node.path, node.permissions) == ("/dev/net/tun", "rwm")
    assert device.edits.env == {"TUN": "1"}
    (mount,) = device.edits.mounts
    assert (mount.host_path, mount.options) == ("/etc/tun.conf", READ_ONLY_MOUNT_OPTIONS)


def test_an_exact_node_never_seen_is_no_device_and_a_vanished_one_is_unhealthy(
    host: FakeHost,
) -> None:
    source = HostDeviceSource("s", host.config(name="fuse", nodes=[{"path": "/dev/fuse"}]))
    assert source.discover() == []

    host.node("fuse", 229)
    (device,) = source.discover()
    assert device.healthy

    host.unplug("fuse")
    (device,) = source.discover()
    assert (device.name, device.healthy) == ("fuse", False)
    assert device.api_taints(DRIVER)[0]["key"] == f"{DRIVER}/unhealthy"

    host.node("fuse", 229)
    (device,) = source.discover()
    assert device.healthy


# --------------------------------------------------------------------------------------------
# Globs, identities, USB
# --------------------------------------------------------------------------------------------

FTDI = {"vendor": "0403", "product": "6001"}


def test_a_renamed_serial_device_keeps_its_name_and_heals(host: FakeHost) -> None:
    host.node("ttyUSB0", 0, subsystem="tty", usb={**FTDI, "serial": "A1", "busPath": "1-1.2"})
    config = host.config(name="serial", nodes=[{"path": "/dev/ttyUSB*"}], identity="serial")
    source = HostDeviceSource("s", config)

    (first,) = source.discover()
    assert first.name == ident.device_name("serial", ident.Identity("serial", "0403:6001:A1"))
    assert first.name.startswith("serial-serial-")
    assert _string(first, "path") == "/dev/ttyUSB0"

    host.unplug("ttyUSB0")
    (gone,) = source.discover()
    assert (gone.name, gone.healthy) == (first.name, False)

    host.node("ttyUSB3", 3, subsystem="tty", usb={**FTDI, "serial": "A1", "busPath": "1-1.4"})
    (back,) = source.discover()
    assert (back.name, back.healthy) == (first.name, True)
    assert _string(back, "path") == "/dev/ttyUSB3"
    assert _string(back, "busPath") == "1-1.4"
    assert back.edits.device_nodes[0].host_path == str(host.dev / "ttyUSB3")


def test_auto_identity_prefers_the_by_id_link_and_reads_usb_attributes(host: FakeHost) -> None:
    host.node(
        "ttyUSB0",
        0,
        subsystem="tty",
        usb={**FTDI, "serial": "A1", "busPath": "1-1.2"},
        by_id="usb-FTDI_FT232R_A1-if00-port0",
        by_path="pci-0000:00:14.0-usb-0:1.2:1.0-port0",
    )
    host.node("ttyUSB1", 1, subsystem="tty", by_path="platform-serial-port1")
    host.node("ttyUSB2", 2, subsystem="tty")
    config = host.config(name="tty", nodes=[{"path": "/dev/ttyUSB*", "mountPath": "/dev/"}])

    devices = HostDeviceSource("s", config).discover()

    by_identity = {_string(d, "identity"): d for d in devices}
    assert sorted(by_identity) == [
        "byId:usb-FTDI_FT232R_A1-if00-port0",
        "byPath:platform-serial-port1",
        "path:/dev/ttyUSB2",
    ]
    usb = by_identity["byId:usb-FTDI_FT232R_A1-if00-port0"]
    assert usb.name.startswith("tty-id-")
    assert {
        k: _string(usb, k) for k in ("subsystem", "vendor", "product", "serial", "busPath")
    } == {
        "subsystem": "tty",
        "vendor": "0403",
        "product": "6001",
        "serial": "A1",
        "busPath": "1-1.2",
    }
    assert usb.edits.device_nodes[0].path == "/dev/ttyUSB0"
    assert "vendor" not in by_identity["path:/dev/ttyUSB2"].attributes


def test_a_by_id_glob_hands_the_runtime_the_real_node(host: FakeHost) -> None:
    host.node("ttyACM0", 5, subsystem="tty", by_id="usb-Arduino_1234-if00")
    config = host.config(
        name="arduino",
        nodes=[{"path": "/dev/serial/by-id/*", "mountPath": "/dev/arduino/"}],
        identity="byId",
    )

    (device,) = HostDeviceSource("s", config).discover()

    (node,) = device.edits.device_nodes
    assert node.path == "/dev/arduino/usb-Arduino_1234-if00"
    assert node.host_path == str(host.dev / "ttyACM0")
    assert _string(device, "path") == "/dev/ttyACM0"
    assert _string(device, "identity") == "byId:usb-Arduino_1234-if00"


def test_usb_matchers_select_by_vendor_product_and_serial(host: FakeHost) -> None:
    host.node("ttyUSB0", 0, subsystem="tty", usb={**FTDI, "serial": "A1", "busPath": "1-1"})
    host.node("ttyUSB1", 1, subsystem="tty", usb={**FTDI, "serial": "B2", "busPath": "1-2"})
    other = {"vendor": "1a86", "product": "7523", "busPath": "1-3"}
    host.node("ttyUSB2", 2, subsystem="tty", usb=other)
    host.node("ttyUSB3", 3, subsystem="tty")

    def serials(usb: list[dict[str, str]]) -> list[str]:
        config = host.config(name="u", nodes=[{"path": "/dev/ttyUSB*"}], usb=usb)
        return sorted(_string(d, "path") for d in HostDeviceSource("s", config).discover())

    assert serials([{"vendor": "0x0403", "product": "0x6001"}]) == ["/dev/ttyUSB0", "/dev/ttyUSB1"]
    assert serials([{"vendor": "0403", "product": "6001", "serial": "B2"}]) == ["/dev/ttyUSB1"]
    assert serials([{"vendor": "0x1A86", "product": "0x7523"}]) == ["/dev/ttyUSB2"]
    assert serials([{"vendor": "dead", "product": "beef"}]) == []


def test_two_devices_with_one_serial_do_not_share_a_name(host: FakeHost) -> None:
    host.node("ttyUSB0", 0, subsystem="tty", usb={**FTDI, "serial": "0", "busPath": "1-1"})
    host.node("ttyUSB1", 1, subsystem="tty", usb={**FTDI, "serial": "0", "busPath": "1-2"})
    config = host.config(name="cheap", nodes=[{"path": "/dev/ttyUSB*"}], identity="serial")

    devices = HostDeviceSource("s", config).discover()

    assert len({d.name for d in devices}) == 2
    assert sorted(_string(d, "identity") for d in devices) == [
        "path:/dev/ttyUSB1",
        "serial:0403:6001:0",
    ]


def test_a_match_without_the_identity_asked_for_is_skipped_with_one_warning(
    host: FakeHost, caplog: pytest.LogCaptureFixture
) -> None:
    host.node("ttyS0", 64, subsystem="tty")
    (host.dev / "ttyS-notes").write_text("not a device")
    config = host.config(name="s", nodes=[{"path": "/dev/ttyS*"}], identity="byId")
    source = HostDeviceSource("s", config)
    logger = logging.getLogger("dradriver.devices.health")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="dradriver.devices.health"):
            assert source.discover() == []
            assert source.discover() == []
    finally:
        logger.removeHandler(caplog.handler)
    records = {id(r): r for r in caplog.records if r.levelno == logging.WARNING}  # may come twice
    warnings = [r.getMessage() for r in records.values()]
    assert len(warnings) == 2, warnings  # each problem once, not at every scan
    assert any("has no byId identity" in w for w in warnings)
    assert any("not a character or block device" in w for w in warnings)


# --------------------------------------------------------------------------------------------
# Groups
# --------------------------------------------------------------------------------------------


def test_groups_pair_the_ith_match_of_each_glob_and_exact_nodes_join_every_device(
    host: FakeHost,
) -> None:
    for i in range(3):
        host.node(f"vfio/{i}", 10 + i)
    for i in range(2):
        host.node(f"dri/card{i}", 20 + i)
    host.node("vfio/vfio", 30)
    config = host.config(
        name="gpu",
        nodes=[
            {"path": "/dev/dri/card*"},
            {"path": "/dev/vfio/[0-9]*"},
            {"path": "/dev/vfio/vfio", "optional": True},
            {"path": "/dev/accel*", "optional": True},
        ],
        identity="path",
    )

    devices = HostDeviceSource("s", config).discover()

    members = sorted(tuple(n.path for n in d.edits.device_nodes) for d in devices)
    assert members == [
        ("/dev/dri/card0", "/dev/vfio/0", "/dev/vfio/vfio"),
        ("/dev/dri/card1", "/dev/vfio/1", "/dev/vfio/vfio"),
    ]
    assert sorted(_string(d, "identity") for d in devices) == [
        "path:/dev/dri/card0",
        "path:/dev/dri/card1",
    ]


def test_a_missing_required_exact_node_means_no_device(host: FakeHost) -> None:
    host.node("loop0", 0, block=True)
    config = host.config(name="loop", nodes=[{"path": "/dev/loop[0-7]"}, {"path": "/dev/lc"}])
    source = HostDeviceSource("s", config)
    assert source.discover() == []

    host.node("lc", 237)
    (device,) = source.discover()
    assert [n.path for n in device.edits.device_nodes] == ["/dev/loop0", "/dev/lc"]
    assert _string(device, "identity") == "path:/dev/loop0"


def test_a_shared_glob_shares_each_match(host: FakeHost) -> None:
    host.node("loop0", 0, block=True)
    host.node("loop1", 1, block=True)
    config = host.config(name="loop", nodes=[{"path": "/dev/loop*"}], share=2)

    slots = HostDeviceSource("s", config).discover()
    shared = HostDeviceSource("s", config, consumable_capacity=True).discover()

    assert len(slots) == 4
    hosts = {_string(d, "hostDevice") for d in slots}
    assert hosts == {d.name for d in shared}
    assert {d.name for d in slots} == {f"{h}-{i}" for h in hosts for i in range(2)}
    assert all(d.allow_multiple_allocations for d in shared)


# --------------------------------------------------------------------------------------------
# Together with the other sources
# --------------------------------------------------------------------------------------------


def test_profiles_publish_together_through_discover_all(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = FakeHost(tmp_path / "a"), FakeHost(tmp_path / "b")
    a.node("kvm", 232)
    b.node("fuse", 229)
    sources: list[DeviceSource] = [
        HostDeviceSource("sources[0] (host)", a.config(name="kvm", nodes=[{"path": "/dev/kvm"}])),
        HostDeviceSource(
            "sources[1] (host)", b.config(name="fuse", nodes=[{"path": "/dev/fuse"}], share=2)
        ),
    ]

    assert [d.name for d in discover_all(sources)] == ["fuse-0", "fuse-1", "kvm"]


def test_raw_usb_nodes_by_vendor_under_a_glob_directory(host: FakeHost) -> None:
    """/dev/bus/usb/<bus>/<dev>: the node's own sysfs directory is the USB device."""
    for bus, dev, product in (("001", 2, "0002"), ("002", 5, "0003")):
        node = host.dev / "bus" / "usb" / bus / f"{dev:03}"
        node.parent.mkdir(parents=True, exist_ok=True)
        minor = int(bus) * 128 + dev
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(MAJOR, minor))
        usb_dir = host.sys / "devices" / "pci0000:00" / f"usb{int(bus)}" / f"{int(bus)}-1"
        usb_dir.mkdir(parents=True)
        for file, text in (("idVendor", "1d6b"), ("idProduct", product), ("serial", "S" + bus)):
            (usb_dir / file).write_text(text + "\n")
        (usb_dir / "busnum").write_text(f"{int(bus)}\n")
        (usb_dir / "devpath").write_text("1\n")
        (host.sys / "class" / "usb").mkdir(parents=True, exist_ok=True)
        (usb_dir / "subsystem").symlink_to(host.sys / "class" / "usb")
        (host.sys / "dev" / "char" / f"{MAJOR}:{minor}").symlink_to(usb_dir)
    config = host.config(
        name="hub",
        nodes=[{"path": "/dev/bus/usb/*/*"}],
        usb=[{"vendor": "0x1d6b", "product": "0x0003"}],
    )
    source = HostDeviceSource("s", config)

    (device,) = source.discover()

    assert _string(device, "identity") == "serial:1d6b:0003:S002"
    assert _string(device, "path") == "/dev/bus/usb/002/005"
    assert (_string(device, "subsystem"), _string(device, "busPath")) == ("usb", "2-1")
    assert str(host.dev / "bus" / "usb" / "*") in source.watch_dirs()
    assert str(host.dev / "serial" / "by-id") in source.watch_dirs()
