"""Does the node's container runtime apply CDI edits (the devices a claim names)?

Invariants:

* containerd 2.0 and later: CDI is on unless the configuration turns ``enable_cdi`` off;
  containerd 1.7: on only with ``enable_cdi = true``; older: no CDI (fail).
* CRI-O 1.28 and later with both of its CDI directories present (it fails to start
  containers when one is missing); older: fail.
* cri-dockerd (its socket under /var/run): fail, it does not inject CDI devices.
* No runtime answering ``--version``: warn, the check cannot tell.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

from kubeletplugin.doctor.model import CheckResult, Roots

NAME = "container runtime applies CDI"
CONTAINERD_CONFIG = "containerd/config.toml"
CRI_DOCKERD_SOCKET = "cri-dockerd.sock"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
CRIO_MINIMUM = (1, 28)

_VERSION = re.compile(r"\bv?(\d+)\.(\d+)(?:\.(\d+))?")

_ENABLE_CDI_FIX = (
    'set enable_cdi = true (and cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]) under '
    '[plugins."io.containerd.grpc.v1.cri"] in /etc/containerd/config.toml, then '
    "systemctl restart containerd; or upgrade to containerd 2.x, where CDI is on by default"
)


def version_of(output: str) -> tuple[int, int] | None:
    """The first ``major.minor`` in a ``--version`` output."""
    match = _VERSION.search(output)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_runtime(roots: Roots) -> list[CheckResult]:
    """One result per runtime found on the node (a warning if none is)."""
    results = []
    if (roots.run / CRI_DOCKERD_SOCKET).exists():
        results.append(
            CheckResult(
                NAME,
                "fail",
                f"cri-dockerd is serving the kubelet ({roots.run / CRI_DOCKERD_SOCKET} exists); "
                "it does not inject CDI devices, so claimed devices never reach containers",
                "move the node to containerd >= 2.0 or CRI-O >= 1.28 (kubelet "
                "--container-runtime-endpoint)",
            )
        )
    containerd = roots.command(["containerd", "--version"])
    if containerd is not None:
        results.append(_containerd(containerd, roots))
    crio = roots.command(["crio", "--version"])
    if crio is not None:
        results.append(_crio(crio, roots))
    if not results:
        results.append(
            CheckResult(
                NAME,
                "warn",
                "neither `containerd --version` nor `crio --version` answered: cannot tell "
                "whether the runtime applies CDI edits",
                "run this check where the runtime's binaries are on PATH (e.g. on the node: "
                "dradriver-kubeletplugin doctor)",
            )
        )
    return results


def _containerd(output: str, roots: Roots) -> CheckResult:
    version = version_of(output)
    if version is None:
        return CheckResult(
            NAME,
            "warn",
            f"cannot read containerd's version from {output.strip()!r}",
            "check `containerd --version` by hand: CDI needs 2.0, or 1.7 with enable_cdi = true",
        )
    shown = f"containerd {version[0]}.{version[1]}"
    if version < (1, 7):
        return CheckResult(
            NAME, "fail", f"{shown} does not support CDI", "upgrade containerd to 2.x (or 1.7)"
        )
    setting, problem = _enable_cdi(roots)
    if problem is not None:
        return CheckResult(NAME, "fail", f"{shown}: {problem}", "fix the TOML syntax of it")
    if version >= (2, 0):
        if setting is False:
            return CheckResult(
                NAME,
                "fail",
                f"{shown}: enable_cdi = false in {roots.etc / CONTAINERD_CONFIG}",
                "remove enable_cdi = false from /etc/containerd/config.toml and restart containerd",
            )
        return CheckResult(NAME, "ok", f"{shown}: CDI is on by default")
    if setting is True:
        return CheckResult(NAME, "ok", f"{shown} with enable_cdi = true")
    return CheckResult(
        NAME,
        "fail",
        f"{shown} applies CDI only with enable_cdi = true, which "
        f"{roots.etc / CONTAINERD_CONFIG} does not set (claims would start without devices)",
        _ENABLE_CDI_FIX,
    )


def _enable_cdi(roots: Roots) -> tuple[bool | None, str | None]:
    """containerd's ``enable_cdi`` setting (None: not set) or why the file cannot be read."""
    path = roots.etc / CONTAINERD_CONFIG
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        return None, f"cannot read {path}: {err}"
    return _find_setting(document, "enable_cdi"), None


def _find_setting(table: Any, key: str) -> bool | None:
    """The first boolean ``key`` anywhere in a TOML document (the CRI plugin's table moved
    between containerd's configuration versions)."""
    if not isinstance(table, dict):
        return None
    value = table.get(key)
    if isinstance(value, bool):
        return value
    for child in table.values():
        found = _find_setting(child, key)
        if found is not None:
            return found
    return None


def _crio(output: str, roots: Roots) -> CheckResult:
    version = version_of(output)
    if version is None:
        return CheckResult(
            NAME,
            "warn",
            f"cannot read CRI-O's version from {output.strip()!r}",
            "check `crio --version` by hand: CDI needs CRI-O 1.28 or later",
        )
    shown = f"CRI-O {version[0]}.{version[1]}"
    if version < CRIO_MINIMUM:
        return CheckResult(
            NAME,
            "fail",
            f"{shown} is older than 1.28, the first release applying CDI devices from claims",
            "upgrade CRI-O to 1.28 or later",
        )
    missing = [d for d in CDI_DIRS if not _is_dir(roots, d)]
    if missing:
        return CheckResult(
            NAME,
            "fail",
            f"{shown}: CDI directory {', '.join(missing)} missing; CRI-O fails to start "
            "containers with CDI devices when it is",
            f"mkdir -p {' '.join(missing)}",
        )
    return CheckResult(NAME, "ok", f"{shown} with {' and '.join(CDI_DIRS)}")


def _is_dir(roots: Roots, path: str) -> bool:
    where = roots.host_path(path)
    return where is not None and where.is_dir()
