"""The driver configuration loader on hostile input: it returns a DriverConfig or raises
DriverConfigError, never anything else (no TypeError, RecursionError, UnicodeDecodeError,
no traceback for the operator), whatever the file holds."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dradriver.devices.config import DriverConfig, load_config, parse_config
from dradriver.devices.configyaml import DriverConfigError

FUZZ = settings(
    derandomize=True,
    deadline=None,
    max_examples=300,
    suppress_health_check=[HealthCheck.too_slow],
)

# Real keys at every level, so that examples get past "unknown key" into the models.
KEYS = [
    "driverName", "sources", "static", "devglob", "pci", "devices", "name", "namePrefix",
    "count", "attributes", "capacity", "consumesCounters", "counterSet", "counters",
    "counterSets", "taints", "key", "effect", "healthFiles", "edits", "env", "deviceNodes",
    "path", "mockDir", "glob", "vendor", "device", "class", "sysfsRoot", "hooks", "setup",
    "teardown", "command", "python", "timeoutSeconds", "devicePlugin", "enabled", "mode",
    "resources", "resourceName", "names", "preStart", "hideFromDRA", "version", "value",
]  # fmt: skip
# YAML's own syntax, weighted up: anchors, aliases, tags, flow and block structure.
FRAGMENTS = [
    "[", "]", "{", "}", ": ", ", ", "- ", "\n", "\n  ", "\n    ", "? ", "&a ", "*a", "&b ",
    "*b", "!!int ", "!!bool ", "!!float ", "!!timestamp ", "!!binary ", "!!set ", "!!omap ",
    "!!python/object:os.system ", "<<: ", "---\n", "...\n", "'", '"', "\\u", "\\ud800", "|\n",
    ">\n", "#", "%YAML 1.1\n", "2001-02-30", "0x1F", "1e999", ".inf", "~", "null", "yes",
    "1" * 40, "\t", "\x00", "\ufeff", "\ud800", "é",
]  # fmt: skip

yaml_like = st.lists(
    st.sampled_from(FRAGMENTS) | st.sampled_from(KEYS) | st.text(max_size=6), max_size=40
).map("".join)

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(KEYS)
)
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=25,
)


def only_config_errors(text: str) -> None:
    try:
        result = parse_config(text, "fuzz.yaml")
    except DriverConfigError as e:
        assert str(e).startswith("fuzz.yaml: ")
    else:
        assert isinstance(result, DriverConfig)


@FUZZ
@given(yaml_like)
def test_yaml_like_text(text: str) -> None:
    only_config_errors(text)


@FUZZ
@given(st.text(st.characters(codec=None, exclude_categories=[]), max_size=200))
def test_any_text(text: str) -> None:
    only_config_errors(text)


@FUZZ
@given(documents)
def test_documents_with_real_keys(document: Any) -> None:
    only_config_errors(yaml.safe_dump(document, allow_unicode=True))
    only_config_errors(yaml.safe_dump({"sources": [{"static": {"devices": [document]}}]}))


@settings(FUZZ, max_examples=100)  # PyYAML scans ahead over every "[" of a flow: ~50 ms each
@given(st.integers(min_value=1, max_value=3000), st.sampled_from(["[", "{a: ", "- ", "&x ["]))
def test_deep_nesting(depth: int, opener: str) -> None:
    closer = {"[": "]", "{a: ": "}", "- ": "", "&x [": "]"}[opener]
    only_config_errors(opener * depth + "1" + closer * depth)


@FUZZ
@given(st.integers(min_value=1, max_value=12), st.integers(min_value=2, max_value=12))
def test_alias_expansion(levels: int, width: int) -> None:
    lines = ["l0: &l0 [x]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    only_config_errors("\n".join(lines) + f"\nsources: *l{levels}\n")
    only_config_errors("\n".join(lines[1:]).replace("l1: &l1", "l1: &l0 [*l0]\nl1: &l1"))


@settings(derandomize=True, deadline=None, max_examples=100)
@given(st.binary(max_size=200))
def test_any_file_content(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "driver.yaml"
        path.write_bytes(content)
        try:
            result = load_config(path)
        except DriverConfigError as e:
            assert e.file == str(path)
        else:
            assert isinstance(result, DriverConfig)
