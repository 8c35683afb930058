"""The fake apiserver keeps the rules the unit tests rely on."""

from __future__ import annotations

import asyncio

import pytest

from dradriver.k8s.errors import KubeAPIError
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
