"""The fleet's cluster key, without Ray: a front door with a key of its own offers it to the agents it starts,
and leaves out a node whose door admits another."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import pytest

from fitevict.cluster import fleet as fleet_mod
from fitevict.cluster.fleet import Fleet


class Remote:
    def __init__(self, value: Any) -> None:
        self.value = value

    def remote(self, *args: Any) -> Any:
        async def answer() -> Any:
            return self.value
        return answer()


class Agent:
    def __init__(self, key: str) -> None:
        self.door = Remote({"node": "n1", "url": "http://n1", "key": key, "pid": 7})
        self.facts = Remote({"node": "n1", "url": "http://n1", "taken_at": time.time(), "budget_bytes": {"CPU": 1},
                             "residents": {"data": []}, "models": {"data": [{"id": "m"}]}})


@pytest.fixture
def started(monkeypatch) -> list[dict]:
    calls: list[dict] = []

    def ensure_agent(node: dict, options: dict, env: dict | None = None) -> Agent:
        calls.append({**options, **({"env": env} if env else {})})
        return Agent(node["agent_key"])

    monkeypatch.setattr(fleet_mod, "ensure_agent", ensure_agent)
    return calls


def join(fleet: Fleet, agent_key: str) -> None:
    asyncio.run(fleet._join({"NodeID": "n1", "NodeManagerAddress": "127.0.0.1", "agent_key": agent_key}))


def test_a_front_door_offers_its_key_and_uses_the_nodes_that_admit_it(started: list[dict]) -> None:
    f = Fleet(key="ck")
    join(f, "ck")
    assert started == [{"key": "ck"}]
    assert list(f.members) == ["n1"] and f.door("n1") == ("http://n1", "ck")
    assert [r["routable"] for r in f.rows(time.time())] == [True]


def test_a_node_whose_door_admits_another_key_stays_out_and_says_why(started: list[dict]) -> None:
    f = Fleet(key="ck")
    join(f, "random-from-another-front-door")
    assert f.members == {} and f.snapshot() == []
    (row,) = f.rows(time.time())
    assert row["node"] == "n1" and not row["routable"] and "another cluster key" in row["why_lost"]


def test_without_a_key_a_front_door_uses_the_agents_key(started: list[dict]) -> None:
    f = Fleet()
    join(f, "whatever-the-agent-has")
    assert started == [{}] and f.door("n1") == ("http://n1", "whatever-the-agent-has")


def test_the_agents_a_front_door_starts_wait_for_an_unreachable_gcs_as_long_as_it_does(started: list[dict]) -> None:
    f = Fleet(gcs_reconnect_s=900)
    join(f, "k")
    assert started == [{"env": {"RAY_gcs_rpc_server_reconnect_timeout_s": "900"}}]
    assert f.membership.row(time.time())["gcs_reconnect_s"] == 900


def test_cluster_stop_keeps_rays_own_notices_off_stdout(monkeypatch, capsys) -> None:
    # Ray's driver prints the cluster's notices (a node marked dead) to stdout whatever log_to_driver says; the
    # answer of `cluster stop --json` is read from stdout, so they must go to stderr
    import types

    from fitevict.cluster import stop as stop_mod

    class _Ref:
        def __init__(self, value: int) -> None:
            self.value = value

    class _Agent:
        class stop:  # noqa: N801 - the shape of a Ray actor method
            @staticmethod
            def remote() -> _Ref:
                return _Ref(0)

    exc = types.SimpleNamespace(ActorDiedError=type("ActorDiedError", (Exception,), {}),
                                ActorUnavailableError=type("ActorUnavailableError", (Exception,), {}))
    fake = types.SimpleNamespace(
        init=lambda **_: print("\x1b[33m(raylet)\x1b[0m The node with node id: n2 has been marked dead"),
        nodes=lambda: [{"NodeID": "n1", "Alive": True}],
        util=types.SimpleNamespace(list_named_actors=lambda: [fleet_mod.AGENT_PREFIX + "n1"]),
        _private=types.SimpleNamespace(state=types.SimpleNamespace(actors=dict)),
        get_actor=lambda name, namespace: _Agent(), get=lambda ref, timeout: ref.value, kill=lambda *a, **k: None,
        shutdown=lambda: print("shutting down"), exceptions=exc)
    monkeypatch.setitem(sys.modules, "ray", fake)
    rows = stop_mod.stop_agents("auto")
    out = capsys.readouterr()
    assert rows == [{"node": "n1", "door_exit": 0}]
    assert out.out == "" and "marked dead" in out.err and "shutting down" in out.err


def _agent(node: str, state: str, reason: str, ended_at: float, message: str = "") -> dict:
    return {"name": fleet_mod.AGENT_PREFIX + node, "state": state, "reason": reason, "message": message,
            "ended_at": ended_at}


def test_cluster_stop_lists_the_agents_that_ended_since_the_last_stop() -> None:
    from fitevict.cluster.stop import ended_agents

    table = [
        _agent("old", "DEAD", "NODE_DIED", 10.0),  # ended before the last stop: that stop listed it
        _agent("k1", "DEAD", "RAY_KILL", 20.0),  # the last stop killed it
        _agent("n1", "DEAD", "NODE_DIED", 30.0, "the node was terminated\nmore"),
        _agent("n1", "DEAD", "WORKER_DIED", 25.0),
        _agent("n2", "DEAD", "WORKER_DIED", 40.0),  # its node's new agent runs: that one is asked, not this
        _agent("n2", "ALIVE", "", 0.0),
        _agent("n3", "ALIVE", "", 0.0),
        {"name": "another-actor", "state": "DEAD", "reason": "NODE_DIED", "message": "", "ended_at": 50.0},
    ]
    rows = ended_agents(table, {fleet_mod.AGENT_PREFIX + "n2", fleet_mod.AGENT_PREFIX + "n3"})
    assert [r["node"] for r in rows] == ["n1"]
    assert "NODE_DIED: the node was terminated" in rows[0]["gone"] and "more" not in rows[0]["gone"]
    assert ended_agents([_agent("n1", "DEAD", "NODE_DIED", 5.0)], set())[0]["node"] == "n1"  # no stop before
