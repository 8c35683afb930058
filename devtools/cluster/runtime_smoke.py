"""Smoke check of the real container runtime, run by hand (not a pytest).

    python -m devtools.cluster.runtime_smoke [--keep]

Builds (or finds) the runtime binaries and both images, starts a private
containerd under a temp dir, imports the images, runs the probe image and the
pause image with ``ctr run`` (host network), reads the probe's report, then
tears everything down in the documented order and checks that nothing is left
(no process, mount, cgroup or file of this instance). Prints one timing table.
Starts no kubelet and listens on no fixed port (the CRI streaming server takes
a free loopback port).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from devtools.cluster import containerd, images, runtimebin
from devtools.cluster.probe import parse_report
from dradriver.log import configure

PROBE_ID = "smoke-probe"
PAUSE_ID = "smoke-pause"
NAMESPACE = images.K8S_NAMESPACE


class SmokeFailure(RuntimeError):
    pass


@contextmanager
def timed(results: dict[str, float], name: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    results[name] = time.monotonic() - started


def run_attached(
    argv: Sequence[str], until: str, timeout: float = 60
) -> tuple[subprocess.Popen[str], list[str], float]:
    """Start ``ctr run`` attached; read stdout until a line starts with ``until``.

    Returns the process, the lines read and the seconds to the first line.
    """
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = time.monotonic()
    first: float | None = None
    lines: list[str] = []
    assert proc.stdout is not None
    deadline = started + timeout
    for raw in proc.stdout:
        if first is None:
            first = time.monotonic() - started
        lines.append(raw.rstrip("\n"))
        if raw.startswith(until) or time.monotonic() > deadline:
            break
    if first is None or not lines[-1].startswith(until):
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise SmokeFailure(f"{' '.join(argv)} printed no {until!r} line:\n{lines}\n{err}")
    return proc, lines, first


def smoke(keep: bool) -> int:
    t: dict[str, float] = {}
    with timed(t, "runtime binaries (cache hit or build)"):
        bin_dir = runtimebin.ensure_runtime_binaries()
    with timed(t, "image tarballs (cached by digest)"):
        tarballs = images.ensure_images(bin_dir / "probe")
    sizes = {name: path.stat().st_size for name, path in tarballs.items()}
    run_containerd_before = Path("/run/containerd").exists()

    base = Path(tempfile.mkdtemp(prefix="drd-ctrd-", dir="/tmp"))
    layout = containerd.Layout(base)
    containerd.write_config(layout, bin_dir)
    fifo_dir = base / "fifo"
    fifo_dir.mkdir()
    ctrd = containerd.start(layout, bin_dir)
    t["containerd start -> ctr version answers"] = ctrd.ready_seconds or 0.0
    ok = False
    try:
        plugins = ctrd.ctr("default", "plugins", "list").stdout.splitlines()
        cri = [p.split() for p in plugins if ".cri." in p or "cri.v1" in p]
        broken = [" ".join(p) for p in cri if p[-1] != "ok"]
        print("CRI plugins:", ", ".join(f"{p[0]}/{p[1]} {p[-1]}" for p in cri))
        if broken:
            raise SmokeFailure("CRI plugins failed to load:\n" + "\n".join(broken))

        for name, path in tarballs.items():
            with timed(t, f"import {name}"):
                images.import_image(bin_dir / "ctr", str(layout.address), path)
        listed = images.list_images(bin_dir / "ctr", str(layout.address))
        missing = [n for n in tarballs if n not in listed]
        if missing:
            raise SmokeFailure(f"imported images not listed: {missing} (have {listed})")

        # The probe image with its own entrypoint (probe report).
        run = containerd.ctr_argv(
            bin_dir,
            layout,
            NAMESPACE,
            "run",
            "--rm",
            "--net-host",
            "--fifo-dir",
            str(fifo_dir),
            *ctrd.runc_flags(),
        )
        proc, lines, first = run_attached([*run, images.PROBE_IMAGE, PROBE_ID], until="probe ready")
        t["ctr run probe -> first output line"] = first
        report = parse_report("\n".join(lines))
        null = report.paths.get("/dev/null")
        if null is None or (null.type, null.rdev) != ("char", "1:3"):
            raise SmokeFailure(f"/dev/null in the container is not char 1:3: {null}")
        start = report.start
        with timed(t, "SIGTERM probe -> ctr run exits"):
            ctrd.ctr(NAMESPACE, "tasks", "kill", "-s", "SIGTERM", PROBE_ID)
            out, err = proc.communicate(timeout=30)
        if proc.returncode != 0 or "probe exit" not in out:
            raise SmokeFailure(f"probe did not exit 0 on SIGTERM ({proc.returncode}): {out}{err}")
        print(
            f"probe: {start}, {len(report.env)} env, "
            f"{len(report.paths)} paths, {len(report.mounts)} mounts"
        )
        for line in lines:
            if line.startswith(("env ", "path type=char rdev=1:3", "mount id")) and (
                "PATH=" in line or "/dev/null" in line or "point=/ " in line
            ):
                print("  " + line)

        # busybox in the probe image.
        with timed(t, "ctr run busybox sh (one-shot)"):
            shell = ctrd.ctr(
                NAMESPACE,
                "run",
                "--rm",
                "--net-host",
                "--fifo-dir",
                str(fifo_dir),
                *ctrd.runc_flags(),
                images.PROBE_IMAGE,
                "smoke-sh",
                "sh",
                "-c",
                "id; ls -ld /tmp; cat /etc/passwd | wc -l; env | sort | head -3",
            )
        print("busybox:", " | ".join(shell.stdout.splitlines()))

        # The pause image: runs as 65535, exits 0 on SIGTERM.
        pause = subprocess.Popen(
            [*run, images.PAUSE_IMAGE, PAUSE_ID],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not ctrd.task_running(NAMESPACE, PAUSE_ID):
            time.sleep(0.05)
        ps = ctrd.ctr(NAMESPACE, "tasks", "ps", PAUSE_ID).stdout.split()
        pause_pid = ps[2] if len(ps) > 2 else "?"
        uid_line = [
            line
            for line in Path(f"/proc/{pause_pid}/status").read_text().splitlines()
            if line.startswith("Uid:")
        ]
        with timed(t, "SIGTERM pause -> ctr run exits"):
            ctrd.ctr(NAMESPACE, "tasks", "kill", "-s", "SIGTERM", PAUSE_ID)
            out, err = pause.communicate(timeout=30)
        if pause.returncode != 0:
            raise SmokeFailure(f"pause exited {pause.returncode} on SIGTERM: {out}{err}")
        print(f"pause: pid {pause_pid} {' '.join(uid_line[0].split()[:2])}, exited 0 on SIGTERM")

        # Leave one task running so the teardown has something to remove.
        ctrd.ctr(
            NAMESPACE, "run", "-d", "--net-host", "--fifo-dir", str(fifo_dir),
            *ctrd.runc_flags(), images.PROBE_IMAGE, "smoke-left-running",
        )  # fmt: skip
        ok = True
    finally:
        cgroups_before = [
            h / "k8s.io" for h in containerd.cgroup_v1_hierarchies() if (h / "k8s.io").exists()
        ]
        mounts_before = containerd.mounts_under([base])
        with timed(t, "teardown (tasks, containerd, shims, mounts, cgroups)"):
            shims_before = ctrd.shim_pids()
            ctrd.stop(namespaces=[NAMESPACE, "default"])
        left_shims = [p for p in shims_before if containerd.proc_exe(p) is not None]
        left_mounts = containerd.mounts_under([base])
        left_cgroups = [
            h / "k8s.io" for h in containerd.cgroup_v1_hierarchies() if (h / "k8s.io").exists()
        ]
        if not keep:
            containerd.remove_state(layout)
        created_run = Path("/run/containerd").exists() and not run_containerd_before
        print(
            f"teardown: containerd alive={ctrd.alive()}; shims {len(shims_before)} -> "
            f"{left_shims}; mounts {len(mounts_before)} -> {[str(m) for m in left_mounts]}; "
            f"k8s.io cgroups {len(cgroups_before)} -> {len(left_cgroups)}; "
            f"base removed={not base.exists()} "
            f"/run/containerd created={created_run}"
        )

    print("\nmeasurement\tseconds")
    for name, seconds in t.items():
        print(f"{name}\t{seconds:.3f}")
    for name, size in sizes.items():
        print(f"image {name}\t{size / 1e6:.2f} MB")
    if left_shims or left_mounts or ctrd.alive():
        print("FAILED: teardown left something behind", file=sys.stderr)
        return 1
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.cluster.runtime_smoke")
    parser.add_argument("--keep", action="store_true", help="keep the temp base dir")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    configure(args.log_level)
    try:
        return smoke(args.keep)
    except (SmokeFailure, containerd.ContainerdError, images.ImageError) as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
