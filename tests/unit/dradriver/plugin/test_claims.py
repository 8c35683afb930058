"""The claim runner: a ClaimDriver sees each claim fetched (UID checked) and locked."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest

from dradriver.k8s.client import KubeClient
from dradriver.k8s.objects import Obj
from dradriver.metrics import Counter, Gauge, Histogram, Registry
from dradriver.plugin.claimlock import ClaimLocks
from dradriver.plugin.claims import ClaimMetrics, ClaimRunner
from dradriver.plugin.interface import ClaimRef, PreparedDevice, PrepareResult
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.claims import allocated_claim, claim_ref, result, store_claim
from tests.metricsample import sample_value

pytestmark = pytest.mark.unit


class Driver:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.holding = 0
        self.most = 0

    async def prepare(self, claim: ClaimRef, obj: Obj) -> PrepareResult:
        assert obj["metadata"]["uid"] == claim.uid
        self.holding += 1
        self.most = max(self.most, self.holding)
        await asyncio.sleep(0)  # let the other call of the same claim try to enter
        self.holding -= 1
        self.calls.append(("prepare", claim.uid))
        if claim.name == "bad":
            return PrepareResult(error=f"ResourceClaim {claim}: bad config")
        if claim.name == "bug":
            raise RuntimeError("a bug")
        return PrepareResult(devices=[PreparedDevice(("req",), "p", "d", ("x/y=z",))])

    async def unprepare(self, claim: ClaimRef) -> str:
        self.calls.append(("unprepare", claim.uid))
        return ""

    def handle_error(self, error: BaseException, context: str) -> None:
        raise AssertionError(context)


def metrics(r: Registry) -> ClaimMetrics:
    return ClaimMetrics(
        prepares=Counter("p", "p", registry=r),
        prepare_errors=Counter("pe", "pe", registry=r),
        prepare_seconds=Histogram("ps", "ps", buckets=(1.0,), registry=r),
        in_flight=Gauge("f", "f", registry=r),
        unprepares=Counter("u", "u", registry=r),
        unprepare_errors=Counter("ue", "ue", registry=r),
        unprepare_seconds=Histogram("us", "us", buckets=(1.0,), registry=r),
    )


def runner(
    tmp_path: Path, registry: Registry | None = None
) -> tuple[ClaimRunner, Driver, FakeAPIServer]:
    api, driver = FakeAPIServer(), Driver()
    locks = ClaimLocks(tmp_path / "locks")
    counted = metrics(registry or Registry())
    return ClaimRunner(cast(KubeClient, api), driver, locks, metrics=counted), driver, api


def test_each_claim_is_fetched_checked_and_answered_alone(tmp_path: Path) -> None:
    registry = Registry()
    run, driver, api = runner(tmp_path, registry)
    good = store_claim(api, allocated_claim("good", [result("dev-0")]))
    bad = store_claim(api, allocated_claim("bad", [result("dev-0")]))
    bug = store_claim(api, allocated_claim("bug", [result("dev-0")]))
    replaced = ClaimRef("default", "another-uid", "good")
    missing = ClaimRef("default", "u-missing", "missing")
    refs = [claim_ref(good), claim_ref(bad), claim_ref(bug), replaced, missing]
    out = asyncio.run(run.prepare_claims(refs))
    assert out[claim_ref(good).uid].devices and not out[claim_ref(good).uid].error
    assert out[claim_ref(bad).uid].error.endswith("bad config")
    assert out[claim_ref(bug).uid].error == "internal error: a bug"
    assert "was replaced" in out["another-uid"].error
    assert "does not exist" in out["u-missing"].error
    assert {uid for _, uid in driver.calls} == {claim_ref(c).uid for c in (good, bad, bug)}
    assert sample_value(registry, "p_total") == 1 and sample_value(registry, "pe_total") == 4


def test_one_claim_is_worked_on_by_one_call_at_a_time(tmp_path: Path) -> None:
    run, driver, api = runner(tmp_path)
    ref = claim_ref(store_claim(api, allocated_claim("c", [result("dev-0")])))
    asyncio.run(run.prepare_claims([ref, ref, ref]))
    assert driver.most == 1 and len(driver.calls) == 3
    assert run.locks.claims_in_use == 0


def test_an_invalid_reference_never_reaches_the_driver(tmp_path: Path) -> None:
    run, driver, _ = runner(tmp_path)
    bad = ClaimRef("default", "uid\n", "c")
    assert "is not a valid UID" in asyncio.run(run.prepare_claims([bad]))[bad.uid].error
    assert "is not a valid UID" in asyncio.run(run.unprepare_claims([bad]))[bad.uid]
    assert driver.calls == []
