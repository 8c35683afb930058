"""DRA claims the kubelet reports in use (pod-resources' dynamic_resources) as recovered
ledger entries: the claim UID from our CDI ids, this driver's devices only."""

from __future__ import annotations

from dradriver.kubeletapi.gen import podresources_v1_pb2 as pr
from kubeletplugin.inuse import claims_in_use, entry_of

KIND = "dradriver.dev/claim"
UID = "3f0b6c1e-3c1a-4f55-9b0e-6f1f1d2c9a10"


def resource(
    device: str, cdi: str, driver: str = "dradriver.dev", share: str | None = None
) -> pr.ClaimResource:
    out = pr.ClaimResource(
        cdi_devices=[pr.CDIDevice(name=cdi)],
        driver_name=driver,
        pool_name="node-1",
        device_name=device,
    )
    if share is not None:
        out.share_id = share
    return out


def pod(*claims: tuple[str, list[pr.ClaimResource]]) -> pr.PodResources:
    return pr.PodResources(
        name="p",
        namespace="ns",
        containers=[
            pr.ContainerResources(
                name=f"c{i}",
                dynamic_resources=[
                    pr.DynamicResource(claim_name=name, claim_namespace="ns", claim_resources=res)
                ],
            )
            for i, (name, res) in enumerate(claims)
        ],
    )


def test_a_claim_in_use_becomes_a_recovered_entry_named_by_its_cdi_ids() -> None:
    pods = [
        pod(
            (
                "a",
                [resource("dev-0", f"{KIND}={UID}-dev-0"), resource("x", "other=y", "other.dev")],
            ),
            ("a", [resource("gpu-1", f"{KIND}={UID}-gpu-1-s1", share="s1")]),  # another container
            ("theirs", [resource("d", "other=z", "other.dev")]),
        )
    ]
    [claim] = claims_in_use(pods, "dradriver.dev")  # the other driver's claim is not ours
    entry = entry_of(claim, KIND)
    assert entry is not None and entry.recovered and entry.state == "prepared"
    assert (entry.uid, entry.namespace, entry.name) == (UID, "ns", "a")
    assert [(d.device, d.share_id, d.exclusive) for d in entry.devices] == [
        ("dev-0", None, True),
        ("gpu-1", "s1", False),
    ]
    assert entry.cdi_ids == [f"{KIND}={UID}-dev-0", f"{KIND}={UID}-gpu-1-s1"]


def test_cdi_ids_that_name_no_one_claim_build_no_entry() -> None:
    for ids in (
        ["vendor/other=x-dev-0"],
        [f"{KIND}=dev-0"],
        [f"{KIND}={UID}-dev-0", f"{KIND}=b-dev-1"],
    ):
        devices = [resource(f"dev-{i}", cdi) for i, cdi in enumerate(ids)]
        [claim] = claims_in_use([pod(("a", devices))], "dradriver.dev")
        assert entry_of(claim, KIND) is None, ids
