"""The driver configuration file: YAML loading, camelCase keys, errors naming file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.devices.attributes import IntAttribute, StringAttribute, VersionAttribute
from dradriver.devices.config import (
    DriverConfig,
    DriverConfigError,
    load_config,
    parse_config,
)
from dradriver.errors import format_location

EXAMPLE = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "driver-config.yaml"

FULL = """
driverName: gpu.example.org
counterSets:
  - name: card-0
    counters: {memory: 32Gi, engines: 8}
sources:
  - static:
      mockDir: /run/mock
      devices:
        - name: half-0
          attributes: {model: m1, fw: {version: 2.0.0}, cores: 4}
          capacity: {memory: 16Gi}
          consumesCounters:
            - counterSet: card-0
              counters: {memory: 16Gi, engines: {value: 4}}
          taints: [{key: example.com/maintenance, effect: NoSchedule}]
          healthFiles: [/run/health/half-0]
          edits:
            env: {MODE: half}
            deviceNodes: [{path: /dev/card0, permissions: rw}]
        - namePrefix: vf
          count: 2
          allowMultipleAllocations: true
  - devglob:
      glob: /dev/fake*
      attributes: {kind: fake}
  - pci:
      vendor: "10DE"
      device: "0x2330"
      class: "0x03"
      sysfsRoot: /host/sys
hooks:
  setup: {command: [/bin/setup, --fast], timeoutSeconds: 5}
  teardown: {python: "mypkg.hooks:teardown"}
"""


def _write(tmp_path: Path, text: str, name: str = "driver.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str) -> DriverConfigError:
    path = _write(tmp_path, text)
    with pytest.raises(DriverConfigError) as exc:
        load_config(path)
    assert str(path) in str(exc.value)
    assert exc.value.file == str(path)
    return exc.value


def test_example_config_loads_with_four_mock_devices() -> None:
    config = load_config(EXAMPLE)
    assert config.driver_name == "dradriver.dev"
    (source,) = config.sources
    assert source.kind == "static"
    assert source.static is not None
    assert source.static.mock_dir == "/var/run/dradriver/mock"
    devices = [d for entry in source.static.devices for d in entry.expand()]
    assert [d.name for d in devices] == ["dev-0", "dev-1", "dev-2", "dev-3"]
    assert devices[2].attributes["index"] == IntAttribute(value=2)
    assert devices[0].attributes["firmware"] == VersionAttribute(value="1.4.0")


def test_full_config_camel_case_in_yaml_snake_case_in_python(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, FULL))
    assert config.driver_name == "gpu.example.org"
    assert config.counter_sets[0].counters == {"memory": "32Gi", "engines": "8"}
    static, devglob, pci = config.sources
    assert [s.kind for s in config.sources] == ["static", "devglob", "pci"]

    assert static.static is not None
    half, vfs = static.static.devices
    (device,) = half.expand()
    assert device.attributes == {
        "model": StringAttribute(value="m1"),
        "fw": VersionAttribute(value="2.0.0"),
        "cores": IntAttribute(value=4),
    }
    assert device.consumes_counters[0].counters == {"memory": "16Gi", "engines": "4"}
    assert device.taints[0].effect == "NoSchedule"
    assert device.health_files == ("/run/health/half-0",)
    assert device.edits.env == {"MODE": "half"}
    assert device.edits.device_nodes[0].permissions == "rw"
    assert [d.name for d in vfs.expand()] == ["vf-0", "vf-1"]
    assert all(d.allow_multiple_allocations for d in vfs.expand())

    assert devglob.devglob is not None
    assert devglob.devglob.glob == "/dev/fake*"
    assert pci.pci is not None
    assert (pci.pci.vendor, pci.pci.device, pci.pci.device_class) == ("0x10de", "0x2330", "0x03")
    assert pci.pci.sysfs_root == "/host/sys"

    assert config.hooks.setup is not None
    assert config.hooks.setup.command == ("/bin/setup", "--fast")
    assert config.hooks.setup.timeout_seconds == 5
    assert config.hooks.teardown is not None
    assert config.hooks.teardown.python == "mypkg.hooks:teardown"
    assert config.hooks.teardown.timeout_seconds == 30


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "# nothing yet\n"))
    assert config == DriverConfig()
    assert config.driver_name == "dradriver.dev"
    assert config.sources == ()


def test_error_names_file_and_field_path(tmp_path: Path) -> None:
    error = _error(
        tmp_path,
        """
sources:
  - static:
      devices:
        - name: dev-0
        - name: dev-1
        - name: Dev_2
""",
    )
    assert error.errors == [
        "sources[0].static.devices[2].name: device name 'Dev_2' is not a DNS label: use "
        "lowercase letters, digits and '-', starting and ending with a letter or digit"
    ]
    assert str(error).startswith(f"{tmp_path / 'driver.yaml'}: sources[0].static.devices[2].name")


def test_unknown_keys_are_rejected_at_every_level(tmp_path: Path) -> None:
    error = _error(
        tmp_path,
        """
driverNmae: x
sources:
  - static:
      devices:
        - name: dev-0
          attribute: {model: x}
hooks:
  setup: {command: [x], timeout: 3}
""",
    )
    assert sorted(error.errors) == [
        "driverNmae: unknown key (check its spelling and indentation)",
        "hooks.setup.timeout: unknown key (check its spelling and indentation)",
        "sources[0].static.devices[0].attribute: unknown key (check its spelling and indentation)",
    ]
    assert "3 errors" in str(error)


def test_invalid_values_name_their_field(tmp_path: Path) -> None:
    error = _error(
        tmp_path,
        """
sources:
  - static:
      devices:
        - name: dev-0
          attributes: {ratio: 0.5, "my-attr": 1}
          capacity: {memory: 16GB}
          taints: [{key: k, effect: Sometimes}]
""",
    )
    text = "\n".join(error.errors)
    assert "sources[0].static.devices[0].attributes.ratio: 0.5 is a number with a fraction" in text
    assert "attributes['my-attr'] (key): attribute name 'my-attr' is not a C identifier" in text
    assert "capacity.memory.value: invalid quantity '16GB'" in text
    assert "taints[0].effect: Input should be 'NoSchedule', 'NoExecute' or 'None'" in text


def test_yaml_problems(tmp_path: Path) -> None:
    error = _error(tmp_path, "sources: [\n")
    assert error.errors[0].startswith("not valid YAML")
    error = _error(tmp_path, "driverName: a.dev\ndriverName: b.dev\n")
    assert "duplicate key 'driverName' (line 2)" in error.errors[0]
    error = _error(tmp_path, "- a\n- b\n")
    assert error.errors == ["the top level must be a mapping, not list"]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DriverConfigError, match="cannot read the configuration file") as exc:
        load_config(tmp_path / "absent.yaml")
    assert str(tmp_path / "absent.yaml") in str(exc.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sources: [{}]", "sources[0]: a source must have exactly one of the keys static"),
        (
            "sources: [{static: {}, pci: {}}]",
            "sources[0]: a source must have exactly one of the keys static, devglob, pci; "
            "got static, pci",
        ),
        ("sources: [{static: {devices: [{}]}}]", "devices[0]: set name, or count"),
        (
            "sources: [{static: {devices: [{name: a, count: 2}]}}]",
            "devices[0]: set either name or count, not both",
        ),
        ("sources: [{static: {devices: [{name: a, namePrefix: b}]}}]", "namePrefix needs count"),
        ("sources: [{static: {devices: [{count: 0}]}}]", "devices[0].count: Input should be"),
        (
            "sources: [{static: {devices: [{count: 2, namePrefix: " + "p" * 62 + "}]}}]",
            "would be longer than 63 characters",
        ),
        (
            "sources: [{static: {devices: [{count: 2, attributes: {index: 1}}]}}]",
            "attributes ['index'] are set by the count shorthand itself",
        ),
        (
            "sources: [{static: {devices: [{count: 3}, {name: dev-1}]}}]",
            "sources[0].static: device name 'dev-1' of devices[1] is also used by devices[0]",
        ),
        ("sources: [{static: {mockDir: mock}}]", "mockDir: 'mock' is not an absolute path"),
        ("sources: [{devglob: {glob: 'fake*'}}]", "glob: 'fake*' is not an absolute path"),
        ("sources: [{pci: {vendor: nvidia}}]", "pci.vendor: 'nvidia' is not a PCI ID"),
        ("sources: [{pci: {class: '0x1234567'}}]", "'0x1234567' is not a PCI class prefix"),
        (
            "sources: [{pci: {attributes: {pciAddress: x}}}]",
            "attributes ['pciAddress'] are set by the pci source itself",
        ),
        ("driverName: Dra_Driver", "driverName: driver name 'Dra_Driver' is not a DNS subdomain"),
        ("driverName: " + "a" * 64, "at most 63 are allowed"),
        ("hooks: {setup: {timeoutSeconds: 3}}", "hooks.setup: set exactly one of command"),
        ("hooks: {setup: {command: [a], python: 'm:f'}}", "set exactly one of command"),
        ("hooks: {setup: {command: []}}", "command must be a non-empty list"),
        ("hooks: {teardown: {python: 'module.func'}}", "must have the form 'package.module:"),
        ("hooks: {setup: {command: [a], timeoutSeconds: 0}}", "timeoutSeconds: Input should be"),
        (
            "counterSets: [{name: a, counters: {x: 1}}, {name: a, counters: {x: 1}}]",
            "counterSets[1].name: counter set 'a' is declared twice",
        ),
        (
            "sources: [{static: {devices: [{name: d, consumesCounters: "
            "[{counterSet: nope, counters: {x: 1}}]}]}}]",
            "sources[0].static.devices[0].consumesCounters[0].counterSet: counter set 'nope' "
            "is not declared in counterSets",
        ),
        (
            "counterSets: [{name: a, counters: {x: 1}}]\n"
            "sources: [{static: {devices: [{name: d, consumesCounters: "
            "[{counterSet: a, counters: {y: 1}}]}]}}]",
            "consumesCounters[0].counters: counter set 'a' has no counters ['y']",
        ),
    ],
)
def test_specific_errors(tmp_path: Path, text: str, message: str) -> None:
    error = _error(tmp_path, text)
    assert message in "\n".join(error.errors), error.errors


def test_parse_config_names_its_origin() -> None:
    with pytest.raises(DriverConfigError, match=r"^configmap/dradriver: driverName"):
        parse_config("driverName: X", "configmap/dradriver")


def test_with_mock_dir_points_static_sources_elsewhere(tmp_path: Path) -> None:
    config = load_config(EXAMPLE).with_mock_dir(str(tmp_path))
    assert config.sources[0].static is not None
    assert config.sources[0].static.mock_dir == str(tmp_path)
    with pytest.raises(ValueError, match="not an absolute path"):
        config.with_mock_dir("relative")
    unchanged = parse_config("sources: [{static: {devices: [{name: a}]}}]").with_mock_dir("/x")
    assert unchanged.sources[0].static is not None
    assert unchanged.sources[0].static.mock_dir is None


def test_format_location() -> None:
    assert format_location(("sources", 0, "static", "devices", 2, "name")) == (
        "sources[0].static.devices[2].name"
    )
    assert format_location(("attributes", "a.b/c", "[key]")) == "attributes['a.b/c'] (key)"
    assert format_location(()) == ""
