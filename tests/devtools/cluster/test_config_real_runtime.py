"""The local cluster's real-runtime parts that need no running runtime: node layout,
containerd and CNI configuration, the CRI wire codec, the probe report parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from devtools.cluster import containerd, cri
from devtools.cluster.config import Layout, kubelet_config, parse_runtime
from devtools.cluster.local import ClusterState, runtime_component
from devtools.cluster.probe import parse_report

# ----- node layout ------------------------------------------------------------------


def test_real_runtime_gives_node_1_its_own_containerd_and_leaves_node_2_fake(
    tmp_path: Path,
) -> None:
    # The default state dir is this short; pytest's tmp_path is too long for sockets.
    layout = Layout(state_dir=Path("/root/.local/state/dradriver/cluster"), nodes=2, runtime="real")
    one, two = layout.all_nodes()
    assert one.runtime == "real" and one.containerd is not None
    assert one.containerd.base.is_relative_to(layout.state_dir)
    assert one.cri_socket == one.containerd.address
    assert runtime_component(one) == "containerd"
    assert two.runtime == "fake" and two.containerd is None
    assert runtime_component(two) == "fakecri-node-2"
    one.containerd.check()  # socket paths and the shim dir fit their limits
    cfg = kubelet_config(one, tmp_path / "ca", tmp_path / "c", tmp_path / "k", {})
    assert cfg["containerRuntimeEndpoint"] == f"unix://{one.containerd.address}"
    assert cfg["imageServiceEndpoint"] == cfg["containerRuntimeEndpoint"]
    assert cfg["podLogsDir"] == str(one.pod_logs)


def test_shim_socket_dir_is_short_and_differs_per_state_dir(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 80) / "cluster"
    a = Layout(state_dir=deep, runtime="real").node(1).containerd
    b = Layout(state_dir=tmp_path / "other", runtime="real").node(1).containerd
    assert a is not None and b is not None
    assert len(str(a.shim_sockets)) <= containerd.MAX_SHIM_SOCKET_DIR
    assert a.shim_sockets != b.shim_sockets


def test_fake_runtime_layout_is_unchanged(tmp_path: Path) -> None:
    node = Layout(state_dir=tmp_path).node(1)
    assert node.runtime == "fake" and node.containerd is None
    assert node.cri_socket == tmp_path / "run" / "fakecri-node-1.sock"
    assert runtime_component(node) == "fakecri"


def test_runtime_names_are_checked() -> None:
    assert parse_runtime("real") == "real"
    with pytest.raises(ValueError, match="fake, real"):
        parse_runtime("docker")


def test_a_state_file_from_before_the_runtime_option_means_fake(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(
        json.dumps(
            {
                "kubeconfig": "k",
                "node_name": "node-1",
                "kubelet_root": "/var/lib/kubelet",
                "feature_gates": {},
            }
        )
    )
    state = ClusterState.load(path)
    assert state is not None and state.runtime == "fake" and not state.created_cni_cache


# ----- containerd and CNI configuration ------------------------------------------


def test_containerd_reads_cdi_specs_from_the_plugins_dir_and_pulls_nothing(
    tmp_path: Path,
) -> None:
    node = Layout(state_dir=tmp_path, runtime="real").node(1)
    assert node.containerd is not None
    text = containerd.config_text(node.containerd, tmp_path / "bin", [node.cdi_dir])
    assert f'cdi_spec_dirs = ["{node.cdi_dir}"]' in text
    assert "restrict_oom_score_adj = true" in text
    assert f'socket_dir = "{node.containerd.shim_sockets}"' in text
    assert containerd.REFUSING_REGISTRY in containerd.hosts_toml()


def test_cni_conflist_is_tap_with_host_local_leases_under_the_cluster(tmp_path: Path) -> None:
    layout = containerd.Layout(tmp_path)
    path = containerd.write_cni_conflist(layout)
    conf = json.loads(path.read_text())
    assert path.parent == layout.cni_conf_dir and path.suffix == ".conflist"
    [plugin] = conf["plugins"]
    assert plugin["type"] == "tap"
    assert plugin["ipam"]["type"] == "host-local"
    assert Path(plugin["ipam"]["dataDir"]).is_relative_to(tmp_path)


# ----- the CRI wire codec, against protobuf's own encoder ---------------------------


def _cri_messages() -> dict[str, Any]:
    """``runtime.v1`` messages with the field numbers of cri-api's api.proto."""
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="cri_subset.proto", package="runtime.v1", syntax="proto3"
    )

    def message(name: str, *fields: tuple[str, int, int, str]) -> None:
        m = proto.message_type.add(name=name)
        for field_name, number, kind, type_name in fields:
            label = f.LABEL_REPEATED if field_name.endswith("items") else f.LABEL_OPTIONAL
            added = m.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                added.type_name = type_name

    message(
        "PodSandboxMetadata",
        ("name", 1, f.TYPE_STRING, ""),
        ("uid", 2, f.TYPE_STRING, ""),
        ("namespace", 3, f.TYPE_STRING, ""),
        ("attempt", 4, f.TYPE_UINT32, ""),
    )
    message(
        "PodSandbox",
        ("id", 1, f.TYPE_STRING, ""),
        ("metadata", 2, f.TYPE_MESSAGE, ".runtime.v1.PodSandboxMetadata"),
        ("state", 3, f.TYPE_INT32, ""),
        ("created_at", 4, f.TYPE_INT64, ""),
        ("runtime_handler", 7, f.TYPE_STRING, ""),
    )
    message("ListPodSandboxResponse", ("items", 1, f.TYPE_MESSAGE, ".runtime.v1.PodSandbox"))
    message("RemovePodSandboxRequest", ("pod_sandbox_id", 1, f.TYPE_STRING, ""))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"runtime.v1.{name}"))
        for name in ("ListPodSandboxResponse", "RemovePodSandboxRequest")
    }


def test_cri_codec_reads_what_protobuf_writes_and_writes_what_it_reads() -> None:
    messages = _cri_messages()
    answer = messages["ListPodSandboxResponse"]()
    ready = answer.items.add(id="a" * 64, state=0, created_at=1_700_000_000_000_000_000)
    ready.metadata.name, ready.metadata.uid, ready.metadata.namespace = "p", "uid-1", "ns"
    ready.metadata.attempt = 3
    gone = answer.items.add(id="b" * 64, state=1, runtime_handler="runc")
    gone.metadata.name = "q"
    items = cri.decode(answer.SerializeToString())[1]
    decoded = [cri.PodSandbox.decode(cri.decode(i)) for i in items if isinstance(i, bytes)]
    assert decoded == [
        cri.PodSandbox(id="a" * 64, name="p", namespace="ns", uid="uid-1", ready=True),
        cri.PodSandbox(id="b" * 64, name="q", namespace="", uid="", ready=False),
    ]
    request = messages["RemovePodSandboxRequest"](pod_sandbox_id="c" * 200)
    assert cri.encode_string(1, "c" * 200) == request.SerializeToString()


def test_cri_codec_refuses_a_truncated_answer() -> None:
    with pytest.raises(cri.CRIError, match="truncated"):
        cri.decode(b"\x0a\x80")


# ----- probe report -----------------------------------------------------------------


def test_probe_report_is_parsed_with_its_escapes_up_to_ready() -> None:
    text = "\n".join(
        [
            "some other output",
            "probe start pid=1 ppid=0 uid=0 gid=0 hostname=p",
            "env A=x\\040y=z",
            "env DRADRIVER_CLAIM=ns/c",
            "path type=char rdev=1:3 mode=0666 uid=0 gid=0 name=/dev/dradriver/dev-0",
            "path type=symlink rdev=- mode=0777 uid=0 gid=0 name=/dev/fd target=/proc/self/fd",
            "mount id=1 parent=0 dev=0:1 root=/ point=/opt/my\\040dir options=ro,relatime "
            "fstype=ext4 source=/dev/sda super=rw",
            "probe ready paths=2 mounts=1",
            "env LATER=ignored",
        ]
    )
    report = parse_report(text)
    assert report.ready and report.start["hostname"] == "p"
    assert report.env == {"A": "x y=z", "DRADRIVER_CLAIM": "ns/c"}
    node = report.paths["/dev/dradriver/dev-0"]
    assert (node.type, node.rdev, node.mode) == ("char", "1:3", "0666")
    assert report.paths["/dev/fd"].target == "/proc/self/fd"
    mount = report.mount_at("/opt/my dir")
    assert mount is not None and mount.options == "ro,relatime"


def test_probe_report_without_ready_line_is_not_ready() -> None:
    assert not parse_report("probe start pid=1\nenv A=1\n").ready
