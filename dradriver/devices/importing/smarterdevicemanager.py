"""smarter-device-manager's configuration -> ``host`` profiles.

Invariants:

* smarter-device-manager matches ``devicematch`` (a regular expression, unanchored) against
  every name under /dev (``ttyUSB0``, ``net/tun``) and makes each match its own resource,
  ``smarter-devices/<name with '/' as '_'>``, shared by ``nummaxdevices`` containers. An entry
  whose expression names exactly one path (``^fuse$``, ``^net/tun$``, each branch of
  ``^(kvm|fuse)$``) becomes one profile per path with that very resource as its
  ``extendedResourceName``, so pod specs need not change.
* An expression with wildcards (``^ttyUSB[0-9]*$``) becomes one glob profile (``/dev/ttyUSB*``)
  sharing each match the same way, with a loss: its resource names cannot be kept (each match
  was ``smarter-devices/ttyUSB0``, ``smarter-devices/ttyUSB1``...; the profile gets none).
* An expression that is not simple (see :mod:`.regexglob`), the ``nvidia-gpu`` entry, and
  ``nummaxdevices: 0`` are losses naming the entry; nothing is dropped silently.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationError

from dradriver.devices.importing.regexglob import Glob, regex_to_globs
from dradriver.devices.importing.result import (
    ImportResult,
    InputModel,
    ProfileNames,
    at,
    host_source,
    load_input,
    share_of,
    validation_failure,
)
from dradriver.errors import FieldErrors

RESOURCE_DOMAIN = "smarter-devices"
NVIDIA_ENTRY = "nvidia-gpu"


class SdmEntry(InputModel):
    devicematch: Annotated[str, Field(min_length=1)]
    nummaxdevices: int = Field(ge=0)


class _SdmFile(InputModel):
    entries: list[SdmEntry]


def resource_name(name: str) -> str:
    """The resource smarter-device-manager makes for the device ``/dev/<name>``."""
    return f"{RESOURCE_DOMAIN}/{name.replace('/', '_')}"


def _read(text: str, file: str) -> list[SdmEntry]:
    data = load_input(text, file)
    if not isinstance(data, list):
        kind = "nothing" if data is None else type(data).__name__
        raise FieldErrors(
            f"expected a list of {{devicematch: <regular expression>, nummaxdevices: <n>}}, "
            f"not {kind}",
            subject=file,
        )
    try:
        return list(_SdmFile.model_validate({"entries": data}).entries)
    except ValidationError as err:
        raise validation_failure(err, _SdmFile, file, wrapper="entries") from err


def import_smarter_device_manager(text: str, file: str = "<input>") -> ImportResult:
    """smarter-device-manager's configuration as a dradriver configuration of ``host``
    profiles; raises :class:`~dradriver.errors.FieldErrors` naming the field for bad input."""
    entries = _read(text, file)
    result = ImportResult(config={"sources": []})
    names = ProfileNames()
    made: dict[str, str] = {}
    for index, entry in enumerate(entries):
        where = at("", index)
        globs = _globs(entry, where, result)
        share = share_of(entry.nummaxdevices, at(where, "nummaxdevices"), result.losses)
        for glob in globs:
            path = f"/dev/{glob.pattern}"
            if path in made:
                result.losses.append(
                    f"{at(where, 'devicematch')}: {path} is also made by {made[path]}: "
                    "imported once (smarter-device-manager would register it twice)"
                )
                continue
            made[path] = at(where, "devicematch")
            result.config["sources"].append(host_source(_profile(glob, share, names)))
        if globs and not all(g.literal for g in globs):
            result.losses.append(
                f"{at(where, 'devicematch')}: {entry.devicematch!r}: smarter-device-manager "
                f"made each match its own resource ({RESOURCE_DOMAIN}/<name>, e.g. "
                f"{resource_name(_example(globs))}); a glob profile cannot keep those names, so "
                "pods ask for these devices through a ResourceClaim (or set one "
                "extendedResourceName for all of them by hand)"
            )
    return result


def _globs(entry: SdmEntry, where: str, result: ImportResult) -> list[Glob]:
    field = at(where, "devicematch")
    if entry.devicematch == NVIDIA_ENTRY:
        result.losses.append(
            f"{field}: {NVIDIA_ENTRY!r}: smarter-device-manager's NVIDIA GPU mode (GPUs found "
            "in /sys/devices) has no host-source equivalent; use a GPU DRA driver"
        )
        return []
    if entry.nummaxdevices == 0:
        result.losses.append(
            f"{at(where, 'nummaxdevices')}: 0: the resource had no devices; not imported"
        )
        return []
    globs = regex_to_globs(entry.devicematch)
    if globs is None:
        result.losses.append(
            f"{field}: {entry.devicematch!r} is not a simple expression (anchored with ^ and $; "
            "literal names, [classes], \\d, '.', '*' or '+' after a class, alternation of "
            "those) and has no glob equivalent; write its host profile by hand"
        )
        return []
    return globs


def _profile(glob: Glob, share: int | None, names: ProfileNames) -> dict[str, Any]:
    profile: dict[str, Any] = {
        "name": names.take(glob.prefix),
        "nodes": [{"path": f"/dev/{glob.pattern}"}],
        "share": share,
    }
    if glob.literal:
        profile["extendedResourceName"] = resource_name(glob.pattern)
    return profile


def _example(globs: list[Glob]) -> str:
    wild = next(g for g in globs if not g.literal)
    return wild.prefix + "0"
