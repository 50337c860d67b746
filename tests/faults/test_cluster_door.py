"""The cluster's front door over a real node door (``fitevict serve`` in its own process): a node's 400, the
query's fault, reaches the client as a 400 naming the node, where the door answered an empty list.

The fleet (Ray's view of the nodes) is a record pointing at the real node door: the seam the cluster's own tests
use (tests/cluster/test_door.py); the node door and the HTTP between them are real.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from _frontdoor import FrontDoor, front_door
from faultrows import FaultSeen
from fitevict.cluster.front import ClusterDoor
from fitevict.config import load_config

pytestmark = pytest.mark.e2e
NODE = "cccc3333" + "0" * 48


class OneNode:
    """The fleet: one routable node, the real door at ``url``."""

    def __init__(self, url: str) -> None:
        self.url = url

    def snapshot(self) -> list[Any]:
        return [SimpleNamespace(node=NODE, error=None)]

    def door(self, node: str) -> tuple[str, str] | None:
        return (self.url, "cluster-key") if node == NODE else None


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    tmp = tmp_path_factory.mktemp("node")
    (tmp / "models").mkdir()
    with front_door(tmp, "--models-dir", str(tmp / "models")) as fd:
        yield fd


def get(node: FrontDoor, path: str, **params: str) -> httpx.Response:
    door = ClusterDoor(load_config(None, env={}), OneNode(node.base_url))  # type: ignore[arg-type]

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=door), base_url="http://front") as c:
            return await c.get(path, params=params)
    return asyncio.run(go())


@pytest.mark.fault(
    fault="a node's 400 to a merged GET of the cluster's door (`/v1/models/history?limit=0`)",
    kind="collaborator with stand-ins")
def test_a_nodes_400_is_passed_through(node: FrontDoor, fault_seen: FaultSeen) -> None:
    direct = httpx.get(node.base_url + "/v1/models/history", params={"limit": "0"}, timeout=30)
    assert direct.status_code == 400
    r = get(node, "/v1/models/history", limit="0")
    assert fault_seen.client(r.status_code, "status, from the in-process cluster door") == 400, r.text
    err = r.json()["error"]
    assert err["message"] == direct.json()["error"]["message"]
    assert fault_seen.client(err["param"], "param") == "limit"
    assert fault_seen.client(err["node"], "error.node") == NODE and r.headers["x-fitevict-node"] == NODE
    ok = get(node, "/v1/models/history", limit="5")  # a query in range: the merged list, as before
    assert fault_seen.client(ok.status_code, "a query in range") == 200 and ok.json()["data"] == []
