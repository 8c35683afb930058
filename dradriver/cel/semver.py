"""Semantic versions as Kubernetes' CEL ``semver`` library sees them.

``parse_semver`` is the strict SemVer 2.0.0 grammar (blang/semver's ``Parse``): three
numeric parts without leading zeros, an optional ``-pre.release`` and ``+build``.
``parse_semver(text, normalize=True)`` first applies the library's normalisation: drop a
leading ``v``, strip leading zeros of each core part and fill a missing minor/patch with 0
(a short version may not carry a pre-release or build part).

Precedence follows semver.org §11: major, minor, patch numerically, then a version without
pre-release is higher than one with; pre-release identifiers compare numerically when both
are numeric, numeric ones are lower than alphanumeric ones, otherwise ASCII order, and a
shorter list of identifiers is lower when all shared ones are equal. Build metadata never
matters (and is not kept).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Semver", "SemverError", "compare_semver", "parse_semver"]

_NUM = r"(?:0|[1-9]\d*)"
_PRE_ID = r"(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
_BUILD_ID = r"[0-9a-zA-Z-]+"
_STRICT = re.compile(
    rf"(?P<major>{_NUM})\.(?P<minor>{_NUM})\.(?P<patch>{_NUM})"
    rf"(?:-(?P<pre>{_PRE_ID}(?:\.{_PRE_ID})*))?"
    rf"(?:\+(?P<build>{_BUILD_ID}(?:\.{_BUILD_ID})*))?"
)
_INT64_MAX = 2**63 - 1


class SemverError(ValueError):
    """Not a semantic version."""


@dataclass(frozen=True, slots=True)
class Semver:
    major: int
    minor: int
    patch: int
    pre: str = ""

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        return f"{text}-{self.pre}" if self.pre else text


def parse_semver(text: str, normalize: bool = False) -> Semver:
    """The version ``text`` names; raises :class:`SemverError`."""
    if normalize:
        text = _normalize(text)
    match = _STRICT.fullmatch(text)
    if match is None:
        raise SemverError(f"invalid semantic version {text!r}")
    parts = [int(match[name]) for name in ("major", "minor", "patch")]
    if any(part > _INT64_MAX for part in parts):
        raise SemverError(f"invalid semantic version {text!r}: a part does not fit in 64 bits")
    return Semver(parts[0], parts[1], parts[2], match["pre"] or "")


def _normalize(text: str) -> str:
    # A port of normalizeAndParse in k8s.io/apiserver/pkg/cel/library/semverlib.go.
    parts = text.removeprefix("v").split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            part = part.lstrip("0")
            if not part or part[0] not in "0123456789":
                part = "0" + part
            parts[i] = part
    if len(parts) < 3:
        if "+" in parts[-1] or "-" in parts[-1]:
            raise SemverError(
                f"invalid semantic version {text!r}: a short version cannot contain a "
                "pre-release or build part"
            )
        parts.extend("0" * (3 - len(parts)))
    return ".".join(parts)


def _compare_ids(a: str, b: str) -> int:
    a_num, b_num = a.isdigit(), b.isdigit()
    if a_num and b_num:
        x, y = int(a), int(b)
        return (x > y) - (x < y)
    if a_num != b_num:
        return -1 if a_num else 1
    return (a > b) - (a < b)


def compare_semver(a: Semver, b: Semver) -> int:
    """-1, 0 or 1 by semver precedence (build metadata is ignored)."""
    for x, y in ((a.major, b.major), (a.minor, b.minor), (a.patch, b.patch)):
        if x != y:
            return -1 if x < y else 1
    if a.pre == b.pre:
        return 0
    if not a.pre:
        return 1
    if not b.pre:
        return -1
    a_ids, b_ids = a.pre.split("."), b.pre.split(".")
    for x_id, y_id in zip(a_ids, b_ids, strict=False):
        result = _compare_ids(x_id, y_id)
        if result:
            return result
    return (len(a_ids) > len(b_ids)) - (len(a_ids) < len(b_ids))
