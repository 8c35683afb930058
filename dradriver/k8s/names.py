"""Kubernetes name formats used by resource.k8s.io/v1 objects, checked like the apiserver does.

Every check returns the value unchanged or raises ``ValueError`` with a message that says
what kind of name it is and what the rule is, so it can be used directly as a pydantic
validator.
"""

from __future__ import annotations

import re

DNS_LABEL_MAX_LENGTH = 63
DNS_SUBDOMAIN_MAX_LENGTH = 253
DRIVER_NAME_MAX_LENGTH = 63
C_IDENTIFIER_MAX_LENGTH = 32
LABEL_VALUE_MAX_LENGTH = 63

# The formats as regular expressions, written once (Kubernetes' validation spells them so).
# Unanchored: compile and fullmatch them, or anchor them with whole() for pydantic and
# JSON schema patterns (which search); the CRDs carry those anchored strings verbatim.
DNS_LABEL_REGEX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN_REGEX = DNS_LABEL_REGEX + r"(\." + DNS_LABEL_REGEX + r")*"
C_IDENTIFIER_REGEX = r"[A-Za-z_][A-Za-z0-9_]*"
QUALIFIED_NAME_REGEX = f"({DNS_SUBDOMAIN_REGEX}/)?{C_IDENTIFIER_REGEX}"
"""``[<DNS subdomain>/]<C identifier>``: attribute and capacity names."""
LABEL_PART_REGEX = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"

DNS_LABEL_RE = re.compile(DNS_LABEL_REGEX)
DNS_SUBDOMAIN_RE = re.compile(DNS_SUBDOMAIN_REGEX)
C_IDENTIFIER_RE = re.compile(C_IDENTIFIER_REGEX)
_LABEL_PART = re.compile(LABEL_PART_REGEX)


def whole(regex: str) -> str:
    """``regex`` anchored at both ends, for patterns that search (pydantic, JSON schema)."""
    return f"^{regex}$"


def _check_length(value: str, what: str, limit: int) -> None:
    if len(value) > limit:
        raise ValueError(
            f"{what} {value!r} is {len(value)} characters long; at most {limit} are allowed"
        )


def validate_dns_label(value: str, what: str = "name") -> str:
    """A DNS label (RFC 1123): device, counter set and counter names."""
    _check_length(value, what, DNS_LABEL_MAX_LENGTH)
    if not DNS_LABEL_RE.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} is not a DNS label: use lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return value


def validate_dns_subdomain(value: str, what: str = "name") -> str:
    """A DNS subdomain (RFC 1123): object names, node names."""
    _check_length(value, what, DNS_SUBDOMAIN_MAX_LENGTH)
    if not DNS_SUBDOMAIN_RE.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} is not a DNS subdomain: use lowercase letters, digits, '-' and "
            "'.', each dot-separated part starting and ending with a letter or digit"
        )
    return value


def validate_driver_name(value: str, what: str = "driver name") -> str:
    """A driver name, which is also the domain of qualified attribute names."""
    _check_length(value, what, DRIVER_NAME_MAX_LENGTH)
    return validate_dns_subdomain(value, what)


def validate_c_identifier(value: str, what: str = "identifier") -> str:
    _check_length(value, what, C_IDENTIFIER_MAX_LENGTH)
    if not C_IDENTIFIER_RE.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} is not a C identifier: use letters, digits and '_', "
            "not starting with a digit"
        )
    return value


def validate_qualified_name(value: str, what: str = "attribute name") -> str:
    """``<C identifier>`` or ``<domain>/<C identifier>`` (attribute and capacity names)."""
    parts = value.split("/")
    if len(parts) == 1:
        validate_c_identifier(value, what)
        return value
    if len(parts) > 2:
        raise ValueError(f"{what} {value!r} has more than one '/'; use <domain>/<identifier>")
    domain, name = parts
    if not domain:
        raise ValueError(f"{what} {value!r} has an empty domain before '/'")
    if not name:
        raise ValueError(f"{what} {value!r} has an empty identifier after '/'")
    validate_driver_name(domain, f"domain of {what} {value!r}:")
    validate_c_identifier(name, f"{what} {value!r}: identifier")
    return value


def qualify(name: str, domain: str) -> str:
    """The fully qualified attribute or capacity name: ``model`` -> ``<domain>/model``."""
    return name if "/" in name else f"{domain}/{name}"


def published_name(name: str, domain: str) -> str:
    """The name a driver publishes: its own domain left out (``<domain>/model`` -> ``model``).

    A ResourceSlice's unqualified names belong to the slice's driver, so the CEL name
    ``device.attributes["<domain>"].model`` is the same either way; the 1.38 kubelet-plugin
    helper rejects attributes and capacities that spell out the driver's own domain.
    """
    prefix = f"{domain}/"
    return name[len(prefix) :] if name.startswith(prefix) else name


def own_domain_prefix_problem(name: str, domain: str, what: str) -> str | None:
    """Why ``name`` must not be written with the driver's own domain, or ``None``."""
    if not name.startswith(f"{domain}/"):
        return None
    return (
        f"{what} {name!r} spells out the driver's own domain; write "
        f"{published_name(name, domain)!r} (the domain is implied by the driver, and "
        "selectors still read it as "
        f'device.attributes["{domain}"].{published_name(name, domain)})'
    )


def validate_label_name(value: str, what: str = "label name") -> str:
    """A label name (``[prefix/]name``), the format of taint keys."""
    prefix, sep, name = value.rpartition("/")
    if sep:
        if not prefix:
            raise ValueError(f"{what} {value!r} has an empty prefix before '/'")
        validate_dns_subdomain(prefix, f"prefix of {what} {value!r}:")
    if not name:
        raise ValueError(f"{what} {value!r} has an empty name")
    if len(name) > DNS_LABEL_MAX_LENGTH:
        raise ValueError(
            f"{what} {value!r}: the name part is {len(name)} characters long; at most "
            f"{DNS_LABEL_MAX_LENGTH} are allowed"
        )
    if not _LABEL_PART.fullmatch(name):
        raise ValueError(
            f"{what} {value!r}: the name part must consist of letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit"
        )
    return value


def validate_label_value(value: str, what: str = "label value") -> str:
    """A label value (may be empty), the format of taint values."""
    _check_length(value, what, LABEL_VALUE_MAX_LENGTH)
    if value and not _LABEL_PART.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} must consist of letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit"
        )
    return value
