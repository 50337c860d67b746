"""The routing rule on records: hit > load without eviction (most room left) > cheapest eviction (GreedyDual
credit) > wait > refuse with each node's reason; stale facts leave a node out; ties go to the node id."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fitevict.cluster.route import NodeFacts, NodeSeat, Verdict, meaning, no_node_status, rank, resolve, route

GiB = 1 << 30
NOW = 1000.0


def node(name: str, *seats: NodeSeat, models=("m", "big", "other"), taken_at: float = NOW, error: str | None = None,
         budget: int = 4 * GiB, bases: dict | None = None) -> NodeFacts:
    held = sum(sum(s.bytes.values()) for s in seats)
    catalog = {k: None for k in models} | (bases or {})
    return NodeFacts(name, f"http://{name}", taken_at, seats=seats, budget_bytes={"CPU": budget},
                     room_bytes={"CPU": budget - held}, models=catalog, names={k: k for k in catalog}, error=error)


def seat(key: str, gib: float = 1, *, busy: int = 0, credit: float | None = None, state: str = "ready") -> NodeSeat:
    return NodeSeat(key, state, {"CPU": int(gib * GiB)}, in_flight=busy, credit=credit)


def test_a_resident_model_is_a_hit_on_its_node() -> None:
    facts = [node("a"), node("b", seat("m")), node("c")]
    r = route("m", facts, None, NOW, 5.0)
    assert [(c.node, c.why) for c in r.candidates] == [("b", "hit")]


def test_hits_go_to_the_least_busy_node_first() -> None:
    facts = [node("a", seat("m", busy=3)), node("b", seat("m", busy=1))]
    assert [c.node for c in route("m", facts, None, NOW, 5.0).candidates] == ["b", "a"]


def test_an_adapter_hits_its_base_seat() -> None:
    facts = [node("a", bases={"lora": "m"}), node("b", seat("m"), bases={"lora": "m"})]
    assert [c.node for c in route("lora", facts, None, NOW, 5.0).candidates] == ["b"]


def test_without_a_hit_the_caller_asks_the_dry_runs() -> None:
    assert route("m", [node("a"), node("b")], None, NOW, 5.0).candidates == ()


def test_load_without_eviction_goes_where_most_room_is_left() -> None:
    verdicts = [Verdict("a", "ram", free_after={"CPU": 1 * GiB}), Verdict("b", "ram", free_after={"CPU": 3 * GiB}),
                Verdict("c", "ram", evict=("x",), free_after={"CPU": 9 * GiB})]
    r = route("m", [node("a"), node("b"), node("c", seat("x"))], verdicts, NOW, 5.0)
    assert [(c.node, c.why) for c in r.candidates] == [("b", "load"), ("a", "load"), ("c", "evict")]


def test_a_model_that_does_not_fit_on_a_loads_on_b() -> None:
    verdicts = [Verdict("a", "refuse", "needs 5 GiB, the budget is 1 GiB"), Verdict("b", "ram")]
    r = route("big", [node("a", budget=GiB), node("b")], verdicts, NOW, 5.0)
    assert [c.node for c in r.candidates] == ["b"]
    assert r.refused == (("a", "needs 5 GiB, the budget is 1 GiB"),)


def test_the_cheapest_eviction_is_the_least_greedy_dual_credit_summed() -> None:
    facts = [node("a", seat("x", credit=0.2), seat("y", credit=0.2)), node("b", seat("z", credit=0.3))]
    verdicts = [Verdict("a", "ram", evict=("x", "y")), Verdict("b", "ram", evict=("z",))]
    r = route("m", facts, verdicts, NOW, 5.0)
    assert [c.node for c in r.candidates] == ["b", "a"]  # 0.3 < 0.2 + 0.2


def test_a_model_loading_on_a_node_is_a_hit_there() -> None:
    # another front door started its load: this one's dry run there says wait, for the model itself
    facts = [node("a"), node("b", seat("m", state="loading"))]
    verdicts = [Verdict("a", "ram", free_after={"CPU": 4 * GiB}), Verdict("b", "wait", key="m", wait_for=("m",))]
    r = route("m", facts, verdicts, NOW, 5.0)
    assert [(c.node, c.why) for c in r.candidates][0] == ("b", "hit")


def test_wait_comes_after_evictions_and_refusals_keep_their_reasons() -> None:
    verdicts = [Verdict("a", "wait", key="m", wait_for=("x",)), Verdict("b", "refuse", "too big"),
                Verdict("c", "ram", evict=("y",))]
    r = route("m", [node("a"), node("b"), node("c", seat("y"))], verdicts, NOW, 5.0)
    assert [(c.node, c.why) for c in r.candidates] == [("c", "evict"), ("a", "wait")]
    assert r.refused == (("b", "too big"),)


def test_stale_or_failed_facts_leave_a_node_out_with_why() -> None:
    facts = [node("a", seat("m"), taken_at=NOW - 60), node("b", error="lost: connection refused"), node("c")]
    r = route("m", facts, [Verdict("c", "ram")], NOW, 5.0)
    assert [c.node for c in r.candidates] == ["c"]
    reasons = dict(r.refused)
    assert "presumed lost" in reasons["a"] and "connection refused" in reasons["b"]


def test_a_node_without_the_files_is_never_a_candidate() -> None:
    r = route("m", [node("a", models=("other",)), node("b")], [Verdict("b", "ram")], NOW, 5.0)
    assert [c.node for c in r.candidates] == ["b"] and "no files" in dict(r.refused)["a"]


def test_names_resolve_by_alias_and_ollama_tag() -> None:
    f = NodeFacts("a", "u", NOW, models={"m": None}, names={"m": "m", "alias": "m"})
    assert resolve("alias", [f]) == "m" and resolve("m:latest", [f]) == "m" and resolve("nope", [f]) is None


actions = st.sampled_from(["hit", "load", "partial", "ram", "wait", "refuse"])
verdict_lists = st.lists(st.tuples(actions, st.integers(0, 8), st.booleans(), st.floats(0, 10)), min_size=1,
                         max_size=6)


def _verdicts(spec) -> tuple[list[NodeFacts], list[Verdict]]:
    facts, verdicts = [], []
    for i, (action, room, evicts, credit) in enumerate(spec):
        name = f"n{i}"
        facts.append(node(name, seat(f"v{i}", credit=credit)))
        verdicts.append(Verdict(name, action, key="m", evict=(f"v{i}",) if evicts and action in ("load", "partial", "ram") else (),
                                free_after={"CPU": room * GiB}))
    return facts, verdicts


@settings(max_examples=200, deadline=None)
@given(verdict_lists)
def test_every_node_is_a_candidate_or_refused_exactly_once(spec) -> None:
    facts, verdicts = _verdicts(spec)
    r = rank(verdicts, {f.node: f for f in facts})
    nodes = [c.node for c in r.candidates] + [n for n, _ in r.refused]
    assert sorted(nodes) == sorted(f.node for f in facts)
    assert all(v.node in dict(r.refused) for v in verdicts if v.action == "refuse")


@settings(max_examples=200, deadline=None)
@given(verdict_lists)
def test_the_order_follows_the_rule_and_does_not_depend_on_the_order_of_reports(spec) -> None:
    facts, verdicts = _verdicts(spec)
    r = rank(verdicts, {f.node: f for f in facts})
    order = {"hit": 0, "load": 1, "evict": 2, "wait": 3}
    whys = [order[c.why] for c in r.candidates]
    assert whys == sorted(whys)
    assert rank(list(reversed(verdicts)), {f.node: f for f in reversed(facts)}) == r  # two front doors agree
    loads = [c for c in r.candidates if c.why == "load"]
    rooms = [sum(next(v for v in verdicts if v.node == c.node).free_after.values()) for c in loads]
    by_action = [next(v for v in verdicts if v.node == c.node).action for c in loads]
    assert all(by_action[i] != by_action[i + 1] or rooms[i] >= rooms[i + 1] for i in range(len(loads) - 1))


# -- a node that stops or is lost: what its answers mean, and when no node took a request ---------------------------

STOPPING_503 = '{"error": {"message": "m: fitevict is shutting down; retry later", "type": "server_busy"}}'
REFUSED_502 = ('{"error": {"message": "m: the engine did not answer: cannot connect to the engine on 127.0.0.1:44539: '
               'ConnectionRefusedError(111, \'Connection refused\')", "type": "engine_error"}}')
BROKEN_502 = '{"error": {"message": "m: the engine broke off its answer", "type": "engine_error"}}'


def test_a_503_from_a_door_that_is_shutting_down_means_the_node_is_stopping() -> None:
    assert meaning(503, STOPPING_503, "hit", True) == "stopping"
    assert meaning(503, STOPPING_503, "load", False) == "stopping"
    assert meaning(503, '{"error": {"message": "m: queue full (8 waiting)"}}', "hit", True) == "busy"
    assert meaning(529, '{"type": "error"}', "hit", True) == "busy"
    assert meaning(507, '{"error": {"message": "needs 2 GiB"}}', "load", True) == "refused"


def test_a_hit_whose_engine_refused_the_connection_is_a_residence_gone() -> None:
    assert meaning(502, REFUSED_502, "hit", True) == "gone"
    assert meaning(502, REFUSED_502, "hit", False) == "gone"  # nothing reached an engine: it may go on
    assert meaning(502, REFUSED_502, "load", True) == "answer"  # a load's engine: the node's own failure


def test_a_502_from_a_node_out_of_routing_is_a_request_cut_by_its_loss() -> None:
    assert meaning(502, BROKEN_502, "hit", False) == "cut"
    assert meaning(502, BROKEN_502, "hit", True) == "answer"  # a live node's engine error is its own answer
    assert meaning(200, "{}", "hit", False) == "answer"
    assert meaning(400, '{"error": {"message": "bad"}}', "hit", True) == "answer"


def test_no_node_is_507_only_when_every_live_node_refused_on_bytes() -> None:
    on_bytes = [("a", "needs 900 MiB, 200 MiB free"), ("b", "answered 507: does not fit")]
    assert no_node_status(on_bytes, lost=False, busy=False) == 507
    left_out = [("c", "facts unavailable: lost: its door is shutting down"), ("d", "facts 9.0 s old (more than 5 s): "
                "presumed lost"), ("e", "has no files for m")]
    assert no_node_status(on_bytes + left_out, lost=False, busy=False) == 507  # the dead are no live node
    assert no_node_status(left_out, lost=False, busy=False) == 503  # no live node: a retry may find one
    assert no_node_status(on_bytes, lost=True, busy=False) == 503  # one stopped or was lost on the way
    assert no_node_status(on_bytes, lost=False, busy=True) == 503  # one was busy
    assert no_node_status(on_bytes + [("f", "dry run failed: GetTimeoutError: ")], lost=False, busy=False) == 503


def test_a_draining_node_in_the_table_is_no_residence_and_its_model_loads_elsewhere() -> None:
    # the fleet's table once a node left routing: its facts an error, its residents gone with it
    facts = [node("a", error="lost: its door is shutting down (answered 503)"), node("b"), node("c", seat("x"))]
    assert route("m", facts, None, NOW, 5.0).candidates == ()  # no hit: the dry runs are asked
    verdicts = [Verdict("b", "ram", free_after={"CPU": 2 * GiB}), Verdict("c", "ram", free_after={"CPU": 3 * GiB})]
    r = route("m", facts, verdicts, NOW, 5.0)
    assert [(c.node, c.why) for c in r.candidates] == [("c", "load"), ("b", "load")]
    assert "shutting down" in dict(r.refused)["a"]
    # the same node, still reporting its seat: a hit there, and the hit names the seat
    live = route("m", [node("a", seat("m")), node("b")], None, NOW, 5.0)
    assert [(c.node, c.why, c.seat) for c in live.candidates] == [("a", "hit", "m")]
