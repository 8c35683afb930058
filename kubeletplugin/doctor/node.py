"""Checks of the node's kernel and filesystems for serving host devices.

Invariants:

* Each check reads files under :class:`~kubeletplugin.doctor.model.Roots` only and returns
  results; none writes anything.
* The module and node checks of a device kind are made only for the kinds the configuration
  uses (others are not reported at all); the AppArmor and loop checks report ``skip`` when
  their kind is not used, so the table says why they did not apply.
"""

from __future__ import annotations

import glob as globbing
from dataclasses import dataclass
from pathlib import Path

from kubeletplugin.doctor.model import CheckResult, Needs, Roots

CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


@dataclass(frozen=True)
class Kind:
    module: str
    node: str
    load: str
    """The command that loads the module (and so makes the node)."""


KIND_INFO = {
    "kvm": Kind(
        "kvm",
        "/dev/kvm",
        "modprobe kvm_intel (Intel) or modprobe kvm_amd (AMD); on a VM, enable nested "
        "virtualisation; on bare metal, VT-x/AMD-V in the firmware",
    ),
    "fuse": Kind("fuse", "/dev/fuse", "modprobe fuse"),
    "tun": Kind("tun", "/dev/net/tun", "modprobe tun"),
    "loop": Kind("loop", "/dev/loop-control", "modprobe loop"),
}


def check_cgroup(roots: Roots) -> CheckResult:
    """cgroup v2, or v1 with the devices controller mounted: what runc uses to allow a node."""
    name = "cgroup device control"
    controllers = roots.sys / "fs/cgroup/cgroup.controllers"
    if controllers.is_file():
        listed = controllers.read_text(encoding="utf-8", errors="replace").split()
        return CheckResult(name, "ok", f"cgroup v2 (controllers: {' '.join(listed) or 'none'})")
    if (roots.sys / "fs/cgroup/devices").is_dir():
        return CheckResult(name, "ok", "cgroup v1 with the devices controller")
    fix = (
        "mount the cgroup v1 devices controller (mount -t cgroup -o devices devices "
        "/sys/fs/cgroup/devices) or boot with systemd.unified_cgroup_hierarchy=1 for cgroup v2"
    )
    if _devices_enabled(roots):
        return CheckResult(
            name,
            "fail",
            "cgroup v1: the devices controller is enabled (/proc/cgroups) but not mounted at "
            "/sys/fs/cgroup/devices, so the runtime cannot allow device nodes",
            fix,
        )
    return CheckResult(
        name,
        "fail",
        "neither cgroup v2 (/sys/fs/cgroup/cgroup.controllers) nor the cgroup v1 devices "
        "controller found: the runtime cannot allow device nodes",
        fix,
    )


def _devices_enabled(roots: Roots) -> bool:
    try:
        lines = (roots.proc / "cgroups").read_text(encoding="utf-8").splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if len(fields) == 4 and fields[0] == "devices":
            return fields[3] == "1"
    return False


def check_cdi_dirs(roots: Roots) -> list[CheckResult]:
    """The CDI spec directories exist and the plugin may write there."""
    results = []
    for directory in CDI_DIRS:
        name = f"CDI directory {directory}"
        where = roots.host_path(directory)
        assert where is not None
        if not where.exists():
            results.append(
                CheckResult(name, "fail", "missing", f"mkdir -p {directory} (on the node)")
            )
        elif not where.is_dir():
            results.append(
                CheckResult(
                    name,
                    "fail",
                    "exists but is not a directory",
                    f"replace it with a directory: rm {directory} && mkdir -p {directory}",
                )
            )
        elif not roots.writable(where):
            results.append(
                CheckResult(
                    name,
                    "fail",
                    "not writable by the plugin: it cannot write the CDI specs of claims",
                    f"mount {directory} read-write into the plugin's pod (hostPath volume, "
                    "readOnly: false) and run the plugin as root",
                )
            )
        else:
            results.append(CheckResult(name, "ok", "exists and is writable"))
    return results


def check_kind(roots: Roots, kind: str) -> list[CheckResult]:
    """The kernel module of ``kind`` is loaded (or built in) and its node is present."""
    info = KIND_INFO[kind]
    node = roots.host_path(info.node)
    assert node is not None
    present = node.exists()
    module_name = f"kernel module {info.module}"
    if (roots.sys / "module" / info.module).is_dir():
        module = CheckResult(module_name, "ok", "loaded")
    elif present:
        module = CheckResult(
            module_name, "ok", f"not in /sys/module, but {info.node} exists: built in"
        )
    else:
        module = CheckResult(module_name, "fail", "not loaded", info.load)
    if present:
        node_result = CheckResult(f"device node {info.node}", "ok", "present")
    else:
        node_result = CheckResult(
            f"device node {info.node}",
            "fail",
            "missing: devices of this kind cannot be served",
            info.load if module.status == "fail" else f"the module is loaded: {_mknod(kind)}",
        )
    return [module, node_result]


def _mknod(kind: str) -> str:
    return {
        "kvm": "mknod /dev/kvm c 10 232",
        "fuse": "mknod /dev/fuse c 10 229",
        "tun": "mkdir -p /dev/net && mknod /dev/net/tun c 10 200",
        "loop": "mknod /dev/loop-control c 10 237",
    }[kind]


def check_apparmor(roots: Roots, needs: Needs) -> CheckResult:
    """With FUSE configured, an enabled AppArmor denies /dev/fuse in the runtime's default
    profile even when the claim allowed the device."""
    name = "AppArmor and /dev/fuse"
    if "fuse" not in needs.kinds:
        return CheckResult(name, "skip", "fuse is not configured")
    enabled = roots.sys / "module/apparmor/parameters/enabled"
    try:
        value = enabled.read_text(encoding="utf-8").strip()
    except OSError:
        return CheckResult(name, "ok", "AppArmor is not present")
    if value != "Y":
        return CheckResult(name, "ok", "AppArmor is not enabled")
    return CheckResult(
        name,
        "warn",
        "AppArmor is enabled: the runtime's default profile denies mounting FUSE "
        "even with /dev/fuse allowed",
        "in pods that mount FUSE set securityContext.appArmorProfile: {type: Unconfined} "
        "(or type: Localhost with a profile that allows mount and /dev/fuse)",
    )


def check_free_loops(roots: Roots, needs: Needs) -> CheckResult:
    """A loop device is free when nothing is attached (no ``loop/backing_file`` in sysfs)."""
    name = "free loop devices"
    if "loop" not in needs.kinds:
        return CheckResult(name, "skip", "loop is not configured")
    block = roots.sys / "block"
    loops = sorted(p for p in block.glob("loop[0-9]*") if p.name[4:].isdigit())
    free = [p.name for p in loops if not (p / "loop" / "backing_file").exists()]
    if free:
        return CheckResult(name, "ok", f"{len(free)} of {len(loops)} free ({', '.join(free[:8])})")
    fix = (
        "detach unused ones (losetup -d /dev/loopN) or allow more (modprobe loop max_loop=64, "
        "or max_loop=64 on the kernel command line when loop is built in)"
    )
    if not loops:
        return CheckResult(name, "warn", "no loop devices in /sys/block", fix)
    return CheckResult(name, "warn", f"all {len(loops)} loop devices are attached", fix)


def check_paths(roots: Roots, needs: Needs) -> list[CheckResult]:
    """Each configured host path (or glob) matches something on the node."""
    results = []
    for path in needs.paths:
        name = f"path {path}"
        if not path.startswith("/dev/"):
            results.append(CheckResult(name, "skip", "not under /dev; not checked"))
            continue
        matches = _matches(roots.dev, path.removeprefix("/dev/"))
        if matches:
            shown = ", ".join(matches[:4]) + (", ..." if len(matches) > 4 else "")
            results.append(CheckResult(name, "ok", f"{len(matches)} match(es): {shown}"))
        else:
            results.append(
                CheckResult(
                    name,
                    "warn",
                    "matches nothing on this node: its devices are absent (or unhealthy) here",
                    "plug the device in or load its driver; if the node should not have it, "
                    "limit the driver's DaemonSet to nodes that do (nodeSelector)",
                )
            )
    return results


def _matches(dev: Path, relative: str) -> list[str]:
    if globbing.has_magic(relative):
        found = globbing.glob(relative, root_dir=dev)
    else:
        found = [relative] if (dev / relative).exists() or (dev / relative).is_symlink() else []
    return sorted(f"/dev/{m}" for m in found)
