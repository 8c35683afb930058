"""The CDI spec reader on any file: it returns the spec or raises a ``CDIError`` naming the
file; another vendor's file, whatever it holds, never breaks our devices; and what the
writer writes, the reader reads back."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import Phase, event, given, settings
from hypothesis import strategies as st

from dradriver.host.cdi import KNOWN_CDI_VERSIONS, CDIDevice, CDIError, CDIRegistry, CDISpecError
from dradriver.host.containeredits import ContainerEdits, DeviceNode, Mount
from tests.fuzz.strategies import deep_json, json_values, tricky_text

FUZZ = settings.get_profile("fuzz")
# For the expected failures: one bug is enough, and shrinking a 10,000-deep file is slow.
KNOWN_BUG = settings(
    FUZZ, report_multiple_bugs=False, phases=[Phase.explicit, Phase.reuse, Phase.generate]
)
VENDOR = "dradriver.dev"
KIND = f"{VENDOR}/device"
UID = "3f0b6c1e-3c1a-4f55-9b0e-6f1f1d2c9a10"


def in_registry(test: Callable[[CDIRegistry], None]) -> None:
    with tempfile.TemporaryDirectory(prefix="cdi-fuzz-") as tmp:
        test(CDIRegistry(Path(tmp) / "cdi", VENDOR, durable=False))


def read_or_refuse(registry: CDIRegistry, uid: str = UID) -> dict[str, Any] | None:
    try:
        spec = registry.read_claim(uid)
    except CDISpecError as e:
        assert str(registry.spec_path(uid)) in str(e)  # the error names the file
        event("refused")
        return None
    event("read" if spec is not None else "no file")
    return spec


@settings(FUZZ, derandomize=True, max_examples=300, deadline=None)
@given(raw=st.binary(max_size=300))
def test_any_bytes_as_a_claim_spec_read_or_are_refused(raw: bytes) -> None:
    def test(registry: CDIRegistry) -> None:
        registry.cdi_dir.mkdir(parents=True)
        registry.spec_path(UID).write_bytes(raw)
        read_or_refuse(registry)

    in_registry(test)


names = st.sampled_from(["dev-0", "dev-1", f"{UID}-dev-0", "0abc", "x:y", ""]) | tricky_text
edit_dicts = st.fixed_dictionaries(
    {},
    optional={
        "env": st.lists(st.sampled_from(["A=1", "B=", "=x", "C"]) | tricky_text | json_values(2)),
        "deviceNodes": st.lists(
            st.fixed_dictionaries(
                {"path": st.sampled_from(["/dev/a", ""]) | tricky_text},
                optional={
                    "hostPath": tricky_text,
                    "permissions": st.sampled_from(["rw", "rwm", "x", ""]),
                    "type": st.just("c"),
                },
            )
            | json_values(2),
            max_size=2,
        ),
        "mounts": st.lists(
            st.fixed_dictionaries(
                {"hostPath": tricky_text, "containerPath": tricky_text},
                optional={"options": st.lists(tricky_text | json_values(1), max_size=2)},
            )
            | json_values(2),
            max_size=2,
        ),
        "hooks": json_values(2),
    },
)
spec_dicts = st.fixed_dictionaries(
    {
        "cdiVersion": st.sampled_from([*KNOWN_CDI_VERSIONS, "0.1.0", "9.9.9", ""]) | json_values(1),
        "kind": st.sampled_from([KIND, "other.vendor/gpu", ""]) | json_values(1),
        "devices": st.lists(
            st.fixed_dictionaries(
                {"name": names | json_values(1)},
                optional={"containerEdits": edit_dicts, "annotations": json_values(2)},
            )
            | json_values(2),
            max_size=3,
        )
        | json_values(2),
    },
    optional={"containerEdits": edit_dicts, "annotations": json_values(2), "extra": json_values(1)},
)


@settings(FUZZ, derandomize=True, max_examples=400, deadline=None)
@given(spec=spec_dicts)
def test_a_claim_spec_of_any_shape_reads_resolves_or_is_refused(spec: dict[str, Any]) -> None:
    def test(registry: CDIRegistry) -> None:
        registry.cdi_dir.mkdir(parents=True)
        registry.spec_path(UID).write_text(json.dumps(spec))
        if read_or_refuse(registry) is None:
            return
        for device in spec["devices"]:
            edits = registry.resolve(f"{KIND}={device['name']}")
            assert isinstance(edits, ContainerEdits)

    in_registry(test)


env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
text_values = st.text(max_size=12)  # what a device source or config may put in an edit
container_edits = st.builds(
    lambda env, device_nodes, mounts: ContainerEdits(
        env=env, device_nodes=device_nodes, mounts=mounts
    ),
    env=st.dictionaries(env_names, text_values, max_size=3),
    device_nodes=st.lists(
        st.builds(
            lambda path, host, perms: DeviceNode(path=path, host_path=host, permissions=perms),
            text_values.filter(bool),
            st.none() | text_values.filter(bool),
            st.none() | st.sampled_from(["r", "rw", "rwm"]),
        ),
        max_size=2,
    ).map(tuple),
    mounts=st.lists(
        st.builds(
            lambda host, container, options: Mount(
                host_path=host, container_path=container, options=options
            ),
            text_values.filter(bool),  # the writer refuses an empty path, as runtimes do
            text_values.filter(bool),
            st.lists(text_values, max_size=2).map(tuple),
        ),
        max_size=2,
    ).map(tuple),
)
device_names = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_.:-]{0,6}[A-Za-z0-9])?", fullmatch=True)


@settings(FUZZ, derandomize=True, max_examples=200, deadline=None)
@given(
    devices=st.dictionaries(
        device_names, container_edits.filter(lambda e: not e.is_empty()), min_size=1, max_size=3
    ),
    claim_edits=container_edits,
)
def test_what_the_writer_writes_the_reader_reads_back(
    devices: dict[str, ContainerEdits], claim_edits: ContainerEdits
) -> None:
    def test(registry: CDIRegistry) -> None:
        ids = registry.write_claim(UID, [CDIDevice(n, e) for n, e in devices.items()], claim_edits)
        spec = registry.read_claim(UID)
        assert spec == json.loads(registry.spec_path(UID).read_text())
        for name, edits in devices.items():
            assert registry.resolve(ids[name]) == claim_edits.merged(edits)

    in_registry(test)


foreign_content = st.one_of(
    st.binary(max_size=200),
    st.text(st.sampled_from("{}[]:,-&*!? \n'\"#|>abk1"), max_size=60).map(str.encode),
    st.builds(
        lambda spec, as_yaml: (yaml.safe_dump(spec) if as_yaml else json.dumps(spec)).encode(),
        spec_dicts,
        st.booleans(),
    ),
)


@settings(FUZZ, derandomize=True, max_examples=300, deadline=None)
@given(content=foreign_content, suffix=st.sampled_from([".json", ".yaml"]))
def test_another_vendors_file_never_breaks_our_devices(content: bytes, suffix: str) -> None:
    def test(registry: CDIRegistry) -> None:
        edits = ContainerEdits(env={"A": "1"})
        [cdi_id] = registry.write_claim(UID, [CDIDevice("dev-0", edits)]).values()
        (registry.cdi_dir / f"other.vendor-gpu_x{suffix}").write_bytes(content)
        try:
            assert registry.resolve(cdi_id) == edits
            event("resolved")
        except CDIError:
            # Only a file that claims to be of our kind may get in the way (by defining
            # the same device, or by being broken while naming our kind).
            doc = yaml.safe_load(content) if suffix == ".yaml" else json.loads(content)
            assert isinstance(doc, dict) and doc.get("kind") == KIND
            event("refused: the file names our kind")

    in_registry(test)


# ----- what the reader does not survive today ---------------------------------------------


@settings(KNOWN_BUG, derandomize=True, max_examples=10, deadline=None)
@given(
    depth=st.sampled_from([1_000, 3_000]),
    suffix=st.sampled_from([".json", ".yaml"]),
    ours=st.booleans(),
)
def test_a_deeply_nested_spec_file_is_refused_or_skipped(
    depth: int, suffix: str, ours: bool
) -> None:
    def test(registry: CDIRegistry) -> None:
        edits = ContainerEdits(env={"A": "1"})
        [cdi_id] = registry.write_claim(UID, [CDIDevice("dev-0", edits)]).values()
        name = registry.spec_path(UID).name if ours else f"other.vendor-gpu_x{suffix}"
        (registry.cdi_dir / name).write_text(deep_json(depth))
        try:
            registry.resolve(cdi_id)
        except CDISpecError:
            assert ours

    in_registry(test)


@settings(KNOWN_BUG, derandomize=True, max_examples=10, deadline=None)
@given(key=st.integers() | st.booleans() | st.none(), where=st.sampled_from(["spec", "device"]))
def test_a_yaml_spec_with_a_key_that_is_not_a_string_is_refused(key: Any, where: str) -> None:
    def test(registry: CDIRegistry) -> None:
        device: dict[Any, Any] = {"name": "dev-9", "containerEdits": {"env": ["A=1"]}}
        spec: dict[Any, Any] = {"cdiVersion": "0.3.0", "kind": KIND, "devices": [device]}
        (spec if where == "spec" else device)[key] = "x"
        registry.cdi_dir.mkdir(parents=True)
        (registry.cdi_dir / "other.vendor-gpu_x.yaml").write_text(yaml.safe_dump(spec))
        with pytest.raises(CDISpecError):
            registry.resolve(f"{KIND}=dev-9")

    in_registry(test)
