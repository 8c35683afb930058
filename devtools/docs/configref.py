"""The driver configuration reference, from the pydantic models of the configuration file.

Every model reachable from :class:`dradriver.devices.config.DriverConfig` gets a section
with its docstring and one row per field: the YAML key, its type, its default, the bounds
the model checks, and an example. Examples are values the repository's own example
configurations use for that key (:data:`EXAMPLE_SOURCES`), else the default; a key no
example uses and without a default shows none.
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Iterator
from typing import Any

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from devtools import paths
from devtools.docs.pages import DOCS, banner, cell, prose
from dradriver.devices import config as config_module
from dradriver.devices.attributes import AttributeInput, AttributeValue
from dradriver.devices.config import DriverConfig

PAGE = DOCS / "reference" / "configuration.md"

# Where examples come from: the configuration module's own example, the example manifest,
# the chart's default and CI values (their kubeletPlugin.config).
EXAMPLE_SOURCES = (
    "dradriver/devices/config.py",
    "manifests/examples/driver-config.yaml",
    "deployments/helm/dradriver/values.yaml",
    "deployments/helm/dradriver/ci/shim-values.yaml",
    "deployments/helm/dradriver/ci/network-pools-values.yaml",
    # the YAML blocks of the pages that show configurations
    "docs/kubelet-plugin.md",
    "docs/host-devices.md",
    "docs/device-plugin-shim.md",
)

Examples = dict[tuple[type[BaseModel], str], Any]


def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The models an annotation names, at any depth (lists, maps, unions); attribute values
    are written in their YAML forms (:func:`type_text`), so their models are left out."""
    if annotation is AttributeInput:
        return
    annotation = _strip(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from models_in(arg)


def anchor(model: type[BaseModel]) -> str:
    return model.__name__.lower()


def type_text(annotation: Any) -> str:
    """The annotation as a reader of YAML sees it."""
    if annotation is AttributeInput:
        # attribute_value converts the plain forms before the models see them
        forms = ", ".join(f"`{{{m.api_key}: ...}}`" for m in typing.get_args(AttributeValue))
        return f"attribute: a string, integer or boolean, or one of {forms}"
    annotation = _strip(annotation)
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{anchor(annotation)})"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if _is_union(annotation):
        return " or ".join(type_text(a) for a in args)
    if origin is typing.Literal:
        return " or ".join(f"`{json.dumps(a)}`" for a in args)
    if origin in (tuple, list, set, frozenset):
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {type_text(args[0])} to {type_text(args[1])}"
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if annotation in simple:
        return simple[annotation]
    return getattr(annotation, "__name__", str(annotation))


def _yaml_value(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(by_alias=True, exclude_defaults=True, mode="json")
    if isinstance(value, tuple | frozenset | set):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False)
    return text.strip().removesuffix("...").strip()


def default_text(field: FieldInfo) -> str:
    if field.default is not PydanticUndefined:
        return "none" if field.default is None else f"`{_yaml_value(field.default)}`"
    if field.default_factory is not None:
        made = field.default_factory()  # type: ignore[call-arg]
        return f"`{_yaml_value(made)}`"
    return "required"


def bounds_text(field: FieldInfo) -> str:
    bounds = []
    for meta in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None and isinstance(meta, annotated_types.BaseMetadata):
                bounds.append(f"{sign} {value}")
        if isinstance(meta, annotated_types.MinLen):
            bounds.append(f"length ≥ {meta.min_length}")
        if isinstance(meta, annotated_types.MaxLen):
            bounds.append(f"length ≤ {meta.max_length}")
    return ", ".join(bounds)


def key_of(name: str, field: FieldInfo) -> str:
    return field.alias or name


def reachable(root: type[BaseModel] = DriverConfig) -> list[type[BaseModel]]:
    """Every model reachable from ``root``, breadth first, each once."""
    seen: list[type[BaseModel]] = [root]
    i = 0
    while i < len(seen):
        for field in seen[i].model_fields.values():
            for model in models_in(field.annotation):
                if model not in seen:
                    seen.append(model)
        i += 1
    return seen


def _pick(models: list[type[BaseModel]], data: dict[str, Any]) -> type[BaseModel] | None:
    for model in models:
        keys = {key_of(n, f) for n, f in model.model_fields.items()} | set(model.model_fields)
        if set(data) <= keys:
            return model
    return None


def collect(model: type[BaseModel], data: Any, found: Examples) -> None:
    """Record, for each (model, key), the first value an example configuration gives it."""
    if not isinstance(data, dict):
        return
    fields = {key_of(n, f): f for n, f in model.model_fields.items()}
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            continue
        found.setdefault((model, key), value)
        candidates = list(models_in(field.annotation))
        if not candidates:
            continue
        items = value if isinstance(value, list) else [value]
        if typing.get_origin(_strip(field.annotation)) is dict and isinstance(value, dict):
            items = list(value.values())
        for item in items:
            if isinstance(item, dict):
                chosen = _pick(candidates, item)
                if chosen is not None:
                    collect(chosen, item, found)


def example_configs() -> list[Any]:
    """The example configurations of :data:`EXAMPLE_SOURCES`, parsed."""
    docs: list[Any] = []
    module_doc = config_module.__doc__ or ""
    match = re.search(r"Example::\n\n((?: {4}.*\n|\n)+)", module_doc)
    if match:
        docs.append(yaml.safe_load("\n".join(line[4:] for line in match[1].splitlines())))
    for source in EXAMPLE_SOURCES[1:]:
        text = (paths.REPO / source).read_text()
        if source.endswith(".md"):
            blocks = re.findall(r"^```yaml\n(.*?)^```", text, flags=re.M | re.S)
            docs.extend(d for d in (yaml.safe_load(b) for b in blocks) if isinstance(d, dict))
            continue
        for doc in yaml.safe_load_all(text):
            if isinstance(doc, dict) and "kubeletPlugin" in doc:
                doc = (doc.get("kubeletPlugin") or {}).get("config")
            if isinstance(doc, dict):
                docs.append(doc)
    return docs


def render() -> str:
    found: Examples = {}
    for doc in example_configs():
        collect(DriverConfig, doc, found)
    out = [
        banner("devtools.docs.configref, from the models in dradriver/devices/"),
        "# Driver configuration reference",
        "",
        "The node plugin reads one YAML file (`dradriver-kubeletplugin --config`; the chart's",
        "`kubeletPlugin.config`, whose `driverName` comes from the chart's value). Keys are",
        "camelCase; an unknown key, a wrong type or a value out of bounds is an error that names",
        "the file and the field. The root of the file is [DriverConfig](#driverconfig).",
        "",
        "Examples are the values the repository's example configurations use",
        f"({', '.join(f'`{s}`' for s in EXAMPLE_SOURCES)}), else the default.",
        "",
    ]
    for model in reachable():
        out += [f"## {model.__name__}", ""]
        text = prose(model.__doc__ if "__doc__" in vars(model) else None)
        if text:
            out += [text, ""]
        out += [
            "| Key | Type | Default | Bounds | Example |",
            "|---|---|---|---|---|",
        ]
        for name, field in model.model_fields.items():
            key = key_of(name, field)
            example = found.get((model, key))
            if example is None:
                shown = (
                    default_text(field) if default_text(field) not in ("none", "required") else ""
                )
            else:
                shown = f"`{_yaml_value(example)}`"
            out.append(
                f"| `{key}` | {cell(type_text(field.annotation))} | {cell(default_text(field))}"
                f" | {cell(bounds_text(field))} | {cell(shown)} |"
            )
        out.append("")
    return "\n".join(out)
