"""CustomResourceDefinitions generated from pydantic models.

The models are the single source of truth for a CRD's schema: :func:`structural`
turns pydantic's JSON schema into a Kubernetes structural schema (refusing what
the apiserver would refuse), and :class:`CRDKind` builds the CRD object, its
committed YAML (with a do-not-edit header) and the ``devtools.crds``
command line that keeps the file and the models in step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from dradriver import DEFAULT_DRIVER_NAME

_ALLOWED = {
    "type",
    "format",
    "description",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "enum",
    "default",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "nullable",
}


def _cel_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def structural(
    schema: dict[str, Any], defs: dict[str, Any] | None = None, at: str = ""
) -> dict[str, Any]:
    """A pydantic JSON schema as a Kubernetes structural schema.

    Inlines ``$ref``, turns ``Optional`` (anyOf with null) into the plain type,
    ``const`` into ``enum``, key patterns (``patternProperties``/``propertyNames``)
    into an ``x-kubernetes-validations`` CEL rule, and drops ``title`` and
    ``additionalProperties: false``. Any keyword the apiserver would refuse
    raises ``ValueError`` naming where it is.
    """
    defs = schema.get("$defs", {}) if defs is None else defs
    node = {k: v for k, v in schema.items() if k not in ("$defs", "title")}
    if "$ref" in node:
        name = node.pop("$ref").rsplit("/", 1)[-1]
        node = {**{k: v for k, v in defs[name].items() if k != "title"}, **node}
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o != {"type": "null"}]
        if len(options) != 1:
            raise ValueError(f"{at or 'schema'}: anyOf with several types is not structural")
        node = {**options[0], **node}
        if "$ref" in node:
            return structural(node, defs, at)
    if node.get("default", ...) is None:
        del node["default"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    key_rules: list[str] = []
    key_texts: list[str] = []
    if "patternProperties" in node:
        patterns = node.pop("patternProperties")
        if len(patterns) != 1 or "additionalProperties" in node:
            raise ValueError(f"{at}: only one key pattern is supported")
        ((pattern, value_schema),) = patterns.items()
        node["additionalProperties"] = value_schema
        key_rules.append(f"k.matches({_cel_string(pattern)})")
        key_texts.append(f"match {pattern}")
    if "propertyNames" in node:
        names = dict(node.pop("propertyNames"))
        if "maxLength" in names:
            limit = int(names.pop("maxLength"))
            key_rules.insert(0, f"size(k) <= {limit}")
            key_texts.append(f"be at most {limit} characters long")
        if "pattern" in names:
            pattern = names.pop("pattern")
            key_rules.append(f"k.matches({_cel_string(pattern)})")
            key_texts.append(f"match {pattern}")
        if names:
            raise ValueError(f"{at}: unsupported propertyNames keywords {sorted(names)}")
    if key_rules:
        node.setdefault("x-kubernetes-validations", []).append(
            {
                "rule": f"self.all(k, {' && '.join(key_rules)})",
                "message": f"keys must {' and '.join(key_texts)}",
            }
        )
    for keyword in ("exclusiveMinimum", "exclusiveMaximum"):
        if keyword in node and not isinstance(node[keyword], bool):
            bound = "minimum" if keyword == "exclusiveMinimum" else "maximum"
            node[bound] = node[keyword]
            node[keyword] = True
    if "properties" in node:
        node["properties"] = {
            name: structural(sub, defs, f"{at}.{name}" if at else name)
            for name, sub in node["properties"].items()
        }
    if "items" in node:
        node["items"] = structural(node["items"], defs, f"{at}[]")
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = structural(node["additionalProperties"], defs, f"{at}{{}}")
    unsupported = sorted(k for k in node if k not in _ALLOWED and not k.startswith("x-kubernetes-"))
    if unsupported:
        raise ValueError(f"{at or 'schema'}: keywords {unsupported} are not allowed in a CRD")
    if "type" not in node:
        raise ValueError(f"{at or 'schema'}: every node of a structural schema needs a type")
    return dict(sorted(node.items(), key=_keyword_order))


_FIRST = ("description", "type", "format", "enum", "default")
_LAST = ("properties", "required", "items", "additionalProperties")


def _keyword_order(item: tuple[str, Any]) -> tuple[int, int, str]:
    key = item[0]
    if key in _FIRST:
        return (0, _FIRST.index(key), "")
    if key in _LAST:
        return (2, _LAST.index(key), "")
    if key.startswith("x-kubernetes-"):
        return (3, 0, key)
    return (1, 0, key)


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    return structural(model.model_json_schema(by_alias=True, mode="validation"))


@dataclass(frozen=True)
class CRDKind:
    """One custom resource kind of this driver's API group (the driver name)."""

    kind: str
    plural: str
    singular: str
    scope: Literal["Namespaced", "Cluster"]
    description: str
    spec_model: type[BaseModel]
    status_model: type[BaseModel]
    source: str  # the module with the models, named in the generated file's header
    file_name: str  # under manifests/controller/ (see devtools.crds)
    version: str = "v1alpha1"
    short_names: tuple[str, ...] = ()
    printer_columns: tuple[dict[str, str], ...] = ()
    categories: tuple[str, ...] = field(default=("dradriver",))

    def openapi_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "description": self.description,
            "required": ["spec"],
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                "spec": model_schema(self.spec_model),
                "status": model_schema(self.status_model),
            },
        }

    def crd(self, group: str = DEFAULT_DRIVER_NAME) -> dict[str, Any]:
        """The CustomResourceDefinition for API group ``group``."""
        columns = [
            *self.printer_columns,
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{self.plural}.{group}"},
            "spec": {
                "group": group,
                "scope": self.scope,
                "names": {
                    "kind": self.kind,
                    "listKind": f"{self.kind}List",
                    "plural": self.plural,
                    "singular": self.singular,
                    "shortNames": list(self.short_names),
                    "categories": list(self.categories),
                },
                "versions": [
                    {
                        "name": self.version,
                        "served": True,
                        "storage": True,
                        "subresources": {"status": {}},
                        "additionalPrinterColumns": columns,
                        "schema": {"openAPIV3Schema": self.openapi_schema()},
                    }
                ],
            },
        }

    def crd_yaml(self, group: str = DEFAULT_DRIVER_NAME) -> str:
        header = (
            f"# Generated from the pydantic models in {self.source.replace('.', '/')}.py; "
            "do not edit.\n"
            "# Regenerate: python -m devtools.crds --write\n"
        )
        return header + yaml.safe_dump(self.crd(group), sort_keys=False, width=100)
