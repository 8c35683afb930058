"""Kubeconfigs that name only static credentials, read without the ``kubernetes`` package.

Importing the ``kubernetes`` client costs a long-running process about 40 MiB of memory
it never gives back, and most kubeconfigs need none of it: a server, a CA, a client
certificate or a bearer token. :func:`read_static_kubeconfig` reads exactly those; for
anything else (an ``exec`` credential plugin, an ``auth-provider`` such as OIDC,
basic auth, impersonation, a proxy, several files in ``$KUBECONFIG``) it returns None and
the caller uses the client library's loader, which refreshes expiring tokens.

The file is the operator's, but it is still checked: a bounded size, a mapping at every
level the loader reads, strings where strings belong, and an error that names the field.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MAX_KUBECONFIG_BYTES = 1 << 20
# What this reader understands; any other key means "let the client library load it".
CLUSTER_KEYS = frozenset(
    {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify"}
)
USER_KEYS = frozenset(
    {"client-certificate", "client-certificate-data", "client-key", "client-key-data", "token"}
)


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used as it is; the message names the file and the field."""


@dataclass(frozen=True)
class StaticCredentials:
    """Where the apiserver is and how to reach it, from a kubeconfig with static credentials."""

    server: str
    tls: ssl.SSLContext
    token: str | None


def kubeconfig_path(explicit: str | None) -> Path | None:
    """The one file to read: ``explicit``, else a single-path ``$KUBECONFIG``, else
    ``~/.kube/config``; None when ``$KUBECONFIG`` lists several files (they are merged,
    which the client library does)."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("KUBECONFIG", "")
    paths = [p for p in env.split(os.pathsep) if p]
    if len(paths) > 1:
        return None
    return Path(paths[0]) if paths else Path.home() / ".kube" / "config"


def _mapping(value: Any, where: str, path: Path) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise KubeconfigError(f"kubeconfig {path}: {where} is not a mapping")
    return value


def _named(doc: dict[str, Any], section: str, name: str, path: Path) -> dict[str, Any]:
    items = doc.get(section) or []
    if not isinstance(items, list):
        raise KubeconfigError(f"kubeconfig {path}: {section} is not a list")
    for item in items:
        if isinstance(item, dict) and item.get("name") == name:
            kind = section.removesuffix("s")
            return _mapping(item.get(kind) or {}, f"{section}[{name}].{kind}", path)
    raise KubeconfigError(f"kubeconfig {path}: no {section.removesuffix('s')} named {name!r}")


def _string(section: dict[str, Any], key: str, where: str, path: Path) -> str | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise KubeconfigError(f"kubeconfig {path}: {where}.{key} is not a non-empty string")
    return value


def _file(section: dict[str, Any], key: str, where: str, path: Path) -> str | None:
    """A file the kubeconfig names; relative paths are relative to the kubeconfig's dir."""
    value = _string(section, key, where, path)
    return None if value is None else str(path.parent / value)


def _data(section: dict[str, Any], key: str, where: str, path: Path) -> bytes | None:
    value = _string(section, f"{key}-data", where, path)
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise KubeconfigError(f"kubeconfig {path}: {where}.{key}-data is not base64") from e


def _load_cert_chain(tls: ssl.SSLContext, cert: str | bytes, key: str | bytes) -> None:
    """The ssl module reads a client certificate only from files: data from the kubeconfig
    goes through a private temp dir that is removed right after."""
    with tempfile.TemporaryDirectory(prefix="dradriver-kubeconfig-") as tmp:
        paths = []
        for name, value in (("cert.pem", cert), ("key.pem", key)):
            if isinstance(value, bytes):
                file = Path(tmp) / name
                fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(value)
                paths.append(str(file))
            else:
                paths.append(value)
        tls.load_cert_chain(paths[0], paths[1])


def read_static_kubeconfig(explicit: str | None) -> StaticCredentials | None:
    """The current context's server and static credentials, or None if the client library
    must load this kubeconfig (see the module docstring)."""
    path = kubeconfig_path(explicit)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_KUBECONFIG_BYTES + 1)
    except OSError as e:
        raise KubeconfigError(f"kubeconfig {path}: cannot be read: {e.strerror}") from e
    if len(raw) > MAX_KUBECONFIG_BYTES:
        raise KubeconfigError(f"kubeconfig {path}: larger than {MAX_KUBECONFIG_BYTES} bytes")
    try:
        doc = _mapping(yaml.safe_load(raw) or {}, "the document", path)
    except yaml.YAMLError as e:
        raise KubeconfigError(f"kubeconfig {path}: not valid YAML: {e}") from e
    current = doc.get("current-context")
    if not isinstance(current, str) or not current:
        raise KubeconfigError(f"kubeconfig {path}: no current-context")
    context = _named(doc, "contexts", current, path)
    if set(context) - {"cluster", "user", "namespace", "extensions"}:
        return None
    cluster_name, user_name = context.get("cluster"), context.get("user")
    if not isinstance(cluster_name, str) or not isinstance(user_name, str):
        raise KubeconfigError(f"kubeconfig {path}: context {current!r} names no cluster or user")
    cluster = _named(doc, "clusters", cluster_name, path)
    user = _named(doc, "users", user_name, path)
    if set(cluster) - CLUSTER_KEYS or set(user) - USER_KEYS:
        return None
    where_c, where_u = f"clusters[{cluster_name}]", f"users[{user_name}]"
    server = _string(cluster, "server", where_c, path)
    if server is None or not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"kubeconfig {path}: {where_c}.server is not an http(s) URL")
    ca_data = _data(cluster, "certificate-authority", where_c, path)
    ca_file = _file(cluster, "certificate-authority", where_c, path)
    try:
        tls = ssl.create_default_context(
            cafile=ca_file, cadata=ca_data.decode("ascii") if ca_data else None
        )
        insecure = cluster.get("insecure-skip-tls-verify", False)
        if not isinstance(insecure, bool):
            raise KubeconfigError(f"kubeconfig {path}: {where_c}.insecure-skip-tls-verify")
        if insecure:
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        cert = _data(user, "client-certificate", where_u, path) or _file(
            user, "client-certificate", where_u, path
        )
        key = _data(user, "client-key", where_u, path) or _file(user, "client-key", where_u, path)
        if (cert is None) != (key is None):
            raise KubeconfigError(
                f"kubeconfig {path}: {where_u} has a client certificate or key, not both"
            )
        if cert is not None and key is not None:
            _load_cert_chain(tls, cert, key)
    except (ssl.SSLError, OSError, UnicodeDecodeError) as e:
        raise KubeconfigError(f"kubeconfig {path}: unusable TLS material: {e}") from e
    return StaticCredentials(
        server=server.rstrip("/"), tls=tls, token=_string(user, "token", where_u, path)
    )
