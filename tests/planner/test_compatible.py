"""The one rule that says whether a resident seat serves a request (``planner.compatible``/``mismatch``): a request
that asks for a smaller context than a seat holds per slot is served by it; only a larger one reloads, and says so."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fitevict.budget import Budget
from fitevict.planner import RELOADED_FOR_CTX, PlanRequest, Policy, Resident, compatible, mismatch, plan
from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.pricing.loadconfig import LoadConfig

MB = 1_000_000
CTX = frozenset({"n_ctx"})


def req(ctx: int, parallel: int | None = 1, fixed: frozenset[str] | None = CTX, train: int = 8192) -> PlanRequest:
    return PlanRequest("m", LoadConfig(n_ctx=ctx, n_parallel=parallel), fixed=fixed, n_ctx_train=train)


def test_a_smaller_context_is_served_and_a_larger_one_says_why_not() -> None:
    seat = LoadConfig(n_ctx=2048, n_parallel=1)
    assert compatible(seat, req(1024)) and compatible(seat, req(2048))
    assert mismatch(seat, req(4096)) == f"{RELOADED_FOR_CTX}: resident 2048 < asked 4096"


def test_the_context_is_compared_per_slot() -> None:
    four = LoadConfig(n_ctx=8192, n_parallel=4)  # 2048 tokens a slot
    assert compatible(four, req(2048)) and not compatible(four, req(4096))
    assert mismatch(four, req(4096)) == f"{RELOADED_FOR_CTX}: resident 2048 < asked 4096 per slot"
    no_np = LoadConfig(n_ctx=8192, n_parallel=None)  # no -np: the engine's 4 slots
    assert mismatch(no_np, req(4096)) == mismatch(four, req(4096))
    assert compatible(LoadConfig(n_ctx=4096, n_parallel=1), req(8192, parallel=4))  # 2048 a slot asked


def test_the_training_context_counts_as_its_size() -> None:
    train = LoadConfig(n_ctx=0, n_parallel=1)
    assert compatible(train, req(8192, train=8192)) and not compatible(train, req(16384, train=8192))
    assert compatible(LoadConfig(n_ctx=8192, n_parallel=1), req(0, train=8192))


def test_other_fixed_fields_still_match_exactly() -> None:
    seat = LoadConfig(n_ctx=4096, n_parallel=2)
    assert mismatch(seat, req(1024, parallel=1, fixed=frozenset({"n_ctx", "n_parallel"}))) == (
        "resident with a different n_parallel")
    kv = PlanRequest("m", LoadConfig(n_ctx=1024, n_parallel=2, cache_type_k="q8_0"),
                     fixed=frozenset({"n_ctx", "cache_type_k"}))
    assert mismatch(seat, kv) == "resident with a different cache_type_k"


def test_a_dry_run_asks_for_exactly_its_configuration() -> None:
    assert not compatible(LoadConfig(n_ctx=2048, n_parallel=1), req(1024, fixed=None))


def test_a_request_that_names_no_context_is_served_at_any() -> None:
    assert compatible(LoadConfig(n_ctx=512, n_parallel=1), req(8192, fixed=frozenset()))


@given(have=st.integers(1, 1 << 17), want=st.integers(1, 1 << 17), np_have=st.sampled_from([None, 1, 2, 3, 4, 8]),
       np_want=st.sampled_from([None, 1, 2, 4]))
def test_served_exactly_when_a_slot_holds_the_asked_slot(have: int, want: int, np_have: int | None,
                                                        np_want: int | None) -> None:
    seat = LoadConfig(n_ctx=have, n_parallel=np_have)
    asked = req(want, parallel=np_want)
    per_have, per_want = have // (np_have or 4), want // (np_want or 4)
    assert compatible(seat, asked) == (per_want <= per_have)
    if not compatible(seat, asked):
        assert mismatch(seat, asked).startswith(f"{RELOADED_FOR_CTX}: resident {per_have} < asked {per_want}")
    smaller = req(max(1, want // 2), parallel=np_want)  # whatever a seat serves, it serves any smaller context too
    assert not compatible(seat, asked) or compatible(seat, smaller)


def _fp(n: int) -> Footprint:
    return Footprint((DeviceFootprint(HOST, Term(n, "declared"), Term(0, "declared")),), host_mapped_bytes=n)


def test_the_planner_hits_for_less_and_replaces_for_more_naming_why() -> None:
    budget = Budget.declared({HOST: {"total": 1000 * MB}})
    resident = Resident("m", LoadConfig(n_ctx=2048, n_parallel=1), {HOST: 100 * MB})
    price = lambda key, cfg: _fp(cfg.n_ctx * 50_000)  # noqa: E731
    assert plan(req(1024), [resident], budget, price, Policy(), now=1.0).action == "hit"
    more = plan(req(4096), [resident], budget, price, Policy(), now=1.0)
    assert more.action == "ram" and more.evict_keys == ("m",)  # no GPU in this budget
    assert more.evict[0].reason == f"replace: {RELOADED_FOR_CTX}: resident 2048 < asked 4096"
