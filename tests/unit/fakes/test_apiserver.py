"""The fake apiserver keeps the rules the unit tests rely on."""

from __future__ import annotations

import asyncio

import pytest

from dradriver.k8s.errors import KubeAPIError, is_conflict
from tests.fakes.apiserver import FakeAPIServer

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def test_create_get_list_conflict_and_faults() -> None:
    api = FakeAPIServer()

    async def scenario() -> None:
        created = await api.create(SLICES, {"metadata": {"name": "a"}, "spec": {"x": 1}})
        assert created["metadata"]["generation"] == 1
        assert (await api.get(f"{SLICES}/a"))["spec"] == {"x": 1}
        assert [o["metadata"]["name"] for o in (await api.list(SLICES))["items"]] == ["a"]
        assert await api.get_or_none(f"{SLICES}/b") is None
        stale = {"metadata": {"name": "a", "resourceVersion": "0"}, "spec": {"x": 2}}
        with pytest.raises(KubeAPIError) as e:
            await api.replace(f"{SLICES}/a", stale)
        assert e.value.status == 409
        current = await api.get(f"{SLICES}/a")
        current["spec"] = {"x": 2}
        assert (await api.replace(f"{SLICES}/a", current))["metadata"]["generation"] == 2
        api.fail("GET", SLICES, 503, times=1)
        with pytest.raises(KubeAPIError) as e:
            await api.get(f"{SLICES}/a")
        assert e.value.status == 503
        assert (await api.get(f"{SLICES}/a"))["spec"] == {"x": 2}

    asyncio.run(scenario())


def test_deletes_take_a_resource_version_and_honour_preconditions() -> None:
    api = FakeAPIServer()
    path = f"{SLICES}/a"

    async def scenario() -> None:
        created = await api.create(SLICES, {"metadata": {"name": "a"}})
        assert api.resource_version == int(created["metadata"]["resourceVersion"])
        stale = {"preconditions": {"resourceVersion": "0"}}
        with pytest.raises(KubeAPIError) as e:
            await api.request("DELETE", path, stale)
        assert is_conflict(e.value) and api.stored(path) is not None
        current = {"preconditions": {"resourceVersion": created["metadata"]["resourceVersion"]}}
        await api.request("DELETE", path, current)
        assert api.stored(path) is None
        # The deletion is a revision of its own, after the object's last write.
        assert api.resource_version > int(created["metadata"]["resourceVersion"])
        assert [(w.method, w.body) for w in api.history] == [
            ("POST", {"metadata": {"name": "a"}}),
            ("DELETE", stale),
            ("DELETE", current),
        ]

    asyncio.run(scenario())
