"""plan(): the decision, and the numbers that decided it. Pure: no I/O, logging or clock."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from fitevict.budget import Budget
from fitevict.pricing.footprint import HOST, Footprint
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.units import GiB
from fitevict.planner.records import (Action, Eviction, FootprintFn, Plan, PlanInvariantError, PlanRequest, Policy,
                                      Resident, _EMPTY)
from fitevict.planner.ladder import _Prices, _Rungs, _Unpriced, _search, action_of, compatible
from fitevict.planner.victims import _choose, _ctx_words, _gib, _keys, _per_device, _sum, _victim_words, describe


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
    res = tuple(residents)
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
    price = _Prices(request.key, footprints)

    def fill(m: Mapping[str, int], devs: list[str]) -> Mapping[str, int]:
        return MappingProxyType({d: m.get(d, 0) for d in devs})

    # -- hit, or the same key resident under another configuration
    same = next((r for r in res if r.key == request.key), None)
    forced: list[Resident] = []
    if same is not None:
        fits_now = compatible(same.config, request, same.source)
        if same.loading or fits_now:
            # a hit (or a load of it under way): nothing moves; needed_bytes is what it holds
            before = fill(free_before, devices)
            if same.loading:
                action: Action = "wait"
                reason = f"{request.key} is loading; wait for it"
            else:
                action = "hit"
                reason = (f"{request.key} is resident ({describe(same.config, request.n_layer)}, "
                          f"{_ctx_words(same.config, request.n_ctx_train)})")
            return Plan(
                action, request.key, request.alloc_mode, same.config, reason,
                wait_for=(same.key,) if same.loading else (), needed_bytes=fill(same.bytes, devices),
                free_bytes_before=before, free_bytes_after=before, available_bytes=before,
                budget_bytes=fill(budget_b, devices),
            )
        if same.in_flight:
            before = fill(free_before, devices)
            return Plan(
                "wait", request.key, request.alloc_mode, None,
                f"{request.key} is serving {same.in_flight} request(s) under another configuration; "
                "it can be replaced once they finish",
                wait_for=(same.key,), needed_bytes=fill(_EMPTY, devices), free_bytes_before=before,
                free_bytes_after=before, available_bytes=before, budget_bytes=fill(budget_b, devices),
            )
        forced = [same]

    others = [r for r in res if r is not same]
    pool = [r for r in others if r.evictable]
    busy = [r for r in others if r.busy]
    blockers = [r for r in others if r.pinned or r.protected]
    freed_forced = _sum(forced, devices)
    avail = {d: free_before[d] + freed_forced[d] for d in devices}
    for r in pool:
        for d, n in r.bytes.items():
            avail[d] += n
    avail_wait = dict(avail)
    for r in busy:
        for d, n in r.bytes.items():
            avail_wait[d] += n
    prefer_gpu = request.alloc_mode != "max-ram"
    n_ctx = request.config.n_ctx

    def refusal(reason: str, remedy: str, config: LoadConfig | None = None, need: Mapping[str, int] = _EMPTY,
                fp: Footprint | None = None, largest: int | None = None) -> Plan:
        devs = devices + [d for d in need if d not in devices]
        return Plan(
            "refuse", request.key, request.alloc_mode, config, reason, remedy,
            needed_bytes=fill(need, devs), free_bytes_before=fill(free_before, devs),
            free_bytes_after=fill(free_before, devs), available_bytes=fill(avail_wait, devs),
            budget_bytes=fill(budget_b, devs), largest_ctx=largest,
            host_mapped_bytes=fp.host_mapped_bytes if fp else 0,
            host_committed_bytes=fp.host_committed_bytes if fp else 0, footprint=fp,
        )

    gpu_free = {g: d.free.bytes for g in budget.gpu_names if (d := budget.device(g)) is not None}
    rungs = _Rungs(request, budget.gpu_names, n_ctx, gpu_free)
    if request.alloc_mode == "gpu-only" and not rungs.gpus:
        return refusal(
            f"{request.key}: alloc mode gpu-only but the budget has no GPU ({', '.join(budget.names) or 'no devices'})",
            "use alloc mode max-gpu or ram-only, or run where a GPU is visible",
        )
    found_w: int | None = None
    try:
        found, shown = _search(rungs, price, avail, prefer_gpu)
        if found is None and busy:
            found_w = _search(rungs, price, avail_wait, prefer_gpu)[0]
    except _Unpriced as e:
        return refusal(f"{request.key} cannot be priced: {e}", "run a dry run to measure the missing terms")

    if found is not None:
        config = rungs[found]
        fp, need = price(config)
        devs = devices + [d for d in need if d not in devices]
        # exclusive: on a device where the load takes more than exclusive_fraction of the budget, everything
        # evictable there goes; on every other device only what must
        excl = [d for d, n in need.items()
                if n > 0 and budget_b.get(d, 0) > 0 and n > policy.exclusive_fraction * budget_b[d]]
        exclusive = bool(excl)
        on_excl = [r for r in pool if any(r.bytes.get(d, 0) > 0 for d in excl)]
        freed_excl = _sum(on_excl, list(need))
        short = {d: n - free_before.get(d, 0) - freed_forced.get(d, 0) - freed_excl.get(d, 0)
                 for d, n in need.items() if n > 0}
        short = {d: s for d, s in short.items() if s > 0}
        rest = [r for r in pool if r not in on_excl]
        victims = on_excl + (_choose(short, rest, policy.eviction) if short else [])
        evict: list[Eviction] = []
        for r in forced:
            evict.append(Eviction(r.key, r.bytes, "replace: resident with a different configuration"))
        for r in sorted(victims, key=lambda r: (r.last_used, r.key)):
            mine = [d for d in excl if r.bytes.get(d, 0) > 0]
            if mine:
                top = max(mine, key=lambda d: need[d] / budget_b[d])
                why = (f"exclusive on {top}: {request.key} needs {_gib(need[top])} of {_gib(budget_b[top])} there "
                       f"(> {policy.exclusive_fraction:.0%})")
            else:
                why = _victim_words(r, [d for d in short if r.bytes.get(d, 0) > 0], policy.eviction, now)
            evict.append(Eviction(r.key, r.bytes, why))
        gone = _sum([*forced, *victims], devs)
        after = {d: free_before.get(d, 0) + gone[d] - need.get(d, 0) for d in devs}
        action = action_of(config, request.n_layer)
        reason = (f"{request.key}: {describe(config, request.n_layer)}, {_ctx_words(config, request.n_ctx_train)}; "
                  f"needs {_per_device(need, [d for d in devs if need.get(d, 0)])}")
        if evict:
            reason += f"; evicts {'[' + ', '.join(e.key for e in evict) + ']'}"
        split = split_words(config, request, budget)
        if split:
            reason += f"; {split}"
        if action != "load" and prefer_gpu and rungs.kind == "ladder" and found > 0:
            top_need = price(rungs[0])[1]
            reason += f" (all layers on the GPU would need {_per_device(top_need, [d for d in top_need if d != HOST])})"
        return Plan(
            action, request.key, request.alloc_mode, config, reason,
            evict=tuple(evict), needed_bytes=fill(need, devs), free_bytes_before=fill(free_before, devs),
            free_bytes_after=MappingProxyType(after), available_bytes=fill(avail, devs),
            budget_bytes=fill(budget_b, devs), host_mapped_bytes=fp.host_mapped_bytes,
            host_committed_bytes=fp.host_committed_bytes, exclusive=exclusive, footprint=fp, split=split,
        )

    if found_w is not None:
        config = rungs[found_w]
        fp, need = price(config)
        devs = devices + [d for d in need if d not in devices]
        short = {d: n - free_before.get(d, 0) - freed_forced.get(d, 0) for d, n in need.items() if n > 0}
        short = {d: s for d, s in short.items() if s > 0}
        chosen = _choose(short, pool + busy, policy.eviction)
        waits = tuple(r.key for r in chosen if r.busy)
        also = [r for r in chosen if not r.busy]
        reason = (f"{request.key} needs {_per_device(need, [d for d in short])} at "
                  f"{_ctx_words(config, request.n_ctx_train)}; it fits once {', '.join(waits)} "
                  f"finish{'es' if len(waits) == 1 else ''} serving or loading"
                  + (f" (then evicting {_keys(also)})" if also else ""))
        return Plan(
            "wait", request.key, request.alloc_mode, config, reason, "retry when they are idle",
            wait_for=waits, needed_bytes=fill(need, devs), free_bytes_before=fill(free_before, devs),
            free_bytes_after=fill(free_before, devs), available_bytes=fill(avail, devs),
            budget_bytes=fill(budget_b, devs), host_mapped_bytes=fp.host_mapped_bytes,
            host_committed_bytes=fp.host_committed_bytes, footprint=fp,
        )

    # -- refuse: what it needs, what is available after every allowed eviction (busy residents included: they may go
    # once their requests finish), the largest ctx
    config = rungs[shown]
    fp, need = price(config)
    binding = [d for d, n in need.items() if n > 0 and n > avail_wait.get(d, 0)]
    asked = n_ctx or request.n_ctx_train
    smallest = -(-max(policy.min_ctx, 1) // policy.ctx_step) * policy.ctx_step
    largest = None
    try:
        if asked > smallest:
            largest = _largest_ctx(request, budget.gpu_names, price, avail_wait, prefer_gpu, policy, asked, gpu_free)
        largest, ctx_words = ctx_suggestion(largest, request.n_ctx_train)
        remedy = _remedy(request, budget, binding, blockers, largest, rungs, price, avail_wait, gpu_free)
    except _Unpriced as e:
        remedy = f"price {request.key} at other settings (a term is unavailable: {e})"
    movable = [r for r in (*forced, *pool, *busy) if any(r.bytes.get(d, 0) for d in binding)]
    evictable_words = f"after evicting {_keys(movable)}" if movable else "with nothing evictable"
    place = "" if rungs.kind in ("ram", "full") else f" ({describe(config, request.n_layer)})"
    reason = (f"{request.key} needs {_per_device(need, binding)} at {_ctx_words(config, request.n_ctx_train)}"
              f"{place}; {_per_device(avail_wait, binding)} free {evictable_words}")
    if largest is not None:
        reason += f"; {ctx_words}"
    elif asked > smallest:
        reason += f"; no ctx from {smallest} up fits"
    return refusal(reason, remedy, config, need, fp, largest)


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
    request: PlanRequest, gpus: tuple[str, ...], price: _Prices, room: Mapping[str, int],
    prefer_gpu: bool, policy: Policy, asked: int, free: Mapping[str, int] = _EMPTY,
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
        return _search(_Rungs(request, gpus, k * step, free), price, room, prefer_gpu)[0] is not None

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
    largest: int | None, rungs: _Rungs, price: _Prices, avail: Mapping[str, int], free: Mapping[str, int] = _EMPTY,
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
        if _search(_Rungs(wider, budget.gpu_names, request.config.n_ctx, free), price, avail, True)[0] is not None:
            parts.append("allow CPU offload (alloc mode max-gpu)")
    for d in binding:
        b = budget.device(d)
        if b is not None and b.limit is not None and b.limit.bytes < b.total.bytes - b.reserve.bytes - b.others_bytes:
            parts.append(f"raise {'ram_limit' if d == HOST else 'gpu_limit'} ({b.limit.source})")
    if not parts:
        parts.append(f"free memory on {', '.join(binding) or 'the host'} or use a smaller quantization")
    return " or ".join(parts)
