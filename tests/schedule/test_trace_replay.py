"""The trace-replay simulator (bench/tracesim.py) drives the real Scheduler over the real planner and real
prices of demo-zoo models: no request is lost and resident bytes never pass the budget under fitevict's
policies; the baselines are measured by the same code (count-LRU goes over a budget it does not read)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from baselines import CountLRU, FifoSwap, KeepAlive  # noqa: E402
from traces import adversarial_trace, zipf_trace, zoo_specs  # noqa: E402
from tracesim import FitevictPolicy, Req, Sim, Trace, replay  # noqa: E402

from fitevict.budget import Budget  # noqa: E402
from fitevict.pricing.footprint import HOST  # noqa: E402
from fitevict.request.contract import Contract  # noqa: E402
from fitevict.schedule.scheduler import SchedPolicy  # noqa: E402
from fitevict.zoo import write_zoo  # noqa: E402

MODELS = ("llama-q8_0", "llama-q4_0", "mamba")
POLICY = SchedPolicy(max_turn_seconds=30, max_wait_seconds=10, min_residency_seconds=1.0, eviction="cost")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory):
    zoo = tmp_path_factory.mktemp("zoo")
    write_zoo(zoo, only=MODELS)
    return zoo_specs(zoo, Contract(ctx=4096, parallel=1))


def size(models, *keys: str) -> int:
    return sum(models[k].bytes[HOST] for k in keys)


def two_of_three(models) -> Budget:
    """Room for the two largest together, never all three."""
    return Budget.declared({HOST: size(models, "llama-q8_0", "llama-q4_0") + 2**20})


def run(models, budget: Budget, trace: Trace, make, eviction: str = "cost"):
    sim = Sim(models, budget, eviction=eviction)
    return sim, sim.run(make(sim), trace)


def fitevict(eviction: str):
    return lambda sim: FitevictPolicy(sim, replace(POLICY, eviction=eviction))


def assert_kept_the_budget(sim: Sim, budget: Budget) -> None:
    limit = budget.budget_bytes(HOST)
    assert sim.resident_trace, "nothing was ever loaded"
    assert max(b for _t, b in sim.resident_trace) <= limit
    assert sim.resident_trace[-1][1] >= 0


@pytest.mark.parametrize("eviction", ["lru", "cost"])
def test_fitevict_loses_nothing_and_keeps_the_budget(models, eviction: str) -> None:
    budget = two_of_three(models)
    for trace in (zipf_trace(MODELS, n=60, rate=4.0, service=0.2, s=1.0, seed=5),
                  adversarial_trace(MODELS[:2], clients=4, per_client=4, service=0.3)):
        sim, r = run(models, budget, trace, fitevict(eviction), eviction)
        assert r.anomalies == ()
        assert (r.served, r.lost) == (trace.requests, 0)
        assert r.over_budget_bytes <= 0
        assert_kept_the_budget(sim, budget)
        assert r.loads >= 2  # the budget forced swaps: the invariants were exercised


def test_adversarial_closed_loop_swaps_once_per_round(models) -> None:
    """Two models that cannot be co-resident, 4 clients alternating: every client waits on the other model
    after each round, so one swap per round is the least any policy can do, and fitevict does no more."""
    budget = Budget.declared({HOST: max(size(models, "llama-q8_0"), size(models, "llama-q4_0")) + 2**20})
    trace = adversarial_trace(MODELS[:2], clients=4, per_client=6, service=0.3)
    _sim, r = run(models, budget, trace, fitevict("cost"))
    assert (r.served, r.lost, r.evicted_unserved) == (24, 0, 0)
    # the first load serves the 2 clients that begin there, each later one all 4 (every client then waits on the
    # other model), the last the 2 that end there: 2 + 5 * 4 + 2 = 24 requests in 7 loads
    assert r.loads == 7
    _sim, fifo = run(models, budget, trace, lambda sim: FifoSwap(sim))
    assert fifo.loads > r.loads


def test_the_baselines_are_measured_by_the_same_code(models) -> None:
    budget = two_of_three(models)
    trace = zipf_trace(MODELS, n=60, rate=4.0, service=0.2, s=0.5, seed=9)
    for make in (lambda sim: CountLRU(sim, 2), lambda sim: FifoSwap(sim), lambda sim: KeepAlive(sim, 300.0)):
        sim, r = run(models, budget, trace, make)
        assert r.anomalies == ()
        assert r.served + r.lost == trace.requests
        assert_kept_the_budget(sim, budget)
    _sim, over = run(models, budget, trace, lambda sim: CountLRU(sim, 3))  # counts models, not bytes
    assert over.over_budget_bytes > 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.floats(0, 0.6), st.sampled_from(MODELS), st.floats(0.01, 0.5)), min_size=1, max_size=25))
def test_random_arrivals_lose_nothing_under_fitevict(models, arrivals) -> None:
    t, reqs = 0.0, []
    for gap, key, service in arrivals:
        t += gap
        reqs.append(Req(t, key, service))
    budget = two_of_three(models)
    sim, r = run(models, budget, Trace("random", arrivals=tuple(reqs)), fitevict("cost"))
    assert r.anomalies == ()
    assert (r.served, r.lost) == (len(reqs), 0)
    assert_kept_the_budget(sim, budget)


def test_an_idle_young_seat_yields_when_its_minimum_residency_ends(models) -> None:
    a, b = "llama-q8_0", "llama-q4_0"
    budget = Budget.declared({HOST: max(size(models, a), size(models, b)) + 2**20})  # never both
    trace = Trace("two", arrivals=(Req(0.0, a, 0.05), Req(0.3, b, 0.05)))
    sim, r = run(models, budget, trace, fitevict("cost"))
    assert (r.served, r.lost) == (2, 0)
    # a is ready at its load time and done 0.05 s later; nothing else wants it. b may start once a's minimum
    # residency (1 s) is over: then a's release and b's load.
    ready_a = models[a].load_seconds
    bound = ready_a + POLICY.min_residency_seconds + models[a].release_seconds + models[b].load_seconds
    assert sim.waits[1] <= bound - 0.3 + 1e-9, f"b waited {sim.waits[1]:.2f} s (max_wait {POLICY.max_wait_seconds} s)"


def test_a_turn_that_ends_at_the_minimum_residency_does_not_strand_the_next_model(models) -> None:
    a, b = "llama-q8_0", "llama-q4_0"
    # a load time that rounds as this case needs, and over the minimum residency (which is never longer than the load)
    models = {**models, a: replace(models[a], load_seconds=1.3)}
    assert (models[a].load_seconds + 1.0) - models[a].load_seconds < 1.0
    budget = Budget.declared({HOST: max(size(models, a), size(models, b)) + 2**20})  # never both
    policy = replace(POLICY, max_wait_seconds=0.5)  # b's bound ends before a's minimum residency does
    trace = Trace("two", arrivals=(Req(0.0, a, 0.05), Req(0.01, b, 0.05)))
    sim = Sim(models, budget)
    r = sim.run(FitevictPolicy(sim, policy), trace)
    assert (r.served, r.lost) == (2, 0), f"lost {dict(r.lost_by)}; last answer at {r.makespan:.2f} s"
    assert r.makespan < 3.0  # a's load 1.3 s, its residency 1 s, then b's release and load, and the service


def test_the_default_policy_reloads_fewest_bytes_on_mixed_sizes() -> None:
    """The trace replay's mixed-size Zipf trace (declared models, 0.4 to 14.3 GiB, reload times by engine): the
    configuration's default policy keeps the budget and reloads fewer bytes than every baseline that keeps it too
    (keep-alive order included), and fewer than least-recently-used order over the same planner."""
    from trace_replay import KEEP_ALIVE, count_lru_max, mixed_case

    case = mixed_case()
    budget = Budget.declared({HOST: case.budget_bytes})
    ours = replay(case.models, budget, case.trace, lambda sim: FitevictPolicy(sim, SchedPolicy()))
    lru = replay(case.models, budget, case.trace, lambda sim: FitevictPolicy(sim, SchedPolicy(eviction="lru")),
                 eviction="lru")
    assert (ours.lost, ours.anomalies) == (0, ()) and ours.over_budget_bytes <= 0
    for make in (lambda sim: CountLRU(sim, count_lru_max(case.models, case.budget_bytes)),
                 lambda sim: FifoSwap(sim), lambda sim: KeepAlive(sim, KEEP_ALIVE)):
        base = replay(case.models, budget, case.trace, make)
        assert base.over_budget_bytes <= 0
        assert ours.reload_bytes < base.reload_bytes, base.policy
    assert ours.reload_bytes < lru.reload_bytes


def test_at_equal_swaps_no_longer_a_wait_than_count_lru(models) -> None:
    """Closed-loop clients over two models that cannot be co-resident, 0.05 s requests: fitevict makes the fewest
    swaps any policy can (one per round), as count-LRU does, and its requests wait no longer: the minimum residency
    never holds an idle seat longer than its own load took."""
    budget = Budget.declared({HOST: max(size(models, "llama-q8_0"), size(models, "llama-q4_0")) + 2**20})
    trace = adversarial_trace(MODELS[:2], clients=8, per_client=12, service=0.05)
    _sim, ours = run(models, budget, trace, lambda sim: FitevictPolicy(sim, SchedPolicy()))
    _sim, lru = run(models, budget, trace, lambda sim: CountLRU(sim, 1))
    assert (ours.lost, lru.lost) == (0, 0)
    assert ours.loads == lru.loads
    assert ours.wait_p50 <= lru.wait_p50 and ours.wait_p99 <= lru.wait_p99
