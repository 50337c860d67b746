"""plan(): the decision, and the numbers that decided it. Pure: no I/O, logging or clock.

The steps: the snapshot (``_Scene``: what is free and what may go), a hit or the same key under another
configuration (``_same_key``), the placement search, then one of three plans: the found rung's (``_found``), a
wait for busy residents (``_wait``) or a refusal (``_refusal``). ``_Scene.plan`` builds every ``Plan``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from fitevict.budget import Budget, charged
from fitevict.pricing.footprint import HOST, Footprint
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.units import GiB
from fitevict.planner.records import (Action, Eviction, FootprintFn, Plan, PlanInvariantError, PlanRequest, Policy,
                                      Resident, EMPTY)
from fitevict.planner.pages import pages_view, stays
from fitevict.planner.ladder import Prices, Rungs, Unpriced, search, action_of, compatible, mismatch
from fitevict.planner.victims import choose, context_words, gib, key_list, per_device, device_sums, victim_words, describe


# ---------------------------------------------------------------------------------------------
# the planner


def plan(
    request: PlanRequest,
    residents: Iterable[Resident],
    budget: Budget,
    footprints: FootprintFn,
    policy: Policy,
    now: float,
) -> Plan:
    """Decide how to serve ``request`` (see the module docstring). Pure; ``now`` dates the LRU reasons."""
    s = _Scene.of(request, residents, budget, footprints, policy, now)
    if s.same is not None and (early := _same_key(s, s.same)) is not None:
        return early
    gpu_free = {g: d.free.bytes for g in budget.gpu_names if (d := budget.device(g)) is not None}
    rungs = Rungs(request, budget.gpu_names, request.config.n_ctx, gpu_free, budget.rpc)
    if request.alloc_mode == "gpu-only" and not rungs.gpus:
        return s.plan(
            "refuse", None,
            f"{request.key}: alloc mode gpu-only but the budget has no GPU ({', '.join(budget.names) or 'no devices'})",
            "use alloc mode max-gpu or ram-only, or run where a GPU is visible", avail=s.avail_wait,
        )
    found_w: int | None = None
    try:
        found, shown = search(rungs, s.price, s.avail, s.prefer_gpu)
        if found is None and s.busy:
            found_w = search(rungs, s.price, s.avail_wait, s.prefer_gpu)[0]
    except Unpriced as e:
        return s.plan("refuse", None, f"{request.key} cannot be priced: {e}", "run a dry run to measure the missing terms",
                      avail=s.avail_wait)
    if found is not None:
        return _found(s, rungs, found)
    if found_w is not None:
        return _wait(s, rungs[found_w])
    return _refusal(s, rungs, shown, gpu_free)


def _fill(m: Mapping[str, int], devs: list[str]) -> Mapping[str, int]:
    return MappingProxyType({d: m.get(d, 0) for d in devs})


@dataclass
class _Scene:
    """One call's snapshot: the budgets and free bytes per device, the resident of the same key, and what may go.

    ``forced`` is the resident of the same key under another configuration (replaced by a load); ``pool`` the
    evictable others, ``busy`` those serving or loading, ``blockers`` the pinned or protected. ``avail`` is free after
    evicting ``forced`` and ``pool``; ``avail_wait`` after ``busy`` too (once their requests finish)."""

    request: PlanRequest
    budget: Budget
    policy: Policy
    now: float
    price: Prices
    devices: list[str]
    budget_b: dict[str, int]
    free_before: dict[str, int]
    same: Resident | None
    forced: list[Resident]
    pool: list[Resident]
    busy: list[Resident]
    blockers: list[Resident]
    freed_forced: dict[str, int]
    avail: dict[str, int]
    avail_wait: dict[str, int]

    @classmethod
    def of(cls, request: PlanRequest, residents: Iterable[Resident], budget: Budget, footprints: FootprintFn,
           policy: Policy, now: float) -> _Scene:
        unified = budget.unified_names
        res = tuple(residents)
        if unified:  # a unified device's bytes are host bytes too: counted against both budgets (budget.charged)
            res = tuple(replace(r, bytes=charged(r.bytes, unified)) for r in res)
        seen: set[str] = set()
        for r in res:
            if r.key in seen:
                raise PlanInvariantError(f"resident key {r.key!r} appears twice in the snapshot")
            seen.add(r.key)
        budget_b = {d: budget.budget_bytes(d) for d in budget.names}
        held = dict.fromkeys(budget_b, 0)
        for r in res:
            for d, n in r.bytes.items():
                held[d] = held.get(d, 0) + n
        devices: list[str] = list(held)
        for d in devices:
            budget_b.setdefault(d, 0)
        free_before = {d: budget_b[d] - held[d] for d in devices}
        carry = not stays(res, request)  # no other seat of its engine: a load carries the engine's shared pages
        res = pages_view(res, request, policy.eviction)  # what each resident frees of them (``planner.pages``)
        same = next((r for r in res if r.key == request.key), None)
        forced = [same] if same is not None else []
        others = [r for r in res if r is not same]
        pool = [r for r in others if r.evictable]
        busy = [r for r in others if r.busy]
        freed_forced = device_sums(forced, devices)
        avail = {d: free_before[d] + freed_forced[d] for d in devices}
        for r in pool:
            for d, n in r.bytes.items():
                avail[d] += n
        avail_wait = dict(avail)
        for r in busy:
            for d, n in r.bytes.items():
                avail_wait[d] += n
        return cls(request, budget, policy, now, Prices(request.key, footprints, unified, carry), devices, budget_b, free_before,
                   same, forced, pool, busy, [r for r in others if r.pinned or r.protected], freed_forced, avail,
                   avail_wait)

    @property
    def prefer_gpu(self) -> bool:
        return self.request.alloc_mode != "max-ram"

    def devs(self, need: Mapping[str, int]) -> list[str]:
        """The snapshot's devices, then any other that ``need`` names."""
        return self.devices + [d for d in need if d not in self.devices]

    def short(self, need: Mapping[str, int], *freed: Mapping[str, int]) -> dict[str, int]:
        """What ``need`` lacks per device after the free bytes, the forced replacement and ``freed``."""
        short = {d: n - self.free_before.get(d, 0) - self.freed_forced.get(d, 0) - sum(f.get(d, 0) for f in freed)
                 for d, n in need.items() if n > 0}
        return {d: s for d, s in short.items() if s > 0}

    def plan(self, action: Action, config: LoadConfig | None, reason: str, remedy: str = "", *,
             need: Mapping[str, int] = EMPTY, avail: Mapping[str, int] | None = None,
             after: Mapping[str, int] | None = None, fp: Footprint | None = None, **more: object) -> Plan:
        """A ``Plan`` over ``devs(need)``: free after defaults to free before (nothing executed), available too."""
        devs = self.devs(need)
        return Plan(
            action, self.request.key, self.request.alloc_mode, config, reason, remedy,
            needed_bytes=_fill(need, devs), free_bytes_before=_fill(self.free_before, devs),
            free_bytes_after=_fill(self.free_before if after is None else after, devs),
            available_bytes=_fill(self.free_before if avail is None else avail, devs),
            budget_bytes=_fill(self.budget_b, devs), host_mapped_bytes=fp.host_mapped_bytes if fp else 0,
            host_committed_bytes=fp.host_committed_bytes if fp else 0, footprint=fp, **more,  # type: ignore[arg-type]
        )


def _same_key(s: _Scene, same: Resident) -> Plan | None:
    """A hit, a wait for the same key (loading, or serving under another configuration), or None: replace it."""
    request = s.request
    if same.loading:
        return s.plan("wait", same.config, f"{request.key} is loading; wait for it", wait_for=(same.key,),
                      need=same.bytes)
    if compatible(same.config, request, same.source):
        # a hit: nothing moves; needed_bytes is what it holds
        reason = (f"{request.key} is resident ({describe(same.config, request.n_layer)}, "
                  f"{context_words(same.config, request.n_ctx_train)})")
        return s.plan("hit", same.config, reason, need=same.bytes)
    if same.in_flight:
        return s.plan(
            "wait", None,
            f"{request.key} is serving {same.in_flight} request(s) under another configuration; "
            "it can be replaced once they finish",
            wait_for=(same.key,),
        )
    return None


def _found(s: _Scene, rungs: Rungs, found: int) -> Plan:
    """The plan for the rung the search found: its evictions (exclusive devices first), the bytes after."""
    request, policy, budget_b = s.request, s.policy, s.budget_b
    config = rungs[found]
    fp, need = s.price(config)
    devs = s.devs(need)
    # exclusive: on a device where the load takes more than exclusive_fraction of the budget, everything
    # evictable there goes; on every other device only what must
    excl = [d for d, n in need.items()
            if n > 0 and budget_b.get(d, 0) > 0 and n > policy.exclusive_fraction * budget_b[d]]
    on_excl = [r for r in s.pool if any(r.bytes.get(d, 0) > 0 for d in excl)]
    short = s.short(need, device_sums(on_excl, list(need)))
    rest = [r for r in s.pool if r not in on_excl]
    victims = on_excl + (choose(short, rest, policy.eviction) if short else [])
    evict = [Eviction(r.key, r.bytes, f"replace: {mismatch(r.config, request, r.source)}") for r in s.forced]
    for r in sorted(victims, key=lambda r: (r.last_used, r.key)):
        mine = [d for d in excl if r.bytes.get(d, 0) > 0]
        if mine:
            top = max(mine, key=lambda d: need[d] / budget_b[d])
            why = (f"exclusive on {top}: {request.key} needs {gib(need[top])} of {gib(budget_b[top])} there "
                   f"(> {policy.exclusive_fraction:.0%})")
        else:
            why = victim_words(r, [d for d in short if r.bytes.get(d, 0) > 0], policy.eviction, s.now)
        evict.append(Eviction(r.key, r.bytes, why))
    gone = device_sums([*s.forced, *victims], devs)
    after = {d: s.free_before.get(d, 0) + gone[d] - need.get(d, 0) for d in devs}
    action = action_of(config, request.n_layer)
    reason = (f"{request.key}: {describe(config, request.n_layer)}, {context_words(config, request.n_ctx_train)}; "
              f"needs {per_device(need, [d for d in devs if need.get(d, 0)])}")
    if evict:
        reason += f"; evicts {'[' + ', '.join(e.key for e in evict) + ']'}"
    split = split_words(config, request, s.budget)
    if split:
        reason += f"; {split}"
    if action != "load" and s.prefer_gpu and rungs.kind == "ladder" and found > 0:
        top_need = s.price(rungs[0])[1]
        reason += f" (all layers on the GPU would need {per_device(top_need, [d for d in top_need if d != HOST])})"
    return s.plan(action, config, reason, need=need, avail=s.avail, after=after, fp=fp, evict=tuple(evict),
                  exclusive=bool(excl), split=split)


def _wait(s: _Scene, config: LoadConfig) -> Plan:
    """The plan to wait for the busy residents once only their going lets ``config`` fit."""
    request = s.request
    fp, need = s.price(config)
    short = s.short(need)
    chosen = choose(short, s.pool + s.busy, s.policy.eviction)
    waits = tuple(r.key for r in chosen if r.busy)
    also = [r for r in chosen if not r.busy]
    reason = (f"{request.key} needs {per_device(need, [d for d in short])} at "
              f"{context_words(config, request.n_ctx_train)}; it fits once {', '.join(waits)} "
              f"finish{'es' if len(waits) == 1 else ''} serving or loading"
              + (f" (then evicting {key_list(also)})" if also else ""))
    return s.plan("wait", config, reason, "retry when they are idle", need=need, avail=s.avail, fp=fp,
                  wait_for=waits)


def _refusal(s: _Scene, rungs: Rungs, shown: int, gpu_free: Mapping[str, int]) -> Plan:
    """Refuse: what it needs, what is available after every allowed eviction (busy residents included: they may go
    once their requests finish), the largest ctx."""
    request, policy, avail_wait = s.request, s.policy, s.avail_wait
    config = rungs[shown]
    fp, need = s.price(config)
    binding = [d for d, n in need.items() if n > 0 and n > avail_wait.get(d, 0)]
    asked = request.config.n_ctx or request.n_ctx_train
    smallest = -(-max(policy.min_ctx, 1) // policy.ctx_step) * policy.ctx_step
    largest = None
    try:
        if asked > smallest:
            largest = _largest_ctx(request, s.budget.gpu_names, s.price, avail_wait, s.prefer_gpu, policy, asked,
                                   gpu_free, s.budget.rpc)
        largest, ctx_words = ctx_suggestion(largest, request.n_ctx_train)
        remedy = _remedy(request, s.budget, binding, s.blockers, largest, rungs, s.price, avail_wait, gpu_free)
    except Unpriced as e:
        remedy = f"price {request.key} at other settings (a term is unavailable: {e})"
    movable = [r for r in (*s.forced, *s.pool, *s.busy) if any(r.bytes.get(d, 0) for d in binding)]
    evictable_words = f"after evicting {key_list(movable)}" if movable else "with nothing evictable"
    place = "" if rungs.kind in ("ram", "full") else f" ({describe(config, request.n_layer)})"
    reason = (f"{request.key} needs {per_device(need, binding)} at {context_words(config, request.n_ctx_train)}"
              f"{place}; {per_device(avail_wait, binding)} free {evictable_words}")
    if largest is not None:
        reason += f"; {ctx_words}"
    elif asked > smallest:
        reason += f"; no ctx from {smallest} up fits"
    return s.plan("refuse", config, reason, remedy, need=need, avail=avail_wait, fp=fp, largest_ctx=largest)


def split_words(c: LoadConfig, request: PlanRequest, budget: Budget) -> str:
    """Where a placement on several GPUs got its split: "layers split 17/16 by free memory (nvml): 70.1/69.9 GiB",
    or the request's own -ts; "" on one GPU or none."""
    if len(c.devices) < 2 or not c.tensor_split:
        return ""
    layers = "/".join(f"{w:g}" for w in c.tensor_split)
    if request.config.tensor_split:
        return f"layers split by the requested -ts {','.join(f'{w:g}' for w in request.config.tensor_split)}"
    figs = [budget.device(d) for d in c.devices]
    sources = sorted({f.free.source for f in figs if f is not None})
    free = "/".join(f"{f.free.bytes / GiB:.1f}" for f in figs if f is not None)
    return f"layers split {layers} by free memory ({', '.join(sources)}): {free} GiB, as llama.cpp splits by default"


def ctx_suggestion(largest: int | None, n_ctx_train: int) -> tuple[int | None, str]:
    """The context a refusal suggests, and the words for it: the largest that fits, capped at the model's training
    context (a larger one fits only memory, not the model, and the training context then fits too)."""
    if largest is None:
        return None, ""
    if n_ctx_train and largest > n_ctx_train:
        return n_ctx_train, (f"the largest ctx that fits is {largest}, above the training ctx {n_ctx_train}: "
                             f"suggesting {n_ctx_train}")
    words = f"the largest ctx that fits is {largest}"
    return largest, words + (f" (training ctx {n_ctx_train})" if n_ctx_train else "")


def _largest_ctx(
    request: PlanRequest, gpus: tuple[str, ...], price: Prices, room: Mapping[str, int],
    prefer_gpu: bool, policy: Policy, asked: int, free: Mapping[str, int] = EMPTY, rpc: tuple[str, ...] = (),
) -> int | None:
    """The largest multiple of ``ctx_step`` below ``asked`` (and >= min_ctx) at which some rung fits.

    Bisection over ctx; each probe runs the very search ``plan`` runs at that ctx, so a suggested ctx is one the
    plan for it finds (a probe narrowed by an earlier one's boundary rung could find a rung the plan's own search
    does not reach on ladders whose needs are not monotonic, such as experts split over several GPUs).
    """
    step = policy.ctx_step
    lo = max(1, -(-policy.min_ctx // step))
    hi = (asked - 1) // step
    if hi < lo:
        return None

    def fits(k: int) -> bool:
        return search(Rungs(request, gpus, k * step, free, rpc), price, room, prefer_gpu)[0] is not None

    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def _remedy(
    request: PlanRequest, budget: Budget, binding: list[str], blockers: list[Resident],
    largest: int | None, rungs: Rungs, price: Prices, avail: Mapping[str, int], free: Mapping[str, int] = EMPTY,
) -> str:
    parts: list[str] = []
    if largest is not None:
        parts.append(f"lower ctx to {largest}")
    for r in blockers:
        if any(r.bytes.get(d, 0) > 0 for d in binding):
            parts.append(f"{'unpin' if r.pinned else 'unprotect'} {r.key}")
    if request.alloc_mode in ("gpu-only", "explicit") and rungs.gpus:
        wider = PlanRequest(request.key, request.config, "max-gpu", request.n_layer, request.n_moe_layers,
                            request.n_ctx_train)
        if search(Rungs(wider, budget.gpu_names, request.config.n_ctx, free, budget.rpc), price, avail,
                  True)[0] is not None:
            parts.append("allow CPU offload (alloc mode max-gpu)")
    for d in binding:
        b = budget.device(d)
        if b is not None and b.limit is not None and b.limit.bytes < b.total.bytes - b.reserve.bytes - b.others_bytes:
            parts.append(f"raise {'ram_limit' if d == HOST else 'gpu_limit'} ({b.limit.source})")
    if not parts:
        parts.append(f"free memory on {', '.join(binding) or 'the host'} or use a smaller quantization")
    return " or ".join(parts)
