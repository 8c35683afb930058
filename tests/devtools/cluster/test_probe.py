"""The reader of the probe's ``use`` records (runtimebin/cmd/probe, ``probe use``)."""

from __future__ import annotations

from devtools.cluster.probe import Use, parse_uses


def test_use_records_are_read_in_order_with_their_steps_unescaped() -> None:
    text = "\n".join(
        [
            "earlier output",
            "probe start pid=1 ppid=0 uid=0 gid=0 hostname=p",
            "use kind=kvm path=/dev/kvm open=ok api=12 vm=created",
            "use kind=tun path=/dev/net/tun open=ok ifname=dratun1 sysfs=present",
            "use kind=loop path=/dev/loop3 open=ok attached=EBUSY",
            "use kind=x path=/dev/x error=unknown\\040kind",
            "probe ready uses=4",
            "probe exit signal=terminated",
        ]
    )
    uses = parse_uses(text)
    assert uses is not None
    kvm, tun, loop, unknown = uses
    assert (kvm.kind, kvm.path, kvm.opened, kvm.get("api"), kvm.get("vm")) == (
        "kvm",
        "/dev/kvm",
        True,
        "12",
        "created",
    )
    assert tun.steps == {"open": "ok", "ifname": "dratun1", "sysfs": "present"}
    assert loop.get("attached") == "EBUSY" and loop.get("readback") == ""
    assert unknown.get("error") == "unknown kind"
    assert kvm.text() == "use kind=kvm path=/dev/kvm open=ok api=12 vm=created"


def test_a_failed_open_is_its_errno_name() -> None:
    uses = parse_uses(
        "probe start pid=1\nuse kind=fuse path=/dev/fuse open=EPERM\nprobe ready uses=1\n"
    )
    assert uses == [Use("fuse", "/dev/fuse", {"open": "EPERM"})]
    assert not uses[0].opened


def test_nothing_until_every_record_and_the_ready_line_are_there() -> None:
    assert parse_uses("") is None
    assert parse_uses("probe start pid=1\nuse kind=fuse path=/dev/fuse open=ok\n") is None
    # A ready line that does not count the records read is not this run's.
    assert parse_uses("probe start pid=1\nprobe ready uses=2\n") is None
    # A restarted container's log starts again at its own start line.
    again = "probe start pid=1\nuse kind=fuse path=/dev/fuse open=ok\nprobe start pid=1\n"
    assert parse_uses(again + "use kind=fuse path=/dev/fuse open=EPERM\nprobe ready uses=1\n") == [
        Use("fuse", "/dev/fuse", {"open": "EPERM"})
    ]
