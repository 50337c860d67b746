"""The cluster's front door without Ray: a fleet of records and node doors answered in memory (httpx's mock
transport). The admin routes go to the nodes they concern; /metrics, the dashboard and the residents name the
node of every row."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fitevict.cluster.facts import verdict_of
from fitevict.cluster.front import ClusterDoor
from fitevict.cluster.route import NodeFacts, NodeSeat, Verdict
from fitevict.config import load_config

FUTURE = time.time() + 3600  # facts that stay fresh for the test
N1, N2 = "aaaa1111" + "0" * 48, "bbbb2222" + "0" * 48


def facts(node: str, *seats: NodeSeat, budget: int) -> NodeFacts:
    held = sum(sum(s.bytes.values()) for s in seats)
    models = {"m": None, "m:sql": "m", "big": None}
    return NodeFacts(node, f"http://{node}", FUTURE, seats=seats, budget_bytes={"CPU": budget},
                     room_bytes={"CPU": budget - held}, models=models, names={k: k for k in models})


PLANS = {  # node -> model -> (action, free bytes after)
    N1: {"big": ("ram", 100), "m": ("hit", 700)},
    N2: {"big": ("ram", 1500), "m": ("ram", 1700)},
}


def plan_body(node: str, model: str) -> dict[str, Any]:
    action, free = PLANS[node][model]
    return {"model": model, "plan": {"action": action, "key": model, "reason": f"{action} on {node[:4]}",
                                     "evict": [], "free_bytes_after": {"CPU": free}, "wait_for": []},
            "budget": {"node": node}}


class Fleet:
    max_age_s = 5.0

    def __init__(self) -> None:
        self.facts = [facts(N1, NodeSeat("m", bytes={"CPU": 300}, credit=1.0), budget=1000), facts(N2, budget=2000)]
        self.lost: list[str] = []

    def snapshot(self) -> list[NodeFacts]:
        return self.facts

    def door(self, node: str) -> tuple[str, str]:
        return f"http://{node}", "cluster-key"

    async def verdicts(self, model: str, nodes: list[str], contract: dict | None) -> list[Verdict]:
        return [verdict_of(n, 200, plan_body(n, model)) for n in nodes]

    def poke(self) -> None:
        pass

    def mark_lost(self, node: str, why: str, *, stopping: bool = False) -> None:
        self.lost.append(node)

    def routable(self, node: str) -> bool:
        return node not in self.lost

    def rows(self, now: float) -> list[dict[str, Any]]:
        return [{"node": f.node, "url": f.url, "pid": 1, "routable": True, "lost_since": None, "why_lost": None,
                 "facts_age_s": 0.5, "residents": [s.key for s in f.seats], "budget_bytes": dict(f.budget_bytes),
                 "room_bytes": dict(f.room_bytes), "models": sorted(f.models)} for f in self.facts]


RESIDENT = {"key": "m", "state": "ready", "placement": "100% CPU", "in_flight": 0, "waiting": 0,
            "devices": {"CPU": {"planned_bytes": 300, "measured_bytes": 290, "predicted_bytes": 300}},
            "ctx": 4096, "last_used": None, "unload_at": None}


def node_door(refuse: set[str], calls: list[tuple[str, str, str]]):
    """Each node door's answers, by host; ``refuse``: the nodes whose load answers 507."""
    def handle(request: httpx.Request) -> httpx.Response:
        node, path = request.url.host, request.url.path
        calls.append((node, request.method, path))
        assert request.headers["authorization"] == "Bearer cluster-key"
        if path.endswith("/load"):
            if node in refuse:
                return httpx.Response(507, json={"error": {"message": "does not fit"}})
            return httpx.Response(200, json={"model": path.split("/")[3], "resident": RESIDENT})
        if path.endswith("/unload"):
            was = node == N1
            return httpx.Response(200, json={"model": "m", "unloaded": was, **({} if was else {"reason": "not resident"})})
        if path.endswith("/plan"):
            return httpx.Response(200, json=plan_body(node, path.split("/")[3]))
        if path == "/v1/models/residents":
            return httpx.Response(200, json={"object": "list", "data": [RESIDENT] if node == N1 else [],
                                             "waiting": {}})
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "fitevict": {}}, {"id": "big", "fitevict": {}}]})
        if path == "/v1/models/history":
            return httpx.Response(200, json={"data": [{"id": 1, "time": 5.0, "event": "load", "model": "m",
                                                       "seconds": 1.5, "strategy": "ram-only"}] if node == N1 else []})
        if path == "/v1/models/rescan":
            return httpx.Response(200, json={"models": 3, "added": ["new"] if node == N2 else [], "removed": []})
        if path == "/metrics":
            return httpx.Response(200, text='# HELP fitevict_budget_bytes b\n# TYPE fitevict_budget_bytes gauge\n'
                                             f'fitevict_budget_bytes{{device="CPU",source="limit"}} {len(node)}\n')
        return httpx.Response(404, json={"error": {"message": path}})
    return handle


def cluster(refuse: set[str] = frozenset(), **overrides: Any) -> tuple[ClusterDoor, list]:
    calls: list[tuple[str, str, str]] = []
    door = ClusterDoor(load_config(None, overrides=overrides), Fleet())  # type: ignore[arg-type]
    door.client = httpx.AsyncClient(transport=httpx.MockTransport(node_door(set(refuse), calls)))
    return door, calls


def call(door: ClusterDoor, method: str, path: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=door), base_url="http://front") as c:
            return await c.request(method, path, **kw)
    return asyncio.run(go())


def test_a_load_goes_where_it_fits_with_the_most_room_left_and_names_the_node() -> None:
    door, calls = cluster()
    r = call(door, "POST", "/v1/models/big/load")
    assert r.status_code == 200, r.text
    assert (r.json()["node"], r.json()["route"], r.headers["x-fitevict-node"]) == (N2, "load", N2)
    assert [c for c in calls if c[2].endswith("/load")] == [(N2, "POST", "/v1/models/big/load")]


def test_a_load_of_a_resident_model_goes_to_its_node() -> None:
    door, calls = cluster()
    r = call(door, "POST", "/v1/models/m/load", json={"fitevict": {}})
    assert (r.json()["node"], r.json()["route"]) == (N1, "hit")


def test_a_load_refused_by_a_node_goes_to_the_next_candidate() -> None:
    door, calls = cluster(refuse={N2})
    r = call(door, "POST", "/v1/models/big/load", params={"stream": "false"})
    assert r.json()["node"] == N1
    assert [c[0] for c in calls if c[2].endswith("/load")] == [N2, N1]


def test_an_unload_reaches_every_node_with_the_files_and_names_where_it_was_resident() -> None:
    door, calls = cluster()
    got = call(door, "POST", "/v1/models/m/unload").json()
    assert got["unloaded"] and got["unloaded_on"] == [N1]
    assert sorted(row["node"] for row in got["nodes"]) == [N1, N2]


def test_a_plan_is_every_nodes_dry_run_led_by_the_node_routing_picks() -> None:
    door, _calls = cluster()
    got = call(door, "POST", "/v1/models/big/plan").json()
    assert (got["node"], got["route"], got["plan"]["action"], got["budget"]) == (N2, "load", "ram", {"node": N2})
    assert {n["node"]: n["action"] for n in got["nodes"]} == {N1: "ram", N2: "ram"}
    hit = call(door, "POST", "/v1/models/m/plan").json()
    assert (hit["node"], hit["route"], hit["plan"]["action"]) == (N1, "hit", "hit")


def test_a_rescan_reaches_every_node() -> None:
    door, calls = cluster()
    got = call(door, "POST", "/v1/models/rescan").json()["data"]
    assert [(r["node"], r["status"], r["added"]) for r in got] == [(N1, 200, []), (N2, 200, ["new"])]


def test_the_admin_routes_want_an_admin_key() -> None:
    door, calls = cluster(**{"server.api_keys": ["user"], "server.admin_keys": ["admin"]})
    assert call(door, "POST", "/v1/models/big/load", headers={"authorization": "Bearer user"}).status_code == 403
    assert call(door, "POST", "/v1/models/m/unload").status_code == 401
    assert calls == []
    ok = call(door, "POST", "/v1/models/big/plan", headers={"authorization": "Bearer admin"})
    assert ok.status_code == 200


def test_an_unknown_model_is_a_404_before_any_node_is_asked() -> None:
    door, calls = cluster()
    r = call(door, "POST", "/v1/models/nope/load")
    assert (r.status_code, r.json()["error"]["code"], calls) == (404, "model_not_found", [])


def test_metrics_merge_the_nodes_with_a_node_label() -> None:
    door, _calls = cluster()
    door.routed[N1, "hit"] = 3
    r = call(door, "GET", "/metrics")
    fams = {f.name: f for f in text_string_to_metric_families(r.text)}
    budget = {s.labels["node"]: s.value for s in fams["fitevict_budget_bytes"].samples}
    assert budget == {N1: len(N1), N2: len(N2)}
    assert {s.labels["node"]: s.value for s in fams["fitevict_cluster_node_routable"].samples} == {N1: 1, N2: 1}
    routed = [s for s in fams["fitevict_cluster_routed"].samples if s.name.endswith("_total")]
    assert [(s.labels["node"], s.labels["route"], s.value) for s in routed] == [(N1, "hit", 3)]


def test_the_dashboard_names_the_node_of_every_row() -> None:
    door, _calls = cluster(**{"server.admin_keys": ["admin"]})
    assert call(door, "GET", "/dashboard/live").status_code == 401
    html = call(door, "GET", "/dashboard/live", headers={"authorization": "Bearer admin"}).text
    resident = html.split('<tr class="resident" data-model="m">')[1].split("</tr>")[0]
    assert f'title="{N1}">{N1[:8]}<' in resident and 'data-act="unload"' in resident
    assert html.count('<tr class="cnode"') == 2 and f">{N1[:8]}<" in html.split("Timeline")[1]
    page = call(door, "GET", "/dashboard")
    assert page.status_code == 200 and 'data-src="/dashboard/live"' in page.text
    assert call(door, "GET", "/", follow_redirects=False).headers["location"] == "/dashboard"


def test_ps_shows_the_node_of_each_resident() -> None:
    from rich.console import Console

    from fitevict.cli.admin import ps_table

    out = Console(width=120, record=True)
    out.print(ps_table([{**RESIDENT, "node": N1}], time.time(), "http://front"))
    head, row = [line for line in out.export_text().splitlines() if line.strip() and "──" not in line][1:3]
    assert head.split()[0] == "node" and row.split()[:2] == [N1[:8], "m"]
    single = Console(width=120, record=True)
    single.print(ps_table([RESIDENT], time.time(), "http://one"))
    assert "node" not in single.export_text()


@pytest.mark.parametrize("body, want", [(b"", None), (b"{}", None), (b'{"ctx": 512}', {"ctx": 512}),
                                        (b'{"fitevict": {"ctx": 256}}', {"ctx": 256})])
def test_an_admin_body_is_a_load_contract(body: bytes, want: dict | None) -> None:
    from fitevict.cluster.admin import contract_of

    assert contract_of(body) == want


def test_metrics_text_keeps_each_family_once() -> None:
    from fitevict.cluster.metrics import merged

    a = "# HELP x_total c\n# TYPE x_total counter\nx_total{m=\"1\"} 1.0\n# HELP y g\n# TYPE y gauge\ny 2.0\n"
    text = merged({"n2": a, "n1": a})
    assert text.count("# TYPE x_total") == 1 and text.count("# TYPE y") == 1
    assert text.splitlines()[2:4] == ['x_total{node="n1",m="1"} 1.0', 'x_total{node="n2",m="1"} 1.0']
    assert json.dumps([f.name for f in text_string_to_metric_families(text)]) == '["x", "y"]'


def test_an_alias_routes_to_its_model_and_the_node_is_sent_the_key() -> None:
    """The config's [aliases] at the cluster's door: routed by the model it names, relayed naming the model's key
    (the node's door need not know the alias); an unknown name on Anthropic's route is its 404, in its shape."""
    seen: list[tuple[str, str, str]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.url.path, json.loads(request.read())["model"]))
        return httpx.Response(200, headers={"content-type": "application/json"}, stream=httpx.ByteStream(b"{}"))

    door = ClusterDoor(load_config(None, overrides={"aliases": {"claude-*": "m"}}), Fleet())  # type: ignore[arg-type]
    door.client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    body = {"model": "claude-haiku-4-5", "max_tokens": 1, "messages": []}
    r = call(door, "POST", "/v1/messages", json=body)
    assert r.status_code == 200 and seen == [(N1, "/v1/messages", "m")], r.text
    unknown = call(door, "POST", "/v1/messages", json={**body, "model": "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
    assert unknown.json()["type"] == "error"


class _Body(httpx.AsyncByteStream):
    """A node door's streamed body, as it comes over a connection: ``chunks``, then the connection reset when
    ``cut``."""

    def __init__(self, *chunks: bytes, cut: bool = False) -> None:
        self.chunks, self.cut = chunks, cut

    async def __aiter__(self):
        for chunk in self.chunks:
            yield chunk
        if self.cut:
            raise httpx.ReadError("connection reset by peer")


def test_a_stream_lost_before_its_first_byte_goes_to_the_next_node() -> None:
    calls: list[tuple[str, str, str]] = []
    others = node_door(set(), calls)

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/chat/completions":
            return others(request)
        calls.append((request.url.host, request.method, request.url.path))
        sse = {"content-type": "text/event-stream"}
        if request.url.host == N2:  # the rule's first choice for big (the most room left after the load): its
            return httpx.Response(200, headers=sse, stream=_Body(cut=True))  # headers, then lost before a byte
        return httpx.Response(200, headers=sse, stream=_Body(b'data: {"n": 1}\n\n', b"data: [DONE]\n\n"))

    fleet = Fleet()
    door = ClusterDoor(load_config(None), fleet)  # type: ignore[arg-type]
    door.client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    r = call(door, "POST", "/v1/chat/completions", json={"model": "big", "stream": True, "messages": []})
    assert r.status_code == 200, r.text
    assert (r.headers["x-fitevict-node"], r.text) == (N1, 'data: {"n": 1}\n\ndata: [DONE]\n\n')
    assert [c[0] for c in calls if c[2] == "/v1/chat/completions"] == [N2, N1] and fleet.lost == [N2]
