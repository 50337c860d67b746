"""A node that stops or is lost, at the cluster's front door over a real ``Fleet``: its agents answered at the Ray
seam (``facts``, ``plan``), its node doors in memory (httpx's mock transport).

A node whose door says it is shutting down (503) leaves routing with its residents, and the request goes on to
the next node by the usual rule within the same request; a hit whose engine refused the connection is a residence
gone; a request in flight on a node that left routing, answered 502 by its door, is cut (502 ``node_lost``); 507
only when every live node refused on bytes, naming each."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from fitevict.cluster.fleet import Fleet, Member
from fitevict.cluster.front import ClusterDoor
from fitevict.config import load_config

A, B, C = "aaaa" + "0" * 52, "bbbb" + "0" * 52, "cccc" + "0" * 52
RESIDENT = {"key": "m", "state": "ready", "in_flight": 0, "waiting": 0,
            "devices": {"CPU": {"planned_bytes": 300}}, "greedy_dual": {"priority": 1.0, "floor": 0.0}}
MODELS = {"data": [{"id": "m", "fitevict": {}}]}
STOPPING = {"error": {"message": "m: fitevict is shutting down; retry later", "type": "server_busy", "code": "busy"}}
REFUSED = {"error": {"message": "m: the engine did not answer: cannot connect to the engine on 127.0.0.1:44539: "
                                "ConnectionRefusedError(111, 'Connection refused')", "type": "engine_error"}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


class Remote:
    """One method of a Ray actor: ``.remote(...)`` is awaitable, as an ObjectRef is."""

    def __init__(self, answer) -> None:
        self.answer = answer

    def remote(self, *args: Any) -> Any:
        async def got() -> Any:
            return self.answer(*args)
        return got()


class Agent:
    """A node agent at the Ray seam: its facts (``residents``: the seats its door reports) and its dry runs."""

    def __init__(self, node: str, residents: list[dict], free_after: int) -> None:
        self.node, self.residents = node, residents
        self.facts = Remote(lambda: {"node": node, "url": f"http://{node}", "taken_at": time.time(),
                                     "budget_bytes": {"CPU": 1000}, "models": MODELS,
                                     "residents": {"data": list(self.residents), "waiting": {}}})
        self.plan = Remote(lambda model, contract: {"node": node, "status": 200, "body": {"plan": {
            "action": "ram", "key": model, "reason": "fits", "evict": [], "free_bytes_after": {"CPU": free_after},
            "wait_for": []}}})


def fleet_of(agents: list[Agent]) -> Fleet:
    fleet = Fleet()
    for a in agents:
        fleet.members[a.node] = Member(a.node, a, f"http://{a.node}", "k")
    asyncio.run(fleet.refresh())
    return fleet


def answer(status: int, body: dict) -> httpx.Response:
    """A node door's answer as it comes over a connection (a stream, read by the front door)."""
    return httpx.Response(status, headers={"content-type": "application/json"},
                          stream=httpx.ByteStream(json.dumps(body).encode()))


def door_over(fleet: Fleet, answers: dict[str, tuple[int, dict]]) -> tuple[ClusterDoor, list[str]]:
    """The front door over ``fleet``; each node door answers chat with ``answers[node]`` (200 by default)."""
    calls: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        node = request.url.host
        calls.append(node)
        status, body = answers.get(node, (200, {"choices": [{"message": {"content": node}}]}))
        return answer(status, body)

    door = ClusterDoor(load_config(None), fleet)
    door.client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    return door, calls


def chat(door: ClusterDoor) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=door), base_url="http://front") as c:
            return await c.post("/v1/chat/completions", json=CHAT)
    return asyncio.run(go())


def residents(fleet: Fleet) -> dict[str, list[str]]:
    return {r["node"]: r["residents"] for r in fleet.rows(time.time())}


def test_a_door_shutting_down_takes_its_node_out_and_the_request_loads_on_the_next_node() -> None:
    fleet = fleet_of([Agent(A, [RESIDENT], 100), Agent(B, [], 500), Agent(C, [], 300)])
    door, calls = door_over(fleet, {A: (503, STOPPING)})
    r = chat(door)
    assert r.status_code == 200, r.text
    assert (r.headers["x-fitevict-node"], r.headers["x-fitevict-route"]) == (B, "load")  # the most room left
    assert calls == [A, B]
    rows = {r["node"]: r for r in fleet.rows(time.time())}
    assert not rows[A]["routable"] and rows[A]["residents"] == [] and "shutting down" in rows[A]["why_lost"]
    asyncio.run(fleet.refresh())  # its agent still reports the seat: a door on its way out stays out
    assert not fleet.routable(A) and residents(fleet)[A] == []
    again = chat(door)
    assert again.headers["x-fitevict-node"] == B and calls[2:] == [B]  # a request sent after it left: never there


def test_a_hit_whose_engine_refused_the_connection_is_served_elsewhere_and_the_seat_leaves_the_table() -> None:
    a = Agent(A, [RESIDENT], 100)
    fleet = fleet_of([a, Agent(B, [], 500)])
    door, calls = door_over(fleet, {A: (502, REFUSED)})
    r = chat(door)
    assert r.status_code == 200, r.text
    assert calls == [A, B] and r.headers["x-fitevict-node"] == B
    assert fleet.routable(A) and residents(fleet)[A] == []  # the node stays; that residence is gone
    a.residents = []  # its door saw the seat end
    asyncio.run(fleet.refresh())
    assert fleet.routable(A) and residents(fleet)[A] == []


def test_facts_asked_before_a_node_was_lost_do_not_bring_it_back() -> None:
    fleet = fleet_of([Agent(A, [RESIDENT], 100)])
    m = fleet.members[A]
    fleet.mark_lost(A, "its door refused the connection")
    m.changed_at = time.time() + 60  # as if this poll's facts call had been sent before the loss
    asyncio.run(fleet.refresh())
    assert not fleet.routable(A) and residents(fleet)[A] == []
    m.changed_at = 0.0  # facts asked after it: the node is back, with what its door reports now
    asyncio.run(fleet.refresh())
    assert fleet.routable(A) and residents(fleet)[A] == ["m"]


def test_a_request_in_flight_on_a_node_that_left_routing_is_cut_with_node_lost() -> None:
    fleet = fleet_of([Agent(A, [RESIDENT], 100), Agent(B, [], 500)])

    def handle(request: httpx.Request) -> httpx.Response:
        fleet.mark_lost(A, "facts not read within 2 s: ActorDiedError")  # while its door served this request
        return answer(502, {"error": {"message": "m: the engine broke off its answer", "type": "engine_error"}})

    door = ClusterDoor(load_config(None), fleet)
    door.client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    r = chat(door)
    err = r.json()["error"]
    assert (r.status_code, err["code"], err["node"], r.headers["x-should-retry"]) == (502, "node_lost", A, "true")


def test_507_only_when_every_live_node_refused_on_bytes_and_it_names_each() -> None:
    too_big = {"error": {"message": "needs 900 MiB", "type": "insufficient_memory"}}
    fleet = fleet_of([Agent(A, [], 100), Agent(B, [], 500), Agent(C, [], 300)])
    fleet.mark_lost(C, "facts not read within 2 s: ActorDiedError")
    door, calls = door_over(fleet, {A: (507, too_big), B: (507, too_big)})
    r = chat(door)
    assert r.status_code == 507, r.text
    reasons = {n["node"]: n["reason"] for n in r.json()["error"]["nodes"]}
    assert set(reasons) == {A, B, C} and "needs 900 MiB" in reasons[A] and "ActorDiedError" in reasons[C]
    door, calls = door_over(fleet, {A: (507, too_big), B: (503, STOPPING)})
    r = chat(door)
    assert (r.status_code, r.headers["x-should-retry"], r.json()["error"]["lost"]) == (503, "true", [B])
