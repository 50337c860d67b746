"""policy.shrink_ctx in the supervisor: a refused contract retried at the largest context that fits (when the
request fits it), and a seat already shrunk for a contract serving the requests it holds (``fitevict.shrink``)."""

from __future__ import annotations

import logging
from dataclasses import replace

from fitevict.request.ask import Ask, ask
from fitevict.request.contract import Contract
from fitevict.shrink import Need, shrunk_ctx
from fitevict.schedule.errors import Refused
from fitevict.schedule.scheduler import Waiter
from fitevict.supervisor.ports import Ports

log = logging.getLogger("fitevict.supervisor")


def resident_shrunk(parts: Ports, asked: Ask, need: Need | None, timing: dict | None) -> Ask:
    """A seat already shrunk for this contract's context serves every request it holds (no reload per request)."""
    seat, contract = parts.seats.get(asked.entry.key), asked.contract
    if (not parts.config.policy.shrink_ctx or need is None or need.tokens is None or contract is None
            or seat is None or seat.shrunk_from is None or seat.shrunk_from["asked_ctx"] != contract.ctx):
        return asked
    if seat.config.n_ctx // (seat.config.n_parallel or 4) < need.tokens:
        return asked
    if timing is not None:
        timing["ctx_shrunk"] = {**seat.shrunk_from, "need": need.to_json()}
    return ask(asked.entry, replace(contract, ctx=seat.config.n_ctx), parts.prices)


def shrunk_waiter(parts: Ports, e: Refused, w: Waiter, asked: Ask, need: Need | None, timing: dict | None) -> Waiter:
    """The waiter for the same request at the largest context that fits (policy.shrink_ctx), or ``e`` again."""
    plan_cfg = e.plan.config
    slots = w.request.config.n_parallel or 4  # no -np: the engine's 4 slots share the context
    ctx = shrunk_ctx(e.plan.largest_ctx, slots, need.tokens if need else None)
    if not parts.config.policy.shrink_ctx or ctx is None or plan_cfg is None:
        raise e
    shrunk = ask(asked.entry, replace(asked.contract or Contract(), ctx=ctx), parts.prices)
    key = asked.entry.key
    parts.desk.shrinks[(key, ctx)] = {"asked_ctx": plan_cfg.n_ctx, "loaded_ctx": ctx, "refusal": e.plan.reason}
    if timing is not None:
        timing["ctx_shrunk"] = {**parts.desk.shrinks[(key, ctx)], "need": need.to_json() if need else None}
    log.info("%s: ctx %s does not fit; loading at ctx %s, which holds this request (%s)", key,
             plan_cfg.n_ctx, ctx, need.why if need else "")
    return Waiter(shrunk.request, w.arrived, w.request_id, keep_alive=w.keep_alive, origin=w.origin)
