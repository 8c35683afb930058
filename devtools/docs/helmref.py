"""The Helm values reference, from the chart's ``values.schema.json`` and ``values.yaml``.

One row per value the schema declares (objects with declared properties are opened, every
other value is one row): the dotted key, its type and bounds from the schema, the default
from ``values.yaml``, and what it does from the schema's ``description`` and the comment
above the key in ``values.yaml``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import yaml

from devtools import paths
from devtools.docs.pages import DOCS, banner, cell

PAGE = DOCS / "reference" / "helm-values.md"
CHART = paths.REPO / "deployments" / "helm" / "dradriver"

Schema = dict[str, Any]


def resolve(schema: Schema, root: Schema) -> Schema:
    """``schema`` with local ``$ref`` followed and ``allOf`` merged (its own keys win)."""
    if "allOf" in schema:
        merged: Schema = {}
        for part in schema["allOf"]:
            merged.update(resolve(part, root))
        schema = {**merged, **{k: v for k, v in schema.items() if k != "allOf"}}
    while "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            raise ValueError(f"unsupported $ref {ref!r}")
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def type_text(schema: Schema, root: Schema) -> str:
    schema = resolve(schema, root)
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    for combinator in ("anyOf", "oneOf"):
        if combinator in schema:
            return " or ".join(type_text(s, root) for s in schema[combinator])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        items = schema.get("items")
        return f"list of {type_text(items, root)}" if items else "list"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of {type_text(schema['additionalProperties'], root)}"
    return str(kind)


def bounds_text(schema: Schema, root: Schema) -> str:
    schema = resolve(schema, root)
    parts = []
    for key, sign in (
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("exclusiveMaximum", "<"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
    ):
        if key in schema:
            parts.append(f"{sign} {schema[key]}")
    if "pattern" in schema:
        parts.append(f"matches `{schema['pattern']}`")
    if schema.get("required"):
        parts.append("requires " + ", ".join(f"`{r}`" for r in schema["required"]))
    return ", ".join(parts)


def comments(values_text: str) -> dict[str, str]:
    """The comment block right above each key of ``values.yaml``, by dotted key path."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in values_text.splitlines():
        stripped = line.strip()
        if not stripped:
            pending = []
            continue
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^( *)([A-Za-z0-9_.-]+):", line)
        if not match:
            pending = []
            continue
        indent, key = len(match[1]), match[2]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key])
        trailing = line.split(" # ", 1)[1].strip() if " # " in line else ""
        text = " ".join([*pending, trailing]).strip()
        if text:
            found[path] = text
        pending = []
        stack.append((indent, key))
    return found


def rows(schema: Schema, root: Schema, prefix: str = "") -> Iterator[tuple[str, Schema]]:
    """(dotted key, schema) for every value: objects with properties are opened."""
    schema = resolve(schema, root)
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        resolved = resolve(sub, root)
        if resolved.get("properties"):
            yield path, sub
            yield from rows(sub, root, f"{path}.")
        else:
            yield path, sub


def default_of(values: Any, path: str) -> tuple[bool, Any]:
    node = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def default_text(values: Any, path: str, is_object: bool) -> str:
    present, value = default_of(values, path)
    if not present:
        return "unset"
    if is_object and isinstance(value, dict) and value:
        return "see below"
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False)
    text = text.strip().removesuffix("...").strip()
    if len(text) > 80:
        return "see `values.yaml`"
    return f"`{text}`"


def render() -> str:
    schema: Schema = json.loads((CHART / "values.schema.json").read_text())
    values_text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(values_text)
    notes = comments(values_text)
    out = [
        banner("devtools.docs.helmref, from deployments/helm/dradriver/values.schema.json"),
        "# Helm values reference",
        "",
        "Every value of the chart `deployments/helm/dradriver`, as its `values.schema.json`",
        "declares it (a value the schema does not declare fails `helm install`, naming it) with",
        "its default from `values.yaml` and what it does, from the schema's descriptions and the",
        "comments in `values.yaml`. [Installing](../install.md) explains the main ones.",
        "",
        "| Value | Type | Default | Bounds | What it does |",
        "|---|---|---|---|---|",
    ]
    for path, sub in rows(schema, schema):
        resolved = resolve(sub, schema)
        is_object = bool(resolved.get("properties"))
        parts = [t for t in (resolved.get("description", ""), notes.get(path, "")) if t]
        what = " ".join(t if t.endswith(".") else f"{t}." for t in parts)
        out.append(
            f"| `{path}` | {cell(type_text(sub, schema))}"
            f" | {cell(default_text(values, path, is_object))}"
            f" | {cell(bounds_text(sub, schema))} | {cell(what)} |"
        )
    out.append("")
    return "\n".join(out)
