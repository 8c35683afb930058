"""Field errors: the one text form, pydantic's errors translated, and the exception tree."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import re
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

import dradriver
from dradriver import errors
from dradriver.errors import (
    FieldError,
    FieldErrors,
    fields_at,
    format_location,
    from_validation_error,
    join_path,
    render,
    under,
)

# --- the renderer ---------------------------------------------------------------------


def test_render_is_path_message_and_allowed_joined_by_semicolons() -> None:
    found = [
        FieldError("spec.count", "Input should be greater than or equal to 1"),
        FieldError("spec.colour", "unknown field", ("env", "profile")),
        FieldError("", "must be an object, got str"),
    ]
    assert render(found) == (
        "spec.count: Input should be greater than or equal to 1; "
        "spec.colour: unknown field (allowed: env, profile); "
        "must be an object, got str"
    )
    assert render(found[:1], subject="DeviceClaimParameters ns/x") == (
        "DeviceClaimParameters ns/x: spec.count: Input should be greater than or equal to 1"
    )


def test_errors_are_put_under_the_path_of_their_object() -> None:
    where = "spec.devices.config[0].opaque.parameters"
    found = (
        FieldError("kind", "unknown kind 'Gpu'"),
        FieldError("", "must be an object, got str"),
        FieldError("[2].name", "bad"),
        FieldError("env['1X'] (key)", "String should match pattern"),
    )
    assert [str(e) for e in under(where, found)] == [
        f"{where}.kind: unknown kind 'Gpu'",
        f"{where}: must be an object, got str",
        f"{where}[2].name: bad",
        f"{where}.env['1X'] (key): String should match pattern",
    ]
    assert under("spec", under("devices", [FieldError("[0]", "x")]))[0].path == "spec.devices[0]"
    assert join_path("", "a") == "a" and join_path("a", "") == "a"


def test_field_errors_exception_renders_and_keeps_the_errors() -> None:
    error = FieldErrors(FieldError("spec.count", "too big"), "whole object", subject="obj")
    assert str(error) == "obj: spec.count: too big; whole object"
    assert error.field_errors == (
        FieldError("spec.count", "too big"),
        FieldError("", "whole object"),
    )
    assert isinstance(error, ValueError)


# --- the pydantic converter -----------------------------------------------------------


class _Leaf(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    int_: int | None = Field(default=None, alias="int")
    string: str | None = None


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    attributes: dict[str, _Leaf] = Field(default_factory=dict)
    mode: Literal["a", "b"] = "a"

    @model_validator(mode="after")
    def _not_reserved(self) -> _Item:
        if self.name == "reserved":
            raise ValueError("name 'reserved' is taken")
        return self


class _Root(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    items: list[_Item] = Field(default_factory=list)
    groups: tuple[list[_Item], ...] = ()
    node_selector: _Leaf | None = Field(default=None, alias="nodeSelector")


def _errors(data: object) -> tuple[FieldError, ...]:
    with pytest.raises(ValidationError) as info:
        _Root.model_validate(data)
    return from_validation_error(info.value, _Root)


def test_converter_names_nested_list_items_and_lists_allowed_fields() -> None:
    found = _errors(
        {
            "items": [{"name": "ok"}, {"name": "x", "colour": 1}],
            "groups": [[], [{"name": "y"}, {"nam": "z"}]],
            "nodeSelector": {"float": 1.0},
            "extra": True,
        }
    )
    assert sorted(map(str, found)) == [
        "extra: unknown field (allowed: items, groups, nodeSelector)",
        "groups[1][1].nam: unknown field (allowed: name, attributes, mode)",
        "groups[1][1].name: Field required",
        "items[1].colour: unknown field (allowed: name, attributes, mode)",
        "nodeSelector.float: unknown field (allowed: int, string)",
    ]


def test_converter_follows_dict_values_and_quotes_keys() -> None:
    found = _errors({"items": [{"name": "a", "attributes": {"x.io/m": {"bool": True}}}]})
    assert [str(e) for e in found] == [
        "items[0].attributes['x.io/m'].bool: unknown field (allowed: int, string)"
    ]


def test_converter_drops_pydantics_value_error_prefix_and_keeps_other_messages() -> None:
    found = _errors({"items": [{"name": "x", "mode": "c"}]})
    assert [str(e) for e in found] == ["items[0].mode: Input should be 'a' or 'b'"]
    found = _errors({"items": [{"name": "reserved"}]})
    assert [str(e) for e in found] == ["items[0]: name 'reserved' is taken"]


def test_converter_without_a_model_gives_no_allowed_fields_and_its_own_wording() -> None:
    with pytest.raises(ValidationError) as info:
        _Root.model_validate({"items": [{"name": "a", "colour": 1}]})
    (error,) = from_validation_error(info.value, unknown_field="unknown key")
    assert error == FieldError("items[0].colour", "unknown key")


def test_fields_at_stops_where_there_is_no_model() -> None:
    assert fields_at(_Root, ("items", 0)) == ("name", "attributes", "mode")
    assert fields_at(_Root, ("items",)) is None  # a list, not an object
    assert fields_at(_Root, ("items", 0, "name")) is None
    assert fields_at(_Root, ("nosuch",)) is None


def test_format_location() -> None:
    assert format_location(("sources", 0, "static", "devices", 2, "name")) == (
        "sources[0].static.devices[2].name"
    )
    assert format_location(("attributes", "a.b/c", "[key]")) == "attributes['a.b/c'] (key)"
    assert format_location(()) == ""


# --- every exception is in the tree ----------------------------------------------------


def _core_exceptions() -> set[str]:
    names = set()
    for info in pkgutil.walk_packages(dradriver.__path__, "dradriver."):
        if ".kubeletapi.gen" in info.name or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                names.add(name)
    return names


def test_every_exception_of_the_core_is_listed_in_the_tree() -> None:
    doc = errors.__doc__ or ""
    found = _core_exceptions()
    assert {"FieldErrors", "ParametersError", "DriverConfigError", "LedgerError"} <= found
    missing = sorted(name for name in found if not re.search(rf"\b{name}\b", doc))
    assert not missing, f"add these to the exception tree in dradriver/errors.py: {missing}"


def test_every_module_the_tree_names_defines_that_exception() -> None:
    tree = (errors.__doc__ or "").split("(``module: Name``)", 1)[1]
    named = re.findall(r"\b([a-z_][a-z0-9_.]*):\s+([A-Z][A-Za-z0-9]*)\b", tree)
    assert ("host.state.schema", "LedgerError") in named
    wrong = [f"{module}: {name}" for module, name in named if not _defines(module, name)]
    assert not wrong, f"fix these module paths in the exception tree of errors.py: {wrong}"


def _defines(module: str, name: str) -> bool:
    if importlib.util.find_spec(f"dradriver.{module}") is None:
        return False
    value = vars(importlib.import_module(f"dradriver.{module}")).get(name)
    return inspect.isclass(value) and value.__module__ == f"dradriver.{module}"
