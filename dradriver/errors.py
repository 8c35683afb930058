"""Field errors: what is wrong with user input, where, and what would be allowed there.

Every check of user input (the driver configuration file, opaque device configuration,
DeviceClaimParameters, NetworkDevicePools, admission requests) reports
:class:`FieldError` values instead of preformatted strings:

* ``path``: the field, relative to what the check was given (``spec.devices[0].name``,
  ``env['1X'] (key)``; ``""`` for the whole object). A caller that knows where that object
  sits puts the errors under its own path (:meth:`FieldError.under`), so the same check
  names ``spec.devices.config[0].opaque.parameters.kind`` in a ResourceClaim and
  ``spec.spec.devices.config[0].opaque.parameters.kind`` in a template.
* ``message``: what is wrong.
* ``allowed``: for an unknown field, the field names accepted at that place.

:func:`render` is the one text form, used in webhook denials, conditions, events,
prepare errors and command-line errors alike::

    spec.devices.config[0].opaque.parameters.kind: unknown kind 'Gpu'; dradriver.dev accepts ...
    spec.colour: unknown field (allowed: env, profile, setupArgs, count, selectors, ...)

and :func:`from_validation_error` is the one translation of a pydantic ``ValidationError``.
Exceptions that carry field errors derive from :class:`FieldErrors`.

This module is plumbing at the bottom of the layers (like :mod:`dradriver.log`) because the
driver configuration (:mod:`dradriver.devices.config`, :mod:`dradriver.devices.configyaml`)
uses it as well as :mod:`dradriver.api`.

Exceptions
----------
Each module defines the exceptions it raises; these are all of those in ``dradriver``, by
base class (``module: Name``). Application exceptions (``controller``, ``kubeletplugin``)
are not listed.

Bad user input, with field errors (``.field_errors``)::

    ValueError
    └── errors: FieldErrors
        ├── devices.configyaml: DriverConfigError    the driver configuration file
        ├── api.deviceconfig: DeviceConfigError      an opaque config entry for this driver
        ├── api.parameters: ParametersError          DeviceClaimParameters, or a claim's use of them
        └── api.networkpool: NetworkPoolError        a NetworkDevicePool; a network device that
                                                     is not attached (yet) to this node

Other bad values::

    ValueError
    ├── api.pinnedparameters: NotPinned              a reference the controller has not pinned yet
    ├── k8s.quantity: QuantityError                  not a Kubernetes quantity
    ├── resourceslice.pool: SliceError               devices that cannot be published as one pool
    ├── cel.env: CompileError                        a CEL expression that does not compile
    ├── cel.semver: SemverError                      not a semantic version
    ├── cel.ast: DecodeError                         a serialized expression this reader cannot read
    ├── k8s.kubeconfig: KubeconfigError              a kubeconfig that cannot be used as it is
    ├── host.state.schema: LedgerValueError          (also a LedgerError, below)
    └── host.cdi: CDIValueError                      (also a CDIError, below)
        ├── host.cdi: InvalidCDINameError
        └── host.cdi: HostDeviceNodeError            a device node the runtime would refuse

Node state, devices and the kubelet::

    Exception
    ├── host.state.schema: LedgerError               the node ledger
    │   ├── LedgerValueError, LedgerVersionError, LedgerCorruptError
    │   └── UnknownClaimError, UnknownPluginHoldError, ClaimStateError, ClaimMismatchError,
    │       DeviceBusy
    ├── host.cdi: CDIError                           CDI specs
    │   ├── CDIValueError, CDIConflictError, CDISpecError
    │   └── UnknownCDIDeviceError                    (also a LookupError)
    ├── devices.sources: DeviceSourceError           device discovery
    │   └── DuplicateDeviceError
    ├── deviceplugin.server: DevicePluginError       the device-plugin framework
    └── allocator.request: AllocationError           claims the allocator cannot take

    OSError
    └── k8s.http: TransportError                     a request to the apiserver got no answer
        └── TransportTimeout                         (also a TimeoutError) none in time

    RuntimeError
    ├── k8s.errors: KubeAPIError                     an apiserver answer that is not 2xx
    ├── devices.static: MockDeviceError              mock device nodes cannot be made
    ├── runtime.informer: WatchError                 a watch stream that broke
    ├── resourceslice.publisher: DroppedFieldsError  the apiserver dropped fields of a slice
    ├── host.hooks: HookError                        a setup or teardown hook that failed
    ├── runtime.childworker: WorkerError             a worker process did not answer
    │   └── WorkerTimeout                            none in time
    └── cli.explain: ExplainError                    ``dradriver explain`` cannot answer

Control flow inside one module's API, never meant to reach a user: ``runtime.controller:
RequeueAfter``, ``runtime.informer: Expired`` (410 Gone: relist), ``runtime.workqueue:
ShutDown``. A unit test fails when an exception class in ``dradriver`` is missing here.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ValidationError

UNKNOWN_FIELD = "unknown field"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class FieldError:
    """One thing wrong with one field; ``path`` is ``""`` for the object as a whole."""

    path: str
    message: str
    allowed: tuple[str, ...] | None = None

    def under(self, prefix: str) -> FieldError:
        """This error as seen from the object that holds this one at ``prefix``."""
        return replace(self, path=join_path(prefix, self.path))

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        if self.allowed:
            text += f" (allowed: {', '.join(self.allowed)})"
        return text


def join_path(prefix: str, path: str) -> str:
    """``spec`` + ``count`` -> ``spec.count``; ``spec.env`` + ``['A'] (key)``; either may be ""."""
    if not prefix:
        return path
    if not path:
        return prefix
    if path.startswith(("[", " ")):
        return prefix + path
    return f"{prefix}.{path}"


def under(prefix: str, errors: Iterable[FieldError]) -> tuple[FieldError, ...]:
    """Every error of ``errors`` put under ``prefix`` (see :meth:`FieldError.under`)."""
    return tuple(e.under(prefix) for e in errors)


def render(errors: Iterable[FieldError], subject: str = "") -> str:
    """The errors as one line, ``path: message (allowed: ...)`` joined by "; ".

    ``subject`` names what was checked when that is not a field path (a file, an object
    ``Kind namespace/name``, a config entry) and goes first: ``driver.yaml: hooks: ...``.
    """
    text = "; ".join(str(e) for e in errors)
    return f"{subject}: {text}" if subject else text


class FieldErrors(ValueError):
    """Bad user input; ``field_errors`` says what and where, ``str()`` is :func:`render`.

    A plain string stands for an error about the object as a whole (path ``""``).
    """

    def __init__(self, *errors: FieldError | str, subject: str = "") -> None:
        self.field_errors: tuple[FieldError, ...] = tuple(
            e if isinstance(e, FieldError) else FieldError("", e) for e in errors
        )
        self.subject = subject
        super().__init__(render(self.field_errors, subject))


# --- pydantic ----------------------------------------------------------------------------


def format_location(location: Sequence[int | str]) -> str:
    """A pydantic error location as a path: ``('sources', 0, 'static', 'name')`` ->
    ``sources[0].static.name``; a key that is not an identifier is quoted (``['a.b/c']``) and
    pydantic's ``[key]`` marker (the key itself is wrong, not its value) reads `` (key)``."""
    out = ""
    for part in location:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += " (key)"
        elif _IDENTIFIER.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


def from_validation_error(
    error: ValidationError,
    model: type[BaseModel] | None = None,
    *,
    unknown_field: str = UNKNOWN_FIELD,
) -> tuple[FieldError, ...]:
    """Every error pydantic found, as field errors with paths from the validated object.

    A check of our own that raised ``ValueError`` reads as its message (without pydantic's
    "Value error, " prefix). A field the model forbids reads ``unknown_field`` and, given
    ``model`` (the model that was validated), lists the fields allowed at that place.
    """
    out = []
    for detail in error.errors(include_url=False):
        location = tuple(detail["loc"])
        allowed = None
        cause = (detail.get("ctx") or {}).get("error")
        if detail["type"] == "extra_forbidden":
            message = unknown_field
            if model is not None:
                allowed = fields_at(model, location[:-1])
        elif cause is not None:
            message = str(cause)
        else:
            message = detail["msg"]
        out.append(FieldError(format_location(location), message, allowed))
    return tuple(out)


def field_names(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of ``model`` as they are spelled in objects (aliases), in order."""
    return tuple(f.alias or name for name, f in model.model_fields.items())


def fields_at(model: type[BaseModel], location: Sequence[int | str]) -> tuple[str, ...] | None:
    """The field names of the object at ``location`` under ``model``, if it is a model.

    Follows fields (by alias or name), list and tuple items, dict values and ``X | None``.
    """
    current: Any = model
    for part in location:
        current = _step(current, part)
        if current is None:
            return None
    found = _model_in(current)
    return field_names(found) if found is not None else None


def _step(annotation: Any, part: int | str) -> Any:
    """The annotation of ``part`` (a field name, an index or a dict key) inside ``annotation``."""
    model = _model_in(annotation)
    if model is not None:
        if not isinstance(part, str):
            return None
        fields = {f.alias or name: f for name, f in model.model_fields.items()}
        field = fields.get(part) or model.model_fields.get(part)
        return field.annotation if field is not None else None
    for candidate in _members(annotation):
        origin = typing.get_origin(candidate)
        args = typing.get_args(candidate)
        if origin in (list, tuple, set, frozenset) and isinstance(part, int) and args:
            return args[0]
        if origin is dict and isinstance(part, str) and len(args) == 2:
            return args[1]
    return None


def _members(annotation: Any) -> tuple[Any, ...]:
    """``X | Y`` -> (X, Y); ``Annotated[X, ...]`` -> (X,); anything else -> (itself,)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return tuple(m for arg in typing.get_args(annotation) for m in _members(arg))
    return (annotation,)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    for member in _members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None
