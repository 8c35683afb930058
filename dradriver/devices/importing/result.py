"""What an import produces, and the parts both importers share.

Invariants:

* An import never raises anything but :class:`~dradriver.errors.FieldErrors` for bad input,
  and its field paths are paths in the *input* document (``devices[2].groups[0].count``).
* ``losses`` name every setting of the input whose effect the produced configuration does not
  keep (each starts with the input field path); ``notes`` say what was assumed or dropped
  without changing behaviour. An empty ``losses`` means the configuration does what the
  input did.
* Profile names are DNS labels no longer than :data:`MAX_PROFILE_NAME`, unique in one result.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from dradriver.devices.configyaml import DriverConfigError, load_yaml
from dradriver.errors import FieldError, FieldErrors, from_validation_error, join_path

MAX_PROFILE_NAME = 40
"""Profile names stay this short so that the device names derived from them (the profile
name plus a slot number or an identity label) still fit in a 63-character DNS label."""

MAX_SHARE = 65536
"""The largest ``share`` a host profile accepts."""

MAX_REPORTED_ERRORS = 20


@dataclass
class ImportResult:
    """A dradriver driver configuration (camelCase keys, ready for ``yaml.safe_dump``) and
    what of the input it does not express."""

    config: dict[str, Any]
    losses: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class InputModel(BaseModel):
    """Base of the models that read an input format: unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


def load_input(text: str, file: str) -> Any:
    """The YAML document in ``text``, bounded in size, depth and alias expansion like the
    driver configuration; any problem is a :class:`FieldErrors` naming ``file``."""
    try:
        return load_yaml(text, file)
    except DriverConfigError as err:
        raise FieldErrors(*err.field_errors, subject=file) from err


_MODEL_TYPE = re.compile(r"Input should be a valid dictionary or instance of \w+")


def validation_failure(
    err: ValidationError, model: type[BaseModel], file: str, wrapper: str = ""
) -> FieldErrors:
    """A pydantic error on the input as field errors (at most :data:`MAX_REPORTED_ERRORS`).

    ``wrapper``: the field of ``model`` that held the input when the input itself is a list
    (validated as ``{wrapper: input}``); it is left out of the paths.
    """
    errors: Sequence[FieldError | str] = [
        replace(
            e,
            path=e.path.removeprefix(wrapper) if wrapper else e.path,
            message=_MODEL_TYPE.sub("expected a mapping", e.message),
        )
        for e in from_validation_error(err, model)
    ]
    if len(errors) > MAX_REPORTED_ERRORS:
        more = len(errors) - MAX_REPORTED_ERRORS
        errors = [*errors[:MAX_REPORTED_ERRORS], f"... and {more} more errors"]
    return FieldErrors(*errors, subject=file)


def at(prefix: str, *parts: str | int) -> str:
    """A field path: ``at("devices", 2, "groups", 0)`` -> ``devices[2].groups[0]``."""
    path = prefix
    for part in parts:
        path = join_path(path, f"[{part}]" if isinstance(part, int) else part)
    return path


_NOT_LABEL = re.compile(r"[^a-z0-9]+")


class ProfileNames:
    """Hands out unique DNS-label profile names derived from names in the input."""

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def take(self, wanted: str, fallback: str = "device") -> str:
        """``wanted`` as a DNS label (lowercase; other characters become '-'), shortened to
        :data:`MAX_PROFILE_NAME`, with ``-2``, ``-3``... when it is already taken."""
        base = _NOT_LABEL.sub("-", wanted.lower()).strip("-")[:MAX_PROFILE_NAME].strip("-")
        base = base or fallback
        name, n = base, 1
        while name in self._taken:
            n += 1
            suffix = f"-{n}"
            name = base[: MAX_PROFILE_NAME - len(suffix)].rstrip("-") + suffix
        self._taken.add(name)
        return name


def share_of(count: int, where: str, losses: list[str]) -> int | None:
    """How many containers may use one device: ``None`` (exclusive) for 1, capped at
    :data:`MAX_SHARE` with a loss."""
    if count > MAX_SHARE:
        losses.append(
            f"{where}: {count} is more than a host profile shares one device ({MAX_SHARE}); "
            f"the profile says share: {MAX_SHARE}"
        )
        return MAX_SHARE
    return count if count > 1 else None


def host_source(profile: dict[str, Any]) -> dict[str, Any]:
    """One entry of ``sources:`` for a host profile, leaving out empty fields."""
    return {"host": {k: v for k, v in profile.items() if v not in (None, [], {}, "")}}
