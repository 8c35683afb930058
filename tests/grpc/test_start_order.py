"""The node plugin's start: every hold is rebuilt before either API serves (issue 21).

The real ``dradriver-kubeletplugin`` Plugin, built from its command line, starts with its
ledger lost and one claim's CDI spec left (claim e on dev-3); the kubelet's pod-resources
API (a fake gRPC server over a unix socket, as the kubelet serves it) reports a
device-plugin container using dev-1 and a pod using DRA claim ``default/c`` on dev-2,
whose spec is lost too; the apiserver (a scripted HTTP endpoint over a socket) answers
the reads of both claims. The start of the DRA server and of the device-plugin shim are
hooked: at that moment the ledger must already hold all three, or a lost ledger and a
lost spec bring back a device-plugin double hand-out (finding 7).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from dradriver.deviceplugin.server import DevicePluginError
from dradriver.devices.config import parse_config
from dradriver.host.cdi import CDIDevice
from dradriver.host.containeredits import ContainerEdits
from dradriver.host.state.schema import ClaimDevice, DeviceBusy
from dradriver.kubeletapi.gen import podresources_v1_pb2_grpc as pr_grpc
from kubeletplugin.main import Plugin, build_parser
from tests.fakes.claims import allocated_claim, claim_uid, result
from tests.fakes.httpapiserver import ScriptedHTTPAPIServer
from tests.grpc.test_deviceplugin import DRIVER, NODE, RESOURCE, FakePodResources, config_text

WAIT = 10.0


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


class StartWatch:
    """Records what the ledger holds when each API starts serving."""

    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin
        self.seen: dict[str, tuple[list[str], list[str]]] = {}
        self.both = asyncio.Event()

    def hook(self, name: str) -> Any:
        async def start() -> None:
            ledger = self.plugin.ledger
            plugin_held = sorted(r.device for h in ledger.plugin_holds() for r in h.devices)
            claims = sorted(f"{c.uid} {d.device}" for c in ledger.claims() for d in c.devices)
            self.seen[name] = (plugin_held, claims)
            if len(self.seen) == 2:
                self.both.set()

        return start


async def never() -> None:
    await asyncio.Event().wait()


async def nothing() -> None:
    return None


def test_holds_from_pod_resources_and_the_api_exist_before_either_api_serves(
    sock_dir: Path,
) -> None:
    async def main() -> None:
        root = sock_dir
        (root / "config.yaml").write_text(config_text(root, "shared"))
        api = ScriptedHTTPAPIServer()
        await api.start()
        uid, spec_uid = claim_uid("default", "c"), claim_uid("default", "e")
        # Read in this order: claim e (its spec survived) at recovery, then claim c.
        api.lists = [
            json.dumps(allocated_claim(n, [result(d, driver=DRIVER)], uid=u)).encode()
            for n, d, u in (("e", "dev-3", spec_uid), ("c", "dev-2", uid))
        ]
        args = build_parser().parse_args(
            [
                "--node-name", NODE,
                "--kubeconfig", str(kubeconfig(root / "kubeconfig", api.url)),
                "--config", str(root / "config.yaml"),
                "--kubelet-root", str(root / "kubelet"),
                "--device-plugin-dir", str(root / "device-plugins"),
                "--pod-resources-socket", str(root / "pr.sock"),
                "--cdi-dir", str(root / "cdi"),
                "--state-dir", str(root / "state"),
                "--http-address", "127.0.0.1:0",
            ]
        )  # fmt: skip
        plugin = Plugin(args, parse_config((root / "config.yaml").read_text()))
        # Only the CDI spec of claim e survived (what a prepare wrote, naming its claim).
        edits = ContainerEdits(env={"DRADRIVER_CLAIM": "default/e"})
        plugin.driver.store.cdi.write_claim(spec_uid, [CDIDevice("dev-3", edits)])
        fake = FakePodResources()
        fake.containers = [("legacy", "dp-pod", "main", RESOURCE, ["dev-1"])]
        cdi_id = plugin.driver.store.cdi.cdi_id(uid, "dev-2")
        fake.claims = [
            ("default", "dra-pod", "main", "default", "c", [(DRIVER, NODE, "dev-2", cdi_id)])
        ]
        server = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(fake, server)
        server.add_insecure_port(f"unix://{root / 'pr.sock'}")
        await server.start()
        watch = StartWatch(plugin)
        # Both APIs start serving here; what they serve is tested elsewhere.
        plugin.helper.start = watch.hook("dra")  # type: ignore[method-assign]
        plugin.helper.stop = nothing  # type: ignore[method-assign]
        plugin._probe_slice_features = nothing  # type: ignore[method-assign]
        plugin._health_loop = never  # type: ignore[method-assign]
        choose_forms = plugin._choose_forms

        async def choose_and_hook(missing: Any) -> dict[str, str]:
            said = await choose_forms(missing)  # creates the shim (its config is decided here)
            assert plugin.shim is not None
            plugin.shim.start = watch.hook("device-plugin")  # type: ignore[method-assign]
            plugin.shim.stop = nothing  # type: ignore[method-assign]
            return said

        plugin._choose_forms = choose_and_hook  # type: ignore[method-assign]
        plugin.driver.confirm_claims_later = never  # type: ignore[assignment]
        stop = asyncio.Event()
        task = asyncio.create_task(plugin.run(stop))
        try:
            await asyncio.wait_for(watch.both.wait(), WAIT)
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT)
            await server.stop(grace=None)
            await api.stop()
        expected = (["dev-1"], sorted([f"{uid} dev-2", f"{spec_uid} dev-3"]))
        assert watch.seen == {"dra": expected, "device-plugin": expected}
        # The claim's spec was written again and its devices are held: neither the shim
        # nor another DRA claim gets dev-2.
        assert plugin.driver.store.cdi.read_claim(uid) is not None
        assert plugin.shim is not None
        with pytest.raises(DevicePluginError, match="default/c"):
            plugin.shim.allocate(RESOURCE, ["dev-2"])
        with pytest.raises(DeviceBusy):
            plugin.ledger.begin_prepare("u2", "ns", "d", [ClaimDevice(pool=NODE, device="dev-2")])

    asyncio.run(main())
