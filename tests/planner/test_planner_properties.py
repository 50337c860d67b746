"""Planner invariants over random residents, budgets and requests (Hypothesis).

Footprints come from random byte tables (tables.py), budgets are declared; every property is
checked by re-adding the bytes, never by trusting the plan's own arithmetic.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fitevict.budget import Budget
from fitevict.planner import LOADING_ACTIONS, PlanRequest, Policy, Resident, plan
from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig

from .tables import TableModel, footprint_fn

U = 64 * 1024**2  # every size is a multiple of 64 MiB
NOW = 100.0
MODES = ("gpu-only", "max-gpu", "max-ram", "ram-only", "explicit")
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def models(draw: st.DrawFn) -> TableModel:
    n = draw(st.integers(1, 6))
    units = st.integers(0, 8).map(lambda k: k * U)
    moe = draw(st.booleans())
    return TableModel(
        "m",
        dense=tuple(draw(st.lists(units, min_size=n, max_size=n))),
        experts=tuple(draw(st.lists(units, min_size=n, max_size=n))) if moe else (),
        output=draw(units),
        embd=draw(units),
        kv_per_token=draw(st.sampled_from([0, 1024, 16 * 1024, 64 * 1024])),
        gpu_compute=draw(st.integers(0, 4)) * U,
        gpu_compute_per_token=draw(st.sampled_from([0, 512, 4096])),
        cpu_compute=draw(st.integers(0, 4)) * U,
        n_ctx_train=draw(st.sampled_from([0, 2048, 8192])),
    )


@st.composite
def scenes(draw: st.DrawFn) -> tuple[TableModel, PlanRequest, list[Resident], Budget, Policy]:
    m = draw(models())
    gpus = [f"CUDA{i}" for i in range(draw(st.integers(0, 2)))]
    devices = [HOST, *gpus]
    residents = []
    for i in range(draw(st.integers(0, 8))):
        residents.append(
            Resident(
                f"r{i}",
                LoadConfig(),
                {d: draw(st.integers(0, 16)) * U for d in devices},
                last_used=float(draw(st.integers(0, 5))),  # few distinct times: ties happen
                pinned=draw(st.integers(0, 4)) == 0,
                protected=draw(st.integers(0, 6)) == 0,
                in_flight=draw(st.sampled_from([0, 0, 0, 1, 2])),
                loading=draw(st.integers(0, 8)) == 0,
            )
        )
    # residents fit their budget to begin with; the spare room is random
    spec = {d: sum(r.bytes[d] for r in residents) + draw(st.integers(0, 48)) * U + U for d in devices}
    budget = Budget.declared(spec)
    mode = draw(st.sampled_from(MODES))
    base = LoadConfig(n_ctx=draw(st.sampled_from([0, 512, 1024, 3000, 4096, 8192])))
    if mode == "explicit":
        base = base.with_(n_gpu_layers=draw(st.integers(0, m.n_blocks + 1)),
                          n_cpu_moe=draw(st.integers(0, m.n_blocks)) if m.experts else 0)
    req = m.request(n_ctx=base.n_ctx, mode=mode, config=base)
    policy = Policy(exclusive_fraction=draw(st.sampled_from([0.5, 0.8, 1.0])),
                    eviction=draw(st.sampled_from(["cost", "lru"])))
    return m, req, residents, budget, policy


def held(residents: list[Resident], devices: set[str]) -> dict[str, int]:
    return {d: sum(r.bytes.get(d, 0) for r in residents) for d in devices}


def over(residents: list[Resident], need: dict[str, int], budget: Budget) -> list[str]:
    """Devices where the residents plus the new model's need exceed the budget."""
    devices = set(budget.names) | set(need)
    h = held(residents, devices)
    return [d for d in devices if h[d] + need.get(d, 0) > budget.budget_bytes(d)]


def need_of(m: TableModel, c: LoadConfig) -> dict[str, int]:
    fp = m.footprint(c)
    return {HOST: fp.bytes_on(HOST), **{g: fp.bytes_on(g) for g in fp.gpu_names}}


@SETTINGS
@given(scenes())
def test_loads_fit_and_spare_the_unevictable(scene) -> None:
    m, req, residents, budget, policy = scene
    p = plan(req, residents, budget, footprint_fn(m), policy, NOW)
    keys = {r.key: r for r in residents}
    for e in p.evict:
        assert keys[e.key].evictable, f"evicted {e.key} which is pinned/protected/busy"
    if p.action not in LOADING_ACTIONS:
        return
    assert p.config is not None
    need = need_of(m, p.config)  # re-priced, not read from the plan
    assert dict(p.needed_bytes) == {d: need.get(d, 0) for d in p.needed_bytes}
    kept = [r for r in residents if r.key not in set(p.evict_keys)]
    assert over(kept, need, budget) == [], "resident bytes exceed the budget after the plan"
    victims = [keys[k] for k in p.evict_keys]
    if p.exclusive:  # everything evictable on the exclusive devices goes; minimality holds for the rest
        excl = {d for d, n in need.items()
                if n > 0 and budget.budget_bytes(d) > 0 and n > policy.exclusive_fraction * budget.budget_bytes(d)}
        there = {r.key for r in residents if r.evictable and any(r.bytes.get(d, 0) > 0 for d in excl)}
        assert there <= set(p.evict_keys)
        victims = [v for v in victims if v.key not in there]
        kept_there = [r for r in residents if r.key not in set(p.evict_keys)]
        for v in victims:
            assert over(kept_there + [v], need, budget), f"evicting {v.key} was not needed"
        return
    for v in victims:  # minimal: keeping any single victim makes it not fit
        assert over(kept + [v], need, budget), f"evicting {v.key} was not needed"


@SETTINGS
@given(scenes(), st.data())
def test_hit_never_evicts(scene, data) -> None:
    m, req, residents, budget, policy = scene
    cfg = req.config.with_(devices=budget.gpu_names, n_gpu_layers=req.n_layer) if req.alloc_mode != "ram-only" else req.config
    if req.alloc_mode == "explicit":
        cfg = req.config.with_(devices=req.config.devices or (budget.gpu_names if req.config.n_gpu_layers else ()))
    me = Resident("m", cfg, {HOST: data.draw(st.integers(0, 64)) * U}, last_used=0.0)
    p = plan(req, [*residents, me], budget, footprint_fn(m), policy, NOW)
    if req.alloc_mode == "gpu-only" and not budget.gpu_names:
        return  # a gpu-only resident without GPUs cannot exist
    assert p.action == "hit" and p.evict == () and p.wait_for == () and p.config == cfg


FITS_ONCE_FREE = (*LOADING_ACTIONS, "wait")


@SETTINGS
@given(scenes())
def test_refusals_carry_a_largest_ctx_that_really_fits(scene) -> None:
    m, req, residents, budget, policy = scene
    p = plan(req, residents, budget, footprint_fn(m), policy, NOW)
    if p.action != "refuse":
        return
    asked = req.config.n_ctx or req.n_ctx_train
    step = policy.ctx_step
    replan = lambda ctx: plan(  # noqa: E731
        PlanRequest(req.key, req.config.with_(n_ctx=ctx), req.alloc_mode, req.n_layer, req.n_moe_layers,
                    req.n_ctx_train), residents, budget, footprint_fn(m), policy, NOW)
    if p.largest_ctx is None:
        smallest = -(-policy.min_ctx // step) * step
        if asked and smallest < asked and "cannot be priced" not in p.reason:
            assert replan(smallest).action not in FITS_ONCE_FREE
        return
    # busy residents may go once their requests finish: a suggestion may fit only then (a wait, not a refusal)
    assert replan(p.largest_ctx).action in FITS_ONCE_FREE, "the suggested ctx does not fit"
    if req.n_ctx_train and p.largest_ctx == req.n_ctx_train and f"above the training ctx {req.n_ctx_train}" in p.reason:
        return  # capped at the training ctx: a larger one fits the memory, not the model
    assert p.largest_ctx % step == 0 and policy.min_ctx <= p.largest_ctx < asked
    assert not req.n_ctx_train or p.largest_ctx <= req.n_ctx_train, "suggested beyond the training ctx"
    if p.largest_ctx + step < asked:
        assert replan(p.largest_ctx + step).action not in FITS_ONCE_FREE, "a larger ctx would have fit"


@SETTINGS
@given(scenes())
def test_wait_names_busy_residents_and_max_gpu_takes_the_most_gpu(scene) -> None:
    m, req, residents, budget, policy = scene
    p = plan(req, residents, budget, footprint_fn(m), policy, NOW)
    busy = {r.key for r in residents if r.busy}
    if p.action == "wait":
        assert p.wait_for and set(p.wait_for) <= busy
    if p.action in ("partial", "ram") and req.alloc_mode == "max-gpu" and budget.gpu_names:
        # everything on the GPU did not fit in what every allowed eviction frees
        full = req.config.with_(devices=budget.gpu_names, n_gpu_layers=req.n_layer, n_cpu_moe=0)
        need = need_of(m, full)
        assert any(n > 0 and n > p.available_bytes.get(d, 0) for d, n in need.items())
