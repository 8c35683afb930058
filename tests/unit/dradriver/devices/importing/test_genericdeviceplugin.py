"""Importing generic-device-plugin and smarter-device-manager configurations as host profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.cli.main import main
from dradriver.devices.config import parse_config
from dradriver.devices.configyaml import MAX_CONFIG_BYTES
from dradriver.devices.importing import (
    import_generic_device_plugin,
    import_smarter_device_manager,
)
from dradriver.devices.importing.regexglob import Glob, regex_to_globs
from dradriver.devices.importing.result import MAX_PROFILE_NAME, MAX_SHARE
from dradriver.errors import FieldErrors


def hosts(config: dict[str, Any]) -> list[dict[str, Any]]:
    assert set(config) == {"sources"}
    out = []
    for source in config["sources"]:
        assert set(source) == {"host"}
        out.append(source["host"])
    return out


def one_loss(losses: list[str], prefix: str) -> str:
    found = [loss for loss in losses if loss.startswith(prefix + ":")]
    assert len(found) == 1, (prefix, losses)
    return found[0]


# --- generic-device-plugin -------------------------------------------------------------------

GDP_FULL = """
domain: example.org
devices:
  - name: serial
    groups:
      - paths: [{path: /dev/ttyUSB*}]
      - paths: [{path: /dev/ttyACM*, mountPath: /dev/modem, permissions: wr}]
  - name: fuse
    groups:
      - count: 10
        paths: [{path: /dev/fuse, type: Device}]
  - name: capture
    groups:
      - paths:
          - {path: /dev/snd/pcmC0D0c}
          - {path: /dev/snd/controlC0, permissions: r}
          - {path: /etc/asound.conf, type: Mount, readOnly: true, mountPath: /etc/alsa.conf}
  - name: ch340
    groups:
      - count: 2
        usb: [{vendor: "1A86", product: 7523, serial: 12345}]
"""


def test_gdp_every_field_maps_to_a_host_profile() -> None:
    result = import_generic_device_plugin(GDP_FULL)
    assert result.losses == []
    assert result.notes == []
    assert hosts(result.config) == [
        {
            "name": "serial-0",
            "nodes": [{"path": "/dev/ttyUSB*", "permissions": "rwm"}],
            "extendedResourceName": "example.org/serial",
        },
        {
            "name": "serial-1",
            "nodes": [{"path": "/dev/ttyACM*", "mountPath": "/dev/modem", "permissions": "rw"}],
            "extendedResourceName": "example.org/serial",
        },
        {
            "name": "fuse",
            "nodes": [{"path": "/dev/fuse", "permissions": "rwm"}],
            "share": 10,
            "extendedResourceName": "example.org/fuse",
        },
        {
            "name": "capture",
            "nodes": [
                {"path": "/dev/snd/pcmC0D0c", "permissions": "rwm"},
                {"path": "/dev/snd/controlC0", "permissions": "r"},
            ],
            "mounts": [
                {
                    "hostPath": "/etc/asound.conf",
                    "containerPath": "/etc/alsa.conf",
                    "readOnly": True,
                }
            ],
            "extendedResourceName": "example.org/capture",
        },
        {
            "name": "ch340",
            "nodes": [{"path": "/dev/bus/usb/*/*", "permissions": "rwm"}],
            "usb": [{"vendor": "0x1a86", "product": "0x7523", "serial": "12345"}],
            "share": 2,
            "extendedResourceName": "example.org/ch340",
        },
    ]


def test_gdp_output_dumps_as_yaml_and_reads_back() -> None:
    result = import_generic_device_plugin(GDP_FULL)
    assert yaml.safe_load(yaml.safe_dump(result.config, sort_keys=False)) == result.config


def test_gdp_domain_argument_wins_over_the_file_and_the_default_is_noted() -> None:
    result = import_generic_device_plugin(GDP_FULL, domain="squat.ai")
    assert hosts(result.config)[0]["extendedResourceName"] == "squat.ai/serial"
    bare = import_generic_device_plugin(
        "devices: [{name: kvm, groups: [{paths: [{path: /dev/kvm}]}]}]"
    )
    assert hosts(bare.config)[0]["extendedResourceName"] == "devic.es/kvm"
    assert len(bare.notes) == 1 and bare.notes[0].startswith("domain: not set")
    assert "squat.ai" in bare.notes[0]


def test_gdp_flag_forms_one_device_and_a_list() -> None:
    one = import_generic_device_plugin(
        '{"name": "fuse", "groups": [{"count": 10, "paths": [{"path": "/dev/fuse"}]}]}'
    )
    assert hosts(one.config)[0]["share"] == 10
    listed = import_generic_device_plugin("- {name: kvm, groups: [{paths: [{path: /dev/kvm}]}]}")
    assert hosts(listed.config)[0]["name"] == "kvm"
    with pytest.raises(FieldErrors, match=r"groups\[0\]\.count"):
        import_generic_device_plugin('{"name": "f", "groups": [{"count": -1}]}')
    with pytest.raises(FieldErrors, match=r"^<input>: \[0\]\.groups: "):
        import_generic_device_plugin("- {name: kvm, groups: 3}")


def test_gdp_device_alias_and_deployment_settings_are_notes() -> None:
    result = import_generic_device_plugin(
        "device: [{name: kvm, groups: [{paths: [{path: /dev/kvm}]}]}]\n"
        "domain: d.example\nplugin-directory: /x\nlog-level: debug\nlisten: ':9090'\n"
    )
    assert [h["name"] for h in hosts(result.config)] == ["kvm"]
    assert [n.split(":")[0] for n in result.notes] == ["plugin-directory", "log-level", "listen"]
    assert result.losses == []


def test_gdp_writable_mount_is_imported_read_only_with_a_loss() -> None:
    result = import_generic_device_plugin(
        "devices: [{name: a, groups: [{paths: [{path: /dev/a}, {path: /var/a, type: Mount}]}]}]"
    )
    assert hosts(result.config)[0]["mounts"] == [
        {"hostPath": "/var/a", "containerPath": "/var/a", "readOnly": True}
    ]
    assert "read-only" in one_loss(result.losses, "devices[0].groups[0].paths[1].readOnly")


def test_gdp_glob_mount_and_mount_only_group_are_losses() -> None:
    result = import_generic_device_plugin(
        "devices:\n"
        "- name: a\n"
        "  groups:\n"
        "  - paths: [{path: /dev/a}, {path: '/var/a*', type: Mount, readOnly: true}]\n"
        "  - paths: [{path: /var/b, type: Mount, readOnly: true, permissions: rw}]\n"
        "  - {}\n"
    )
    assert [h["name"] for h in hosts(result.config)] == ["a-0"]
    assert "glob" in one_loss(result.losses, "devices[0].groups[0].paths[1].path")
    assert "only Mount paths" in one_loss(result.losses, "devices[0].groups[1]")
    assert "no paths and no usb" in one_loss(result.losses, "devices[0].groups[2]")
    assert result.notes[-1].startswith("devices[0].groups[1].paths[0].permissions: dropped")


def test_gdp_read_only_on_a_device_path_is_a_note() -> None:
    result = import_generic_device_plugin(
        "devices: [{name: a, groups: [{paths: [{path: /dev/a, readOnly: true}]}]}]"
    )
    assert result.losses == []
    assert result.notes[-1].startswith("devices[0].groups[0].paths[0].readOnly: dropped")


def test_gdp_limit_on_an_exact_path_joins_every_device_with_a_loss_naming_the_cap() -> None:
    result = import_generic_device_plugin(
        "devices:\n"
        "- name: vfio\n"
        "  groups:\n"
        "  - paths: [{path: '/dev/vfio/[0-9]*'}, {path: /dev/vfio/vfio, limit: 10}]\n"
        "  - paths: [{path: '/dev/x*'}, {path: /dev/y}]\n"
        "  - paths: [{path: '/dev/p*', limit: 3}, {path: '/dev/q*'}]\n"
        "  - paths: [{path: '/dev/only*', limit: 5}]\n"
        "  - paths: [{path: /dev/e1, limit: 5}, {path: /dev/e2}]\n"
    )
    assert len(hosts(result.config)) == 5
    assert "at most 10 devices" in one_loss(result.losses, "devices[0].groups[0].paths[1].limit")
    assert "at most 1 device " in one_loss(result.losses, "devices[0].groups[1].paths[1].limit")
    assert "each match is used once" in one_loss(
        result.losses, "devices[0].groups[2].paths[0].limit"
    )
    assert len(result.losses) == 3  # a one-path group or exact paths only: limit changes nothing


def test_gdp_usb_that_may_match_several_devices_is_a_loss() -> None:
    result = import_generic_device_plugin(
        "devices:\n"
        "- name: u\n"
        "  groups:\n"
        "  - usb: [{vendor: '0x1d6b', product: '2'}]\n"
        "  - usb: [{vendor: 1d6b, product: '0002', serial: A},\n"
        "          {vendor: 1d6b, product: 3, serial: B}]\n"
        "  - usb: [{vendor: 1d6b, product: '0002', serial: A}]\n"
    )
    usb = [h["usb"] for h in hosts(result.config)]
    assert usb[0] == [{"vendor": "0x1d6b", "product": "0x0002"}]
    assert usb[1][1] == {"vendor": "0x1d6b", "product": "0x0003", "serial": "B"}
    assert "ONE device" in one_loss(result.losses, "devices[0].groups[0].usb")
    assert "ONE device" in one_loss(result.losses, "devices[0].groups[1].usb")
    assert len(result.losses) == 2


def test_gdp_count_beyond_the_share_limit_is_capped_with_a_loss() -> None:
    result = import_generic_device_plugin(
        f"devices: [{{name: f, groups: [{{count: {MAX_SHARE + 1}, "
        "paths: [{path: /dev/fuse}]}]}]"
    )
    assert hosts(result.config)[0]["share"] == MAX_SHARE
    assert str(MAX_SHARE) in one_loss(result.losses, "devices[0].groups[0].count")


def test_gdp_names_become_unique_short_dns_labels() -> None:
    long = "Very_Long_Device_Name_For_A_Serial_Adapter_On_Bus_One"
    result = import_generic_device_plugin(
        f"devices:\n- name: {long}\n  groups: [{{paths: [{{path: /dev/a}}]}}]\n"
        f"- name: {long}x\n  groups: [{{paths: [{{path: /dev/b}}]}}]\n"
        "- name: No_Groups\n"
    )
    names = [h["name"] for h in hosts(result.config)]
    assert names[0] == "very-long-device-name-for-a-serial-adapt"
    assert len(names[0]) == MAX_PROFILE_NAME
    assert names[1].endswith("-2") and len(names[1]) <= MAX_PROFILE_NAME
    assert hosts(result.config)[0]["extendedResourceName"] == f"devic.es/{long}"
    assert "no groups" in one_loss(result.losses, "devices[2].groups")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("devices: 3", r"devices: Input should be a valid list"),
        ("devices: [{groups: []}]", r"devices\[0\]\.name: Field required"),
        (
            "devices: [{name: a, grups: []}]",
            r"devices\[0\]\.grups: unknown field \(allowed: name, groups\)",
        ),
        ("colour: red", r"colour: unknown field \(allowed: devices, domain,"),
        (
            "devices: [{name: a, groups: [{paths: [{path: dev/a}]}]}]",
            r"paths\[0\]\.path: 'dev/a' is not an absolute",
        ),
        (
            "devices: [{name: a, groups: [{paths: [{path: /a, mountPath: b}]}]}]",
            r"paths\[0\]\.mountPath: 'b' is not",
        ),
        (
            "devices: [{name: a, groups: [{paths: [{path: /a, permissions: rwx}]}]}]",
            r"paths\[0\]\.permissions: 'rwx' is not",
        ),
        (
            "devices: [{name: a, groups: [{paths: [{path: /a, type: Socket}]}]}]",
            r"paths\[0\]\.type: Input should be",
        ),
        (
            "devices: [{name: a, groups: [{paths: [{path: /a, limit: -1}]}]}]",
            r"paths\[0\]\.limit: ",
        ),
        (
            "devices: [{name: a, groups: [{usb: [{vendor: xyz, product: 1}]}]}]",
            r"usb\[0\]\.vendor: 'xyz' is not a USB ID",
        ),
        (
            "devices: [{name: a, groups: [{usb: [{vendor: 12345, product: 1}]}]}]",
            r"usb\[0\]\.vendor: 12345 is not a USB ID",
        ),
        (
            "devices: [{name: a, groups: [{usb: [{vendor: 1}]}]}]",
            r"usb\[0\]\.product: Field required",
        ),
        (
            "devices: [{name: a, groups: [{usb: [{vendor: 1, product: 1}], paths: [{path: /a}]}]}]",
            r"groups\[0\]: set paths or usb, not both",
        ),
        (
            "devices: [{name: a, groups: []}, {name: a, groups: []}]",
            r"devices\[1\]\.name: 'a' is also devices\[0\]\.name",
        ),
        (
            "devices: [{name: 'a b', groups: []}]",
            r"devices\[0\]\.name: resource name 'devic.es/a b' is not",
        ),
        ("devices: [3]", r"devices\[0\]: expected a mapping"),
        ("42", r"^<input>: expected a mapping with devices"),
        ("", r"not nothing|, not nothing"),
        ("devices: [", r"not valid YAML"),
        ("a: &a [*a]", r"recursive alias"),
    ],
)
def test_gdp_malformed_input_names_the_field(text: str, message: str) -> None:
    with pytest.raises(FieldErrors, match=message):
        import_generic_device_plugin(text)


def test_gdp_oversized_input_is_refused() -> None:
    with pytest.raises(FieldErrors, match="at most"):
        import_generic_device_plugin("#" * (MAX_CONFIG_BYTES + 1))


# --- smarter-device-manager ------------------------------------------------------------------

SDM = """
- devicematch: ^fuse$
  nummaxdevices: 100
- devicematch: ^net/tun$
  nummaxdevices: 256
- devicematch: ^(kvm|vhost-net)$
  nummaxdevices: 1
- devicematch: ^ttyUSB[0-9]*$
  nummaxdevices: 1
- devicematch: ^gpiochip\\d+$
  nummaxdevices: 20
"""


def test_sdm_literal_expressions_keep_their_resource_names() -> None:
    result = import_smarter_device_manager(SDM)
    assert hosts(result.config) == [
        {
            "name": "fuse",
            "nodes": [{"path": "/dev/fuse"}],
            "share": 100,
            "extendedResourceName": "smarter-devices/fuse",
        },
        {
            "name": "net-tun",
            "nodes": [{"path": "/dev/net/tun"}],
            "share": 256,
            "extendedResourceName": "smarter-devices/net_tun",
        },
        {
            "name": "kvm",
            "nodes": [{"path": "/dev/kvm"}],
            "extendedResourceName": "smarter-devices/kvm",
        },
        {
            "name": "vhost-net",
            "nodes": [{"path": "/dev/vhost-net"}],
            "extendedResourceName": "smarter-devices/vhost-net",
        },
        {"name": "ttyusb", "nodes": [{"path": "/dev/ttyUSB*"}]},
        {"name": "gpiochip", "nodes": [{"path": "/dev/gpiochip[0-9]*"}], "share": 20},
    ]
    ttyusb = one_loss(result.losses, "[3].devicematch")
    assert "smarter-devices/ttyUSB0" in ttyusb and "ResourceClaim" in ttyusb
    assert "smarter-devices/gpiochip0" in one_loss(result.losses, "[4].devicematch")
    assert len(result.losses) == 2


def test_sdm_what_cannot_be_expressed_is_a_loss_per_entry() -> None:
    result = import_smarter_device_manager(
        "- {devicematch: nvidia-gpu, nummaxdevices: 10}\n"
        "- {devicematch: ^snd$, nummaxdevices: 0}\n"
        "- {devicematch: 'tty(S|USB)?', nummaxdevices: 1}\n"
        "- {devicematch: ^fuse$, nummaxdevices: 70000}\n"
        "- {devicematch: ^fuse$, nummaxdevices: 1}\n"
    )
    assert hosts(result.config) == [
        {
            "name": "fuse",
            "nodes": [{"path": "/dev/fuse"}],
            "share": MAX_SHARE,
            "extendedResourceName": "smarter-devices/fuse",
        }
    ]
    assert "NVIDIA" in one_loss(result.losses, "[0].devicematch")
    assert "not imported" in one_loss(result.losses, "[1].nummaxdevices")
    assert "'tty(S|USB)?' is not a simple" in one_loss(result.losses, "[2].devicematch")
    assert str(MAX_SHARE) in one_loss(result.losses, "[3].nummaxdevices")
    assert "also made by [3].devicematch" in one_loss(result.losses, "[4].devicematch")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("devicematch: ^a$", r"expected a list of \{devicematch"),
        ("- {devicematch: ^a$}", r"\[0\]\.nummaxdevices: Field required"),
        (
            "- {devicematch: 3, nummaxdevices: 1}",
            r"\[0\]\.devicematch: Input should be a valid string",
        ),
        (
            "- {devicematch: '', nummaxdevices: 1}",
            r"\[0\]\.devicematch: String should have at least",
        ),
        (
            "- {devicematch: ^a$, nummaxdevices: -1}",
            r"\[0\]\.nummaxdevices: Input should be greater",
        ),
        (
            "- {devicematch: ^a$, nummaxdevices: 1, count: 2}",
            r"\[0\]\.count: unknown field \(allowed: devicematch, nummaxdevices\)",
        ),
        ("- 3", r"\[0\]: expected a mapping"),
        ("- [", r"not valid YAML"),
    ],
)
def test_sdm_malformed_input_names_the_field(text: str, message: str) -> None:
    with pytest.raises(FieldErrors, match=message):
        import_smarter_device_manager(text)


@pytest.mark.parametrize(
    ("regex", "globs"),
    [
        ("^fuse$", [Glob("fuse", True)]),
        ("^net/tun$", [Glob("net/tun", True)]),
        ("^net\\/tun$", [Glob("net/tun", True)]),
        ("^(kvm|fuse)$", [Glob("kvm", True), Glob("fuse", True)]),
        ("^(?:kvm|fuse)$", [Glob("kvm", True), Glob("fuse", True)]),
        ("^kvm$|^fuse$", [Glob("kvm", True), Glob("fuse", True)]),
        ("^ttyUSB[0-9]*$", [Glob("ttyUSB*", False)]),
        ("^ttyUSB[0-9]+$", [Glob("ttyUSB[0-9]*", False)]),
        ("^i2c-\\d$", [Glob("i2c-[0-9]", False)]),
        ("^vcsm.*$", [Glob("vcsm*", False)]),
        ("^video.$", [Glob("video?", False)]),
        ("^sd[^0-9]$", [Glob("sd[!0-9]", False)]),
        ("^rtc0\\.x$", [Glob("rtc0.x", True)]),
    ],
)
def test_simple_expressions_become_globs(regex: str, globs: list[Glob]) -> None:
    assert regex_to_globs(regex) == globs


@pytest.mark.parametrize(
    "regex",
    [
        "fuse",
        "^fuse",
        "fuse$",
        "^fuse\\$",
        "^ttyS?$",
        "^a{2}$",
        "^a*$",
        "^(a|b)c$",
        "^(a)(b)$",
        "^((a))$",
        "^a\\w$",
        "^[a$",
        "^a)$",
        "^/dev/a$",
        "^$",
        "^a[0-9]$|b",
        "^a[.]$",
    ],
)
def test_other_expressions_are_not_guessed(regex: str) -> None:
    assert regex_to_globs(regex) is None


# --- the command -----------------------------------------------------------------------------


def test_cli_prints_yaml_on_stdout_and_losses_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "conf.yaml"
    file.write_text(SDM)
    assert main(["config", "import", "smarter-device-manager", str(file)]) == 0
    out, err = capsys.readouterr()
    document = yaml.safe_load(out)
    assert document == import_smarter_device_manager(SDM).config
    lines = err.splitlines()
    assert lines[0].startswith("lost: [3].devicematch: ")
    assert lines[1].startswith("lost: [4].devicematch: ")
    assert "2 setting(s)" in lines[2]


def test_cli_generic_device_plugin_with_domain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("devices: [{name: kvm, groups: [{count: 5, paths: [{path: /dev/kvm}]}]}]")
    assert (
        main(["config", "import", "generic-device-plugin", str(file), "--domain", "squat.ai"]) == 0
    )
    out, err = capsys.readouterr()
    assert hosts(yaml.safe_load(out)) == [
        {
            "name": "kvm",
            "nodes": [{"path": "/dev/kvm", "permissions": "rwm"}],
            "share": 5,
            "extendedResourceName": "squat.ai/kvm",
        }
    ]
    assert err == ""
    assert main(["config", "import", "generic-device-plugin", str(file)]) == 0
    out, err = capsys.readouterr()
    assert "devic.es/kvm" in out
    assert err.startswith("note: domain: not set")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"devices: [{name: kvm, groups: [{count: x}]}]", "groups[0].count: Input should be"),
        (b"\xff\xfe", "not UTF-8 text: byte 0xff at offset 0"),
        (b"#" * (MAX_CONFIG_BYTES + 1), "larger than"),
        (None, "cannot read it: No such file or directory"),
    ],
)
def test_cli_invalid_input_exits_2_with_the_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, message: str
) -> None:
    file = tmp_path / "config.yaml"
    if content is not None:
        file.write_bytes(content)
    assert main(["config", "import", "generic-device-plugin", str(file)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"dradriver config import: {file}: ")
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "result",
    [
        pytest.param(lambda: import_generic_device_plugin(GDP_FULL), id="generic-device-plugin"),
        pytest.param(lambda: import_smarter_device_manager(SDM), id="smarter-device-manager"),
    ],
)
def test_an_imported_configuration_is_a_valid_driver_configuration(result: Any) -> None:
    imported = result()
    config = parse_config(yaml.safe_dump(imported.config, sort_keys=False), "imported.yaml")
    assert [s.kind for s in config.sources] == ["host"] * len(imported.config["sources"])


def test_kvm_fuse_tun_and_a_serial_glob_import_without_loss() -> None:
    """The configuration the issue names: what sandbox and home-lab users run today."""
    result = import_generic_device_plugin(
        """
devices:
  - name: kvm
    groups: [{count: 8, paths: [{path: /dev/kvm}]}]
  - name: fuse
    groups: [{count: 256, paths: [{path: /dev/fuse}]}]
  - name: tun
    groups: [{count: 256, paths: [{path: /dev/net/tun}]}]
  - name: serial
    groups: [{paths: [{path: /dev/serial/by-id/*}]}]
""",
        domain="squat.ai",
    )
    assert result.losses == []
    config = parse_config(yaml.safe_dump(result.config), "imported.yaml")
    profiles = {s.host.name: s.host for s in config.sources if s.host is not None}
    assert {name: p.share for name, p in profiles.items()} == {
        "kvm": 8,
        "fuse": 256,
        "tun": 256,
        "serial": None,
    }
    assert profiles["kvm"].extended_resource_name == "squat.ai/kvm"
    assert [n.path for n in profiles["serial"].nodes] == ["/dev/serial/by-id/*"]
