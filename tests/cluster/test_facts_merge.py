"""A node's answers as routing records, and the nodes' views merged with a node per row. Pure."""

from __future__ import annotations

from fitevict.cluster import merge
from fitevict.cluster.facts import node_facts, verdict_of

RESIDENTS = {"object": "list", "waiting": {"m": 2}, "data": [{
    "key": "m", "state": "ready", "in_flight": 1, "waiting": 2,
    "devices": {"CPU": {"planned_bytes": 300}}, "greedy_dual": {"priority": 5.5, "floor": 1.5}}]}
MODELS = {"data": [{"id": "m", "fitevict": {"aliases": ["m-alias"]}},
                   {"id": "m:sql", "fitevict": {"base": "m"}}]}


def test_facts_carry_seats_room_queues_and_names() -> None:
    f = node_facts({"node": "n1", "url": "http://x", "taken_at": 10.0, "residents": RESIDENTS,
                    "budget_bytes": {"CPU": 1000}, "models": MODELS})
    assert f.error is None and f.room_bytes == {"CPU": 700} and f.waiting == {"m": 2}
    s = f.seats[0]
    assert (s.key, s.in_flight, s.credit, dict(s.bytes)) == ("m", 1, 4.0, {"CPU": 300})
    assert f.models == {"m": None, "m:sql": "m"} and f.names["m-alias"] == "m"


def test_facts_that_failed_make_a_node_that_takes_nothing() -> None:
    f = node_facts({"node": "n1", "taken_at": 10.0, "error": "the node door exited with -9"})
    assert f.error == "the node door exited with -9" and f.seats == ()


def test_a_dry_run_is_a_verdict_and_an_error_a_refusal() -> None:
    plan = {"plan": {"action": "ram", "key": "m", "reason": "fits", "evict": [{"key": "x", "bytes": {}}],
                     "free_bytes_after": {"CPU": 5}, "wait_for": []}}
    v = verdict_of("n1", 200, plan)
    assert (v.action, v.key, v.evict, dict(v.free_after)) == ("ram", "m", ("x",), {"CPU": 5})
    bad = verdict_of("n2", 404, {"error": {"message": "model 'm' does not exist"}})
    assert bad.action == "refuse" and "does not exist" in bad.reason


def test_residents_and_history_name_their_node() -> None:
    got = merge.residents({"n2": RESIDENTS, "n1": {"data": [], "waiting": {"m": 1}}})
    assert [r["node"] for r in got["data"]] == ["n2"] and got["waiting"] == {"m": 3}
    assert got["waiting_by_node"] == {"n1": {"m": 1}, "n2": {"m": 2}}
    rows = merge.history({"n1": {"data": [{"id": 1, "time": 5.0}, {"id": 2, "time": 9.0}]},
                          "n2": {"data": [{"id": 1, "time": 7.0}]}}, limit=2)
    assert [(r["node"], r["time"]) for r in rows["data"]] == [("n1", 9.0), ("n2", 7.0)]


def test_the_model_list_names_who_has_the_files_and_who_holds_the_seat() -> None:
    got = merge.models({"n1": MODELS, "n2": {"data": [{"id": "m", "fitevict": {}}]}}, {"m": ["n2"]})
    rows = {r["id"]: r["fitevict"] for r in got["data"]}
    assert rows["m"]["nodes"] == ["n1", "n2"] and rows["m"]["resident_on"] == ["n2"]
    assert rows["m:sql"]["resident_on"] == ["n2"] and rows["m:sql"]["resident"]  # an adapter: its base's seat


def test_a_node_reports_its_engine_devices_and_counts_unified_memory_once() -> None:
    residents = {"data": [{"key": "vk", "state": "ready", "unified": ["Vulkan0"],
                           "devices": {"CPU": {"planned_bytes": 100}, "Vulkan0": {"planned_bytes": 200}}},
                          {"key": "rpc", "state": "ready",
                           "devices": {"CPU": {"planned_bytes": 50}, "RPC0": {"planned_bytes": 400}}}]}
    f = node_facts({"node": "n1", "taken_at": 1.0, "residents": residents,
                    "budget_bytes": {"CPU": 1000, "Vulkan0": 500, "RPC0": 600}})
    # Vulkan0's bytes are RAM: the host's room is less them too; RPC0's live in its rpc-server, apart
    assert f.room_bytes == {"CPU": 1000 - 100 - 200 - 50, "Vulkan0": 300, "RPC0": 200}
