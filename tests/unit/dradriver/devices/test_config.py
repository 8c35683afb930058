"""The driver configuration file: YAML loading, camelCase keys, errors naming file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.devices.attributes import IntAttribute, StringAttribute, VersionAttribute
from dradriver.devices.config import DriverConfig, load_config, parse_config
from dradriver.devices.configyaml import MAX_CONFIG_BYTES, MAX_REPORTED_ERRORS, DriverConfigError
from dradriver.errors import format_location

EXAMPLE = Path(__file__).resolve().parents[4] / "manifests" / "examples" / "driver-config.yaml"

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


def _billion_laughs(levels: int) -> str:
    """Each anchor is a list of nine aliases of the previous one: 9**levels values.

    PyYAML builds each anchor once (shared), and pydantic stopped at the first level here;
    a consumer that walks every value would not."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nsources: *l{levels}\n"


def _device_bomb(n: int) -> str:
    """n sources, each the same static source of n aliases of one device entry."""
    device = "&d {namePrefix: dev, count: 1}" + ", *d" * (n - 1)
    return "sources:\n  - &s {static: {devices: [" + device + "]}}\n" + "  - *s\n" * (n - 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # TypeError (unhashable key) before
        ("? [a, b]\n: 1\n", "not valid YAML: a key must be a scalar, not a list"),
        ("{{a: 1}: 2}", "not valid YAML: a key must be a scalar, not a dict"),
        # RecursionError before
        ("[" * 5000 + "]" * 5000, "not valid YAML: nested deeper than 64 levels"),
        ("a:\n" + "".join(" " * i + "- \n" for i in range(1, 200)), "nested deeper than 64"),
        (_billion_laughs(8), "the document has more than 200000 values"),
        # 7 KB that pydantic validated as 360 000 devices before (~6 s; 33 KB: minutes)
        (_device_bomb(600), "the document has more than 200000 values"),
        ("a: &a [*a]\n", "recursive alias (line 1): a value contains itself"),
        # nesting through aliases: each level nests the previous one 40 deep
        (
            "a: &a " + "[" * 40 + "1" + "]" * 40 + "\nb: &b " + "[" * 40 + "*a" + "]" * 40,
            "nested deeper than 64 levels through aliases",
        ),
        # ValueError, KeyError, AttributeError from PyYAML's scalar constructors before
        ("driverName: 2001-02-30\n", "cannot read the value '2001-02-30': day is out of range"),
        ("driverName: !!bool maybe\n", "cannot read the value 'maybe'"),
        ("driverName: !!timestamp soon\n", "cannot read the value 'soon'"),
        ("driverName: " + "1" * 5000 + "\n", "Exceeds the limit (4300 digits)"),
        ("driverName: !!float fast\n", "could not convert string to float"),
    ],
)
def test_odd_yaml_is_a_config_error(tmp_path: Path, text: str, message: str) -> None:
    (error,) = _error(tmp_path, text).errors
    assert message in error


def test_binary_and_oversized_files_are_config_errors(tmp_path: Path) -> None:
    path = tmp_path / "driver.yaml"
    path.write_bytes(b"driverName: \xff\xfe\x00")  # UnicodeDecodeError before
    with pytest.raises(DriverConfigError, match="not UTF-8 text: byte 0xff at offset 12"):
        load_config(path)
    path.write_bytes(b"driverName: a\x00")
    with pytest.raises(DriverConfigError, match="not valid YAML: unacceptable character #x0000"):
        load_config(path)
    path.write_bytes(b"# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    with pytest.raises(DriverConfigError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        load_config(path)
    with pytest.raises(DriverConfigError, match=f"at most {MAX_CONFIG_BYTES} are allowed"):
        parse_config("#" * (MAX_CONFIG_BYTES + 1))


def test_many_errors_are_reported_up_to_a_bound(tmp_path: Path) -> None:
    entries = ", ".join(["{static: {devices: [{name: x, colour: red}]}}"] * 200)
    error = _error(tmp_path, f"sources: [{entries}]")
    assert len(error.errors) == MAX_REPORTED_ERRORS + 1
    assert error.errors[-1] == f"... and {200 - MAX_REPORTED_ERRORS} more errors"


def test_anchors_and_aliases_within_bounds_still_work() -> None:
    config = parse_config(
        "sources:\n"
        "  - static:\n"
        "      devices:\n"
        "        - {name: a, attributes: &common {model: mock-1}}\n"
        "        - {name: b, attributes: *common}\n"
    )
    static = config.sources[0].static
    assert static is not None
    assert [d.attributes["model"] for d in static.devices] == [StringAttribute(value="mock-1")] * 2


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
            "sources[0]: a source must have exactly one of the keys static, devglob, pci, host; "
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


# --- attribute names: no own-domain prefix (1.38 helper), standard numaNode -----------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "sources: [{static: {devices: [{name: d, attributes: {dradriver.dev/model: x}}]}}]",
            "sources[0].static.devices[0].attributes.dradriver.dev/model: attribute "
            "'dradriver.dev/model' spells out the driver's own domain; write 'model'",
        ),
        (
            "driverName: gpu.example.org\n"
            "sources: [{devglob: {glob: /dev/x*, capacity: {gpu.example.org/memory: 1Gi}}}]",
            "sources[0].devglob.capacity.gpu.example.org/memory: capacity "
            "'gpu.example.org/memory' spells out the driver's own domain; write 'memory'",
        ),
        (
            "sources: [{static: {devices: [{name: d, "
            "attributes: {resource.kubernetes.io/numaNode: -1}}]}}]",
            "sources[0].static.devices[0].attributes.resource.kubernetes.io/numaNode: must be "
            "an int NUMA node from 0 to 1023; leave it out for a device without NUMA affinity",
        ),
        (
            "sources: [{static: {devices: [{name: d, "
            'attributes: {resource.kubernetes.io/numaNode: "0"}}]}}]',
            "resource.kubernetes.io/numaNode: must be an int NUMA node",
        ),
        (
            "sources: [{pci: {attributes: {resource.kubernetes.io/numaNode: 0}}}]",
            "attributes ['resource.kubernetes.io/numaNode'] are set by the pci source itself",
        ),
    ],
)
def test_attribute_name_rules_name_the_field_and_the_fix(
    tmp_path: Path, text: str, message: str
) -> None:
    assert message in str(_error(tmp_path, text))


def test_other_domains_and_the_standard_numa_node_are_accepted_in_config() -> None:
    config = parse_config(
        "sources: [{static: {devices: [{name: d, attributes: "
        "{other.example.com/model: x, resource.kubernetes.io/numaNode: 1}}]}}]"
    )
    (source,) = config.sources
    assert source.static is not None
    (entry,) = source.static.devices
    assert set(entry.attributes) == {"other.example.com/model", "resource.kubernetes.io/numaNode"}
