"""Validation of host-device profiles: every rule, with the field and the fix named."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from dradriver.devices.hostdev.config import HostSourceConfig
from dradriver.errors import from_validation_error

KVM = {"name": "kvm", "nodes": [{"path": "/dev/kvm"}]}


def _errors(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        HostSourceConfig.model_validate(data)
    return [str(e) for e in from_validation_error(caught.value, HostSourceConfig)]


def test_a_full_profile_reads_with_its_defaults() -> None:
    config = HostSourceConfig.model_validate(
        {
            "name": "serial",
            "nodes": [
                {"path": "/dev/ttyUSB*", "mountPath": "/dev/", "permissions": "rwm"},
                {"path": "/dev/vfio/vfio", "optional": True},
            ],
            "share": 4,
            "identity": "byId",
            "usb": [{"vendor": "0x1D6B", "product": "0002", "serial": "ABC123"}],
            "sysfsRoot": "/tmp/sys",
            "devRoot": "/tmp/dev",
            "env": {"KEY": "value"},
            "mounts": [{"hostPath": "/etc/x", "containerPath": "/etc/x", "readOnly": True}],
            "extendedResourceName": "example.com/serial",
            "attributes": {"model": "ft232"},
        }
    )
    assert config.usb[0].vendor == "1d6b"
    assert config.usb[0].product == "0002"
    assert config.nodes[1].permissions == "rw"
    assert config.nodes[0].container_path("/dev/ttyUSB3") == "/dev/ttyUSB3"
    assert config.on_disk("/dev/ttyUSB3") == "/tmp/dev/ttyUSB3"
    assert config.in_dev("/tmp/dev/ttyUSB3") == "/dev/ttyUSB3"

    kvm = HostSourceConfig.model_validate(KVM)
    assert (kvm.identity, kvm.share, kvm.sysfs_root, kvm.dev_root) == ("auto", None, "/sys", "/dev")
    assert kvm.nodes[0].container_path("/dev/kvm") == "/dev/kvm"


def test_mount_path_of_an_exact_node_and_of_a_glob() -> None:
    exact = HostSourceConfig.model_validate(
        {"name": "k", "nodes": [{"path": "/dev/kvm", "mountPath": "/dev/kvm0"}]}
    )
    assert exact.nodes[0].container_path("/dev/kvm") == "/dev/kvm0"
    glob = HostSourceConfig.model_validate(
        {"name": "l", "nodes": [{"path": "/dev/loop[0-7]", "mountPath": "/dev/host/"}]}
    )
    assert glob.nodes[0].container_path("/dev/loop3") == "/dev/host/loop3"
    renamed = HostSourceConfig.model_validate(
        {"name": "m", "nodes": [{"path": "/dev/ttyACM*", "mountPath": "/dev/modem"}]}
    )
    assert renamed.nodes[0].container_path("/dev/ttyACM2") == "/dev/modem"


def _node(**fields: Any) -> dict[str, Any]:
    return {"name": "p", "nodes": [{"path": "/dev/x", **fields}]}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({**KVM, "name": "KVM_1"}, "name: name 'KVM_1'"),
        ({**KVM, "name": "a" * 60, "share": 1000}, "use a name of at most 59 characters"),
        (
            {"name": "a" * 50, "nodes": [{"path": "/dev/tty*"}]},
            "use a name of at most 47 characters",
        ),
        ({"name": "p", "nodes": []}, "nodes: no nodes; add at least one"),
        ({"name": "p"}, "nodes: Field required"),
        (_node(path="dev/x"), "nodes[0].path: 'dev/x' is not an absolute path"),
        (_node(path="/sys/class/x"), "nodes[0].path: '/sys/class/x' is not under /dev"),
        (_node(path="/dev/../etc/x"), "contains '.' or '..'"),
        (_node(path="/dev//x"), "empty path component"),
        (_node(path="/dev/x/"), "empty path component"),
        (_node(path="/dev/loop[0-7"), "has a '[' without its ']'"),
        (_node(path="/dev/**/x"), "'**' (recursive globs) is not supported"),
        (_node(mountPath="dev/x"), "nodes[0].mountPath: 'dev/x' is not an absolute path"),
        (_node(permissions="rwx"), "nodes[0].permissions: permissions 'rwx' must be letters"),
        (_node(permissions=""), "nodes[0].permissions: permissions '' must be letters"),
        (_node(permissions="rr"), "each at most once"),
        (_node(optional=True), "nodes: every node is optional"),
        ({**KVM, "share": 0}, "share: Input should be greater than or equal to 1"),
        ({**KVM, "share": 65537}, "share: Input should be less than or equal to 65536"),
        ({**KVM, "identity": "uuid"}, "identity: Input should be 'auto', 'path', 'byId'"),
        ({**KVM, "usb": [{"vendor": "0x1d6", "product": "1"}]}, "usb[0].vendor: '0x1d6' is not"),
        ({**KVM, "usb": [{"vendor": "1d6b", "product": "zz00"}]}, "usb[0].product: 'zz00'"),
        ({**KVM, "usb": [{"vendor": "1d6b"}]}, "usb[0].product: Field required"),
        ({**KVM, "usb": [{"vendor": "1d6b", "product": "0002", "bus": 1}]}, "usb[0].bus: unknown"),
        ({**KVM, "sysfsRoot": "sys"}, "sysfsRoot: 'sys' is not an absolute path"),
        ({**KVM, "devRoot": "dev"}, "devRoot: 'dev' is not an absolute path"),
        ({**KVM, "env": {"A=B": "c"}}, "must be non-empty without '='"),
        (
            {**KVM, "mounts": [{"hostPath": "/x", "containerPath": "/x", "readOnly": False}]},
            "mounts[0]: readOnly: host profiles add read-only mounts only",
        ),
        ({**KVM, "mounts": [{"hostPath": "x", "containerPath": "/x"}]}, "mounts[0].hostPath"),
        ({**KVM, "extendedResourceName": "kvm"}, "extendedResourceName: resource name 'kvm'"),
        ({**KVM, "edits": {"env": {"A": "b"}}}, "edits: not used by host profiles"),
        ({**KVM, "allowMultipleAllocations": True}, "share a device with share: <count>"),
        ({**KVM, "capacity": {"slots": 1}}, "capacity 'slots' is set by share"),
        ({**KVM, "attributes": {"serial": "x"}}, "attributes ['serial'] are set by the host"),
        (
            {**KVM, "attributes": {f"a{i}": i for i in range(21)}},
            "which makes 33; at most 32 are allowed",
        ),
        ({**KVM, "colour": "red"}, "colour: unknown field"),
        ({"name": "p", "nodes": [{"path": "/dev/x", "type": "Mount"}]}, "nodes[0].type: unknown"),
    ],
)
def test_a_bad_profile_is_refused_naming_the_field(data: dict[str, Any], expected: str) -> None:
    errors = _errors(data)
    assert any(expected in e for e in errors), errors


def test_a_group_of_several_globs_may_be_shared() -> None:
    config = HostSourceConfig.model_validate(
        {"name": "g", "nodes": [{"path": "/dev/a*"}, {"path": "/dev/b*"}], "share": 8}
    )
    assert config.share == 8
    assert config.longest_suffix == len("-bypath-12345678-7")
