"""All node checks, in the order a person fixes them: runtime, cgroups, CDI, kinds, paths."""

from __future__ import annotations

from kubeletplugin.doctor.model import KINDS, CheckResult, Needs, Roots
from kubeletplugin.doctor.node import (
    check_apparmor,
    check_cdi_dirs,
    check_cgroup,
    check_free_loops,
    check_kind,
    check_paths,
)
from kubeletplugin.doctor.runtime import check_runtime


def run_checks(roots: Roots, needs: Needs) -> list[CheckResult]:
    """Every check that applies to a configuration with ``needs``, on the node at ``roots``."""
    results = [*check_runtime(roots), check_cgroup(roots), *check_cdi_dirs(roots)]
    for kind in KINDS:
        if kind in needs.kinds:
            results.extend(check_kind(roots, kind))
    results.append(check_apparmor(roots, needs))
    results.append(check_free_loops(roots, needs))
    results.extend(check_paths(roots, needs))
    return results
