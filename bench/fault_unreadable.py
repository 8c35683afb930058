"""Row (f3) of :mod:`bench.faults`: a claim nested too deep to decode, across a controller
restart (issue 21, finding 3: "unreadable means held").

Claim A is allocated by the controller; then, with the controller stopped, its
``status.devices[].data`` is given :data:`DEPTH` levels of nesting (the apiserver accepts
10,000; the controller's decoder cuts anything deeper than 128). The controller starts
again (a restart, an upgrade or a failover: nothing remembered) and two more claims compete
for the pool's two devices, one of which A holds. Promised: no device in two allocations
(before the rule, the fresh controller could not see A and gave its device away again),
and exactly one of the two claims allocated.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from devtools.cluster.wait import wait_until
from dradriver.k8s.objects import Obj
from dradriver.k8s.paths import RESOURCE_V1, path_for

if TYPE_CHECKING:
    from bench.faults import Row
    from devtools.cluster.api import AdminAPI
    from devtools.harness.controller import ControllerProcess

DEPTH = 300  # more than the decoder's 128; json.dumps still writes it
PREFIX = "deep-"
POOL = "unreadable"
SETTLE_TIMEOUT = 180.0
START_TIMEOUT = 90.0


def unreadable_slice(driver: str) -> Obj:
    devices = [{"name": f"u-{i}", "attributes": {"group": {"string": "u"}}} for i in range(2)]
    return {
        "metadata": {"name": "unreadable-pool"},
        "spec": {
            "driver": driver,
            "allNodes": True,
            "pool": {"name": POOL, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def nested(depth: int) -> Obj:
    """A JSON object ``depth`` levels deep."""
    value: Obj = {}
    for _ in range(depth - 1):
        value = {"x": value}
    return value


def too_deep_claim(api: AdminAPI, namespace: str, controller: ControllerProcess) -> list[Row]:
    # bench.faults imports this module: its helpers are imported when the row runs.
    from bench.faults import DRIVER, Row, allocations, attr, claim_settled, immediate_claim

    driver = DRIVER
    claims = path_for(RESOURCE_V1, "resourceclaims", namespace)
    api.create(path_for(RESOURCE_V1, "resourceslices"), unreadable_slice(driver))
    selector = f'{attr("group")} == "u"'
    api.create(claims, immediate_claim(f"{PREFIX}a", selector))
    wait_until(
        "the controller allocating claim A",
        lambda: bool(allocations(api, namespace, PREFIX).get(f"{PREFIX}a")),
        SETTLE_TIMEOUT,
    )
    claim_a = api.get(f"{claims}/{PREFIX}a")
    [held] = claim_a["status"]["allocation"]["devices"]["results"]
    controller.stop()
    device = {k: held[k] for k in ("driver", "pool", "device")}
    api.merge_patch(
        f"{claims}/{PREFIX}a/status",
        {"status": {"devices": [{**device, "data": nested(DEPTH)}]}},
    )
    controller.start()  # fresh: nothing of A remembered
    controller.wait_ready(START_TIMEOUT)
    for name in ("b", "c"):
        api.create(claims, immediate_claim(f"{PREFIX}{name}", selector))
    wait_until(
        "claims B and C settled (allocated, or told why not)",
        lambda: all(claim_settled(api, namespace, f"{PREFIX}{n}") for n in ("b", "c")),
        SETTLE_TIMEOUT,
    )
    got = allocations(api, namespace, PREFIX)
    doubled = sum(1 for n in Counter(d for ds in got.values() for d in ds).values() if n > 1)
    allocated = sum(1 for n in ("b", "c") if got.get(f"{PREFIX}{n}"))
    fault = f"(f3) controller restart, an allocated claim nested {DEPTH} levels deep"
    return [
        Row(fault, 1, "devices in two allocations", str(doubled), "0"),
        Row(fault, 1, "competing claims allocated (one device free)", f"{allocated}/2", "1/2"),
    ]
