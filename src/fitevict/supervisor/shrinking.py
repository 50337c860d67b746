"""policy.shrink_ctx in the supervisor: a refused contract retried at the largest context that fits (when the
request fits it), and a seat already shrunk for a contract serving the requests it holds (``fitevict.shrink``)."""

from __future__ import annotations

import logging
from dataclasses import replace

from fitevict.request.catalog import CatalogEntry
from fitevict.request.contract import Contract
from fitevict.shrink import Need, shrunk_ctx
from fitevict.schedule.errors import Refused
from fitevict.schedule.scheduler import Waiter
from fitevict.supervisor.ports import Ports

log = logging.getLogger("fitevict.supervisor")


def resident_shrunk(parts: Ports, entry: CatalogEntry, contract: Contract | None, need: Need | None,
                     timing: dict | None) -> Contract | None:
    """A seat already shrunk for this contract's context serves every request it holds (no reload per request)."""
    seat = parts.seats.get(entry.key)
    if (not parts.config.policy.shrink_ctx or need is None or need.tokens is None or contract is None
            or seat is None or seat.shrunk_from is None or seat.shrunk_from["asked_ctx"] != contract.ctx):
        return contract
    if seat.config.n_ctx // (seat.config.n_parallel or 4) < need.tokens:
        return contract
    if timing is not None:
        timing["ctx_shrunk"] = {**seat.shrunk_from, "need": need.to_json()}
    return replace(contract, ctx=seat.config.n_ctx)


def shrunk_waiter(parts: Ports, e: Refused, w: Waiter, entry: CatalogEntry, contract: Contract | None,
                  need: Need | None, timing: dict | None) -> Waiter:
    """The waiter for the same request at the largest context that fits (policy.shrink_ctx), or ``e`` again."""
    plan_cfg = e.plan.config
    slots = w.request.config.n_parallel or 4  # no -np: the engine's 4 slots share the context
    ctx = shrunk_ctx(e.plan.largest_ctx, slots, need.tokens if need else None)
    if not parts.config.policy.shrink_ctx or ctx is None or plan_cfg is None:
        raise e
    shrunk = replace(contract or Contract(), ctx=ctx)
    parts.desk.shrinks[(entry.key, ctx)] = {"asked_ctx": plan_cfg.n_ctx, "loaded_ctx": ctx, "refusal": e.plan.reason}
    if timing is not None:
        timing["ctx_shrunk"] = {**parts.desk.shrinks[(entry.key, ctx)], "need": need.to_json() if need else None}
    log.info("%s: ctx %s does not fit; loading at ctx %s, which holds this request (%s)", entry.key,
             plan_cfg.n_ctx, ctx, need.why if need else "")
    return Waiter(parts.planning.request_for(entry, shrunk), w.arrived, w.request_id, keep_alive=w.keep_alive)
