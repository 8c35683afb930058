"""The controller serves admission reviews and probes, and renews its Lease, while a
pathological claim is being allocated: the HTTP servers run on a loop in a thread of
their own, the search in a child process, the Lease on the main loop."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from controller.app import ControllerApp, Options
from controller.claims.worker import AllocationWorker
from controller.serving import ServingThread
from devtools.cluster.pki import CertificateAuthority, CertPair
from devtools.harness.webhook import issue_serving_cert
from dradriver.k8s.client import Connection, KubeClient
from dradriver.k8s.objects import Obj
from dradriver.runtime import LeaderElectionConfig, LeaderElector
from dradriver.webhook.registration import device_classes
from tests.unit.controller.claims.test_worker import Rig, immediate, pathological
from tests.unit.dradriver.runtime.test_leaderelection import (
    LEASE,
    RENEW,
    RETRY,
    LeaseStore,
    eventually,
)

DRIVER = "dradriver.dev"


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    CertificateAuthority(CertPair(tmp_path / "ca.crt", tmp_path / "ca.key"), "test-ca")
    return tmp_path


@pytest.fixture
def worker() -> Iterator[AllocationWorker]:
    shared = AllocationWorker()
    yield shared
    asyncio.run(shared.close())


def admission_review(uid: str) -> Obj:
    obj = {
        "apiVersion": f"{DRIVER}/v1alpha1",
        "kind": "DeviceClaimParameters",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"selectors": ['device.attributes["dradriver.dev"].model == "mock"']},
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": DRIVER, "version": "v1alpha1", "kind": "DeviceClaimParameters"},
            "namespace": "ns",
            "name": "p",
            "operation": "CREATE",
            "userInfo": {"username": "tester"},
            "object": obj,
        },
    }


def test_reviews_probes_and_lease_renewals_go_on_while_a_claim_is_searched(
    pki: Path, worker: AllocationWorker
) -> None:
    events: list[str] = []  # appended from the main loop and from the client's thread
    pair = issue_serving_cert(pki, pki / "serving")
    app = ControllerApp(
        Options(
            driver_name=DRIVER,
            leader_elect=False,
            http_address="127.0.0.1:0",
            webhook_address="127.0.0.1:0",
            webhook_cert=pair.cert,
            webhook_key=pair.key,
        ),
        KubeClient(Connection("https://127.0.0.1:1", ssl.create_default_context()), "test"),
    )
    tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))

    def review_and_probes() -> tuple[Obj, int, int]:
        """Runs in a thread: what the apiserver and the kubelet would send."""
        assert app.webhook is not None and app.http is not None
        with httpx.Client(verify=tls, timeout=60) as http:
            review = http.post(
                f"https://127.0.0.1:{app.webhook.port}/validate", json=admission_review("u-1")
            )
            events.append("review answered")
            healthz = http.get(f"http://127.0.0.1:{app.http.port}/healthz")
            readyz = http.get(f"https://127.0.0.1:{app.webhook.port}/readyz")
            events.append("probes answered")
        return review.json(), healthz.status_code, readyz.status_code

    async def scenario() -> None:
        await app.serving.start(app.servers())
        store = LeaseStore()
        lease_client = store.client()
        replace = lease_client.replace

        async def recorded_replace(path: str, body: Obj) -> Obj:
            written = await replace(path, body)
            events.append("lease renewed")
            return written

        lease_client.replace = recorded_replace  # type: ignore[method-assign]
        config = LeaderElectionConfig(
            "ns", "lease", "me", lease_duration=LEASE, renew_deadline=RENEW, retry_period=RETRY
        )

        async def lead() -> None:
            await asyncio.Event().wait()  # leads until cancelled

        elector = LeaderElector(lease_client, config, lead)
        electing = asyncio.create_task(elector.run())
        rig = Rig(worker, 3600.0, immediate(pathological()))  # far more than the test lasts

        async def reconcile() -> None:
            events.append("search started")
            try:
                await rig.rec("ns/patho")
            finally:
                events.append("search ended")

        try:
            await eventually("leading", lambda: elector.is_leader)
            searching = asyncio.create_task(reconcile())
            await eventually("the claim in the worker's hands", lambda: worker.stats.jobs == 1)
            client = asyncio.create_task(asyncio.to_thread(review_and_probes))

            def renewals() -> int:
                return events[events.index("search started") :].count("lease renewed")

            await eventually(
                "a review, probes and two renewals",
                lambda: client.done() and renewals() >= 2,
                deadline=60,
            )
            reply, healthz, readyz = await client
            assert reply["response"] == {"uid": "u-1", "allowed": True}
            assert healthz == 200
            assert readyz == 503  # answered (the informers were never started)
            assert not searching.done() and elector.is_leader
            events.append("checked")
            searching.cancel()
            with pytest.raises(asyncio.CancelledError):
                await searching
        finally:
            electing.cancel()
            await asyncio.gather(electing, return_exceptions=True)
            await app.serving.stop()

    asyncio.run(asyncio.wait_for(scenario(), 120))  # a guard against a hang only
    during = events[events.index("search started") : events.index("search ended")]
    assert "review answered" in during and "probes answered" in during
    assert during.count("lease renewed") >= 2
    assert during[-1] == "checked"


def claim_review(device_class: str, selector: str) -> Obj:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "r",
                        "exactly": {
                            "deviceClassName": device_class,
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-" + device_class,
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "namespace": "ns",
            "name": "c",
            "operation": "CREATE",
            "userInfo": {"username": "tester"},
            "object": claim,
        },
    }


# Ten chained replaces: cel-cpp would need memory beyond any node's to evaluate it.
COST_BOMB = (
    'device.attributes["dradriver.dev"].model' + '.replace("a", "aaaaaaaaaa")' * 10 + ' == ""'
)


@pytest.mark.parametrize("device_class", device_classes(DRIVER))
def test_controller_served_webhook_checks_selectors_of_every_class_of_the_driver(
    device_class: str,
) -> None:
    """The registration sends the webhook claims naming any of the driver's classes; the
    controller-served webhook must cost-check them all, as the standalone one does."""
    app = ControllerApp(
        Options(driver_name=DRIVER, leader_elect=False),
        KubeClient(Connection("https://127.0.0.1:1", ssl.create_default_context()), "test"),
    )
    with TestClient(app.webhook_app()) as client:
        reply = client.post("/validate", json=claim_review(device_class, COST_BOMB)).json()
        response = reply["response"]
        assert response["allowed"] is False, response
        assert "too complex: estimated cost" in response["status"]["message"]
        benign = client.post(
            "/validate",
            json=claim_review(device_class, 'device.attributes["dradriver.dev"].model == "m"'),
        ).json()
        assert benign["response"]["allowed"] is True


def test_serving_thread_stops_servers_started_before_one_that_fails(pki: Path) -> None:
    started: list[str] = []

    class Fine:
        async def start(self) -> None:
            started.append(threading.current_thread().name)

        async def stop(self) -> None:
            started.append("stopped")

    class Broken:
        async def start(self) -> None:
            raise OSError("address already in use")

        async def stop(self) -> None:  # pragma: no cover - never started
            raise AssertionError

    async def scenario() -> None:
        serving = ServingThread("servers-under-test")
        with pytest.raises(OSError, match="address already in use"):
            await serving.start([Fine(), Broken()])
        assert serving.loop is None

    asyncio.run(scenario())
    assert started == ["servers-under-test", "stopped"]
