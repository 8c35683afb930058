"""Node checks for host devices, on node trees built under tmp_path (never the real /sys, /dev)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from kubeletplugin.doctor import CheckResult, Needs, Roots, format_table, run_checks
from kubeletplugin.doctor.node import (
    check_apparmor,
    check_cdi_dirs,
    check_cgroup,
    check_free_loops,
    check_kind,
    check_paths,
)
from kubeletplugin.doctor.runtime import check_runtime, version_of

CONTAINERD_2 = (
    "containerd github.com/containerd/containerd/v2 v2.0.2 c507a0257ea6462fbd6f5ba4f5c74fa\n"
)
CONTAINERD_17 = "containerd containerd.io 1.7.25 bcc810d6b9066471b0b6fa75f557a15a1cbf31bb\n"
CRIO_128 = "crio version 1.28.1\n"


def runner(outputs: dict[str, str]) -> Callable[[Sequence[str]], str | None]:
    """Canned ``<program> --version`` output. A fake, because the faults these checks find
    (an old containerd, CRI-O, no runtime at all) cannot be caused otherwise in a test."""

    def run(argv: Sequence[str]) -> str | None:
        assert list(argv[1:]) == ["--version"]
        return outputs.get(argv[0])

    return run


def always_writable(_: Path) -> bool:
    return True


def never_writable(_: Path) -> bool:
    # A fake: the tests run as root, for whom every directory is writable, so a directory the
    # plugin may not write to cannot be made otherwise.
    return False


def touch(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def make_roots(
    base: Path,
    outputs: dict[str, str] | None = None,
    writable: Callable[[Path], bool] = always_writable,
) -> Roots:
    return Roots.under(base, command=runner(outputs or {}), writable=writable)


@pytest.fixture
def healthy(tmp_path: Path) -> Roots:
    """A node with everything in order: containerd 2.0, cgroup v2, CDI dirs, every kind."""
    roots = make_roots(tmp_path, {"containerd": CONTAINERD_2})
    touch(roots.sys / "fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n")
    (roots.etc / "cdi").mkdir(parents=True)
    (roots.run / "cdi").mkdir(parents=True)
    for module in ("kvm", "fuse", "tun", "loop"):
        (roots.sys / "module" / module).mkdir(parents=True)
    for node in ("kvm", "fuse", "net/tun", "loop-control", "loop0", "loop1", "ttyUSB0"):
        touch(roots.dev / node)
    (roots.dev / "serial/by-id").mkdir(parents=True)
    (roots.dev / "serial/by-id/usb-FTDI_A1-if00").symlink_to("../../ttyUSB0")
    touch(roots.sys / "block/loop0/loop/backing_file", "/var/img\n")
    (roots.sys / "block/loop1/loop").mkdir(parents=True)
    touch(roots.sys / "module/apparmor/parameters/enabled", "N\n")
    return roots


ALL = Needs(
    kinds=frozenset({"kvm", "fuse", "tun", "loop"}),
    paths=("/dev/ttyUSB*", "/dev/serial/by-id/*", "/dev/kvm"),
)


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    names = [r.name for r in results]
    assert len(names) == len(set(names)), names
    return {r.name: r for r in results}


def test_a_healthy_node_passes_every_check(healthy: Roots) -> None:
    results = by_name(run_checks(healthy, ALL))
    assert {name: r.status for name, r in results.items()} == {
        "container runtime applies CDI": "ok",
        "cgroup device control": "ok",
        "CDI directory /etc/cdi": "ok",
        "CDI directory /var/run/cdi": "ok",
        "kernel module kvm": "ok",
        "device node /dev/kvm": "ok",
        "kernel module fuse": "ok",
        "device node /dev/fuse": "ok",
        "kernel module tun": "ok",
        "device node /dev/net/tun": "ok",
        "kernel module loop": "ok",
        "device node /dev/loop-control": "ok",
        "AppArmor and /dev/fuse": "ok",
        "free loop devices": "ok",
        "path /dev/ttyUSB*": "ok",
        "path /dev/serial/by-id/*": "ok",
        "path /dev/kvm": "ok",
    }
    assert results["free loop devices"].detail == "1 of 2 free (loop1)"
    assert results["path /dev/serial/by-id/*"].detail.endswith("/dev/serial/by-id/usb-FTDI_A1-if00")
    assert all(not r.fix for r in results.values())


def test_kinds_not_configured_are_not_checked(healthy: Roots) -> None:
    results = by_name(run_checks(healthy, Needs()))
    assert not any(name.startswith(("kernel module", "device node", "path")) for name in results)
    assert results["AppArmor and /dev/fuse"].status == "skip"
    assert results["free loop devices"].status == "skip"


# --- container runtime -----------------------------------------------------------------------


def runtime(roots: Roots) -> CheckResult:
    [result] = check_runtime(roots)
    return result


def test_containerd_2_is_ok_unless_cdi_is_turned_off(tmp_path: Path) -> None:
    roots = make_roots(tmp_path, {"containerd": CONTAINERD_2})
    assert runtime(roots).status == "ok"
    touch(
        roots.etc / "containerd/config.toml",
        'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n  enable_cdi = false\n',
    )
    result = runtime(roots)
    assert (result.status, "enable_cdi = false" in result.detail) == ("fail", True)
    assert "restart containerd" in result.fix


def test_containerd_1_7_needs_enable_cdi(tmp_path: Path) -> None:
    roots = make_roots(tmp_path, {"containerd": CONTAINERD_17})
    result = runtime(roots)
    assert result.status == "fail"
    assert "containerd 1.7" in result.detail
    assert "enable_cdi = true" in result.fix
    config = touch(
        roots.etc / "containerd/config.toml",
        'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n',
    )
    assert runtime(roots).status == "ok"
    config.write_text("version = 2\n[plugins\n")
    broken = runtime(roots)
    assert broken.status == "fail" and "cannot read" in broken.detail


def test_containerd_before_1_7_has_no_cdi(tmp_path: Path) -> None:
    roots = make_roots(tmp_path, {"containerd": "containerd github.com/containerd v1.6.31 e3\n"})
    result = runtime(roots)
    assert (result.status, result.detail) == ("fail", "containerd 1.6 does not support CDI")


def test_crio_needs_1_28_and_both_cdi_directories(tmp_path: Path) -> None:
    roots = make_roots(tmp_path, {"crio": CRIO_128})
    missing = runtime(roots)
    assert missing.status == "fail"
    assert missing.fix == "mkdir -p /etc/cdi /var/run/cdi"
    (roots.etc / "cdi").mkdir(parents=True)
    (roots.run / "cdi").mkdir(parents=True)
    assert runtime(roots).status == "ok"
    old = make_roots(tmp_path, {"crio": "Version:        1.27.4\nGoVersion: go1.20\n"})
    result = runtime(old)
    assert result.status == "fail" and "CRI-O 1.27" in result.detail


def test_cri_dockerd_fails(tmp_path: Path) -> None:
    roots = make_roots(tmp_path)
    touch(roots.run / "cri-dockerd.sock")
    result = runtime(roots)
    assert result.status == "fail"
    assert "does not inject CDI devices" in result.detail


def test_no_runtime_answering_is_a_warning(tmp_path: Path) -> None:
    assert runtime(make_roots(tmp_path)).status == "warn"
    unreadable = runtime(make_roots(tmp_path, {"containerd": "containerd dev build\n"}))
    assert unreadable.status == "warn" and "cannot read" in unreadable.detail


def test_version_of() -> None:
    assert version_of(CONTAINERD_2) == (2, 0)
    assert version_of(CONTAINERD_17) == (1, 7)
    assert version_of(CRIO_128) == (1, 28)
    assert version_of("nothing") is None


# --- cgroups, CDI directories ------------------------------------------------------------------


def test_cgroup_v1_with_and_without_the_devices_controller(tmp_path: Path) -> None:
    roots = make_roots(tmp_path)
    none = check_cgroup(roots)
    assert none.status == "fail" and "neither cgroup v2" in none.detail
    touch(
        roots.proc / "cgroups", "#subsys_name\thierarchy\tnum_cgroups\tenabled\ndevices\t4\t90\t1\n"
    )
    unmounted = check_cgroup(roots)
    assert unmounted.status == "fail" and "not mounted" in unmounted.detail
    assert "systemd.unified_cgroup_hierarchy=1" in unmounted.fix
    (roots.sys / "fs/cgroup/devices").mkdir(parents=True)
    assert check_cgroup(roots) == CheckResult(
        "cgroup device control", "ok", "cgroup v1 with the devices controller"
    )


def test_cdi_directories_missing_not_a_directory_and_not_writable(tmp_path: Path) -> None:
    roots = make_roots(tmp_path, writable=never_writable)
    touch(roots.run / "cdi")
    (roots.etc / "cdi").mkdir(parents=True)
    etc, run = check_cdi_dirs(roots)
    assert (etc.status, etc.detail) == (
        "fail",
        "not writable by the plugin: it cannot write the CDI specs of claims",
    )
    assert "read-write" in etc.fix
    assert (run.status, run.detail) == ("fail", "exists but is not a directory")
    missing = check_cdi_dirs(make_roots(tmp_path / "empty"))
    assert [(r.status, r.fix) for r in missing] == [
        ("fail", "mkdir -p /etc/cdi (on the node)"),
        ("fail", "mkdir -p /var/run/cdi (on the node)"),
    ]


# --- device kinds ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "module", "node", "load"),
    [
        ("kvm", "kvm", "kvm", "modprobe kvm_intel"),
        ("fuse", "fuse", "fuse", "modprobe fuse"),
        ("tun", "tun", "net/tun", "modprobe tun"),
        ("loop", "loop", "loop-control", "modprobe loop"),
    ],
)
def test_each_kind_module_and_node(
    tmp_path: Path, kind: str, module: str, node: str, load: str
) -> None:
    roots = make_roots(tmp_path)
    mod, dev = check_kind(roots, kind)
    assert (mod.status, dev.status) == ("fail", "fail")
    assert mod.fix.startswith(load) and dev.fix.startswith(load)
    (roots.sys / "module" / module).mkdir(parents=True)
    mod, dev = check_kind(roots, kind)
    assert (mod.status, dev.status) == ("ok", "fail")
    assert "mknod" in dev.fix
    touch(roots.dev / node)
    mod, dev = check_kind(roots, kind)
    assert (mod.status, dev.status) == ("ok", "ok")
    (roots.sys / "module" / module).rmdir()
    mod, _ = check_kind(roots, kind)
    assert mod.status == "ok" and "built in" in mod.detail


def test_apparmor_enabled_with_fuse_is_a_warning(tmp_path: Path) -> None:
    roots = make_roots(tmp_path)
    fuse = Needs(kinds=frozenset({"fuse"}))
    assert check_apparmor(roots, fuse).detail == "AppArmor is not present"
    touch(roots.sys / "module/apparmor/parameters/enabled", "Y\n")
    result = check_apparmor(roots, fuse)
    assert result.status == "warn"
    assert "appArmorProfile: {type: Unconfined}" in result.fix
    assert check_apparmor(roots, Needs()).status == "skip"


def test_no_free_loop_device_is_a_warning(tmp_path: Path) -> None:
    roots = make_roots(tmp_path)
    loop = Needs(kinds=frozenset({"loop"}))
    none = check_free_loops(roots, loop)
    assert none.status == "warn" and "no loop devices" in none.detail
    touch(roots.sys / "block/loop0/loop/backing_file", "/a\n")
    touch(roots.sys / "block/loop1/loop/backing_file", "/b\n")
    (roots.sys / "block/loop-x").mkdir()
    attached = check_free_loops(roots, loop)
    assert attached.status == "warn" and attached.detail == "all 2 loop devices are attached"
    assert "losetup -d" in attached.fix
    (roots.sys / "block/loop1/loop/backing_file").unlink()
    assert check_free_loops(roots, loop).status == "ok"


def test_configured_paths_that_match_nothing(tmp_path: Path) -> None:
    roots = make_roots(tmp_path)
    touch(roots.dev / "ttyACM0")
    needs = Needs(paths=("/dev/ttyUSB*", "/dev/ttyACM*", "/dev/vfio/vfio", "/opt/thing"))
    results = by_name(check_paths(roots, needs))
    assert results["path /dev/ttyUSB*"].status == "warn"
    assert results["path /dev/ttyUSB*"].fix
    assert results["path /dev/ttyACM*"].status == "ok"
    assert results["path /dev/vfio/vfio"].status == "warn"
    assert results["path /opt/thing"].status == "skip"


def test_needs_from_paths_and_unknown_kinds() -> None:
    needs = Needs.from_paths(["/dev/kvm", "/dev/net/tun", "/dev/loop[0-7]", "/dev/ttyS*"])
    assert needs.kinds == frozenset({"kvm", "tun", "loop"})
    assert Needs.from_paths(["/dev/fuse"]).kinds == frozenset({"fuse"})
    with pytest.raises(ValueError, match=r"kinds: unknown \['gpu'\]"):
        Needs(kinds=frozenset({"gpu"}))


def test_roots_map_host_paths() -> None:
    roots = Roots.under(Path("/host"))
    assert roots.host_path("/var/run/cdi") == Path("/host/var/run/cdi")
    assert roots.host_path("/run/cdi") == Path("/host/var/run/cdi")
    assert roots.host_path("/dev/net/tun") == Path("/host/dev/net/tun")
    assert roots.host_path("/device") is None
    assert Roots().sys == Path("/sys")


# --- the table ---------------------------------------------------------------------------------


def test_format_table_aligns_columns_and_puts_a_fix_under_each_failure() -> None:
    table = format_table(
        [
            CheckResult("cgroup device control", "ok", "cgroup v2"),
            CheckResult("kernel module kvm", "fail", "not loaded", "modprobe kvm_intel"),
            CheckResult("AppArmor and /dev/fuse", "warn", "enabled", "use Unconfined"),
            CheckResult("free loop devices", "skip", "loop is not configured"),
        ]
    )
    assert table == (
        "STATUS  CHECK                   DETAIL\n"
        "ok      cgroup device control   cgroup v2\n"
        "fail    kernel module kvm       not loaded\n"
        "        fix: modprobe kvm_intel\n"
        "warn    AppArmor and /dev/fuse  enabled\n"
        "        fix: use Unconfined\n"
        "skip    free loop devices       loop is not configured\n"
        "1 ok, 1 warn, 1 fail, 1 skip\n"
    )
    assert format_table([]) == "STATUS  CHECK  DETAIL\nno checks\n"
