"""Restoring a saved prompt for a request on a freshly loaded llama-server seat (see ``supervisor.kvkeep``).

Called by the fast path with the seat held, before the body goes to the engine. While the seat has saved prompts of
its own signature not yet tried (and for its first few requests only), the request is tokenized by the engine, the
saved prompt sharing the longest prefix is restored into an idle slot, and the body is sent to that slot. Once the
answer has gone out, its own timings say whether the restore counted (``kvkeep.restore_effect``), and the
``kv-restore`` event records it: ``effective`` true, or false ("not effective") with the restored tokens against the
prompt tokens the engine processed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from fitevict.engines import loopback, traits
from fitevict.store.records import Event
from fitevict.supervisor.kvkeep import Restored, SavedPrompt, engine_seconds, restore_effect

log = logging.getLogger("fitevict.kvkeep")
MAX_CHECKS = 4  # requests a new seat compares with its saved prompts before it stops looking


async def _prompt_tokens(c: httpx.AsyncClient, endpoint: str, body: dict) -> list[int] | None:
    """The request's prompt as the engine tokenizes it (chat template applied, special tokens as the server adds)."""
    if endpoint == "chat":
        if not isinstance(body.get("messages"), list):
            return None
        extra = {k: body[k] for k in ("tools", "chat_template_kwargs") if k in body}
        r = await c.post("/apply-template", json={"messages": body["messages"], **extra})
        r.raise_for_status()
        text = r.json()["prompt"]
    elif endpoint == "completions" and isinstance(body.get("prompt"), str):
        text = body["prompt"]
    else:
        return None
    r = await c.post("/tokenize", json={"content": text, "add_special": True, "parse_special": True})
    r.raise_for_status()
    return [int(t) for t in r.json()["tokens"]]


async def _idle_slot(c: httpx.AsyncClient) -> int:
    r = await c.get("/slots")
    if r.status_code == 200:
        for s in r.json():
            if not s.get("is_processing"):
                return int(s["id"])
    return 0


async def _restore(c: httpx.AsyncClient, slot: int, saved: SavedPrompt, shared: int, prompt: int) -> Restored:
    r = await c.post(f"/slots/{slot}", params={"action": "restore"}, json={"filename": saved.file})
    r.raise_for_status()
    doc = r.json()
    rate = saved.prompt_per_second
    return Restored(file=saved.file, slot=slot, shared_tokens=shared, prompt_tokens=prompt,
                    kv_restored_tokens=int(doc["n_restored"]),
                    kv_restore_seconds=engine_seconds(doc, "restore_ms"),
                    prefill_seconds_saved=round(shared / rate, 3) if rate else None)


async def restore_for(sup: Any, seat: Any, endpoint: str, body: dict, request_id: str) -> tuple[dict, Restored | None]:
    """The body to send (with ``id_slot`` when a saved prompt was restored for it) and what was restored."""
    if not seat.kv_candidates or not traits(seat.engine).keeps_prompts:
        return body, None
    seat.kv_checks += 1
    if seat.kv_checks > MAX_CHECKS:
        seat.kv_candidates = []
        return body, None
    try:
        async with loopback.aclient(seat.base_url, 60) as c:
            tokens = await _prompt_tokens(c, endpoint, body)
            got = None if tokens is None else await asyncio.to_thread(sup.kv.best, seat.kv_candidates, tokens)
            if got is None:
                return body, None
            saved, shared = got
            seat.kv_candidates = [s for s in seat.kv_candidates if s.file != saved.file]
            done = await _restore(c, await _idle_slot(c), saved, shared, len(tokens))
    except (httpx.HTTPError, KeyError, ValueError) as e:
        log.warning("%s: restoring a saved prompt failed, the request runs cold: %s", seat.key, e)
        return body, None
    return {**body, "id_slot": done.slot}, done


async def record_restore(sup: Any, seat: Any, done: Restored, timings: dict[str, float], request_id: str) -> dict:
    """The ``kv-restore`` event, once the answer after the restore has gone out: what was restored, and whether the
    engine's own timings of that answer show the restored prefix kept (``restore_effect``). Returns the effect."""
    effect = restore_effect(done, timings)
    said = {True: "effective", False: "not effective", None: "effect unknown"}[effect["effective"]]
    if effect["effective"] is False:
        log.warning("%s: %s", seat.key, effect["effect"])
    await sup.record(Event(time=sup.clock(), event="kv-restore", model=seat.key, engine=seat.engine,
                           seconds=done.kv_restore_seconds, request_id=request_id,
                           reason=f"restored {done.kv_restored_tokens} saved tokens into slot {done.slot}, {said}: the "
                                  f"request shares {done.shared_tokens} of them; the engine then processed "
                                  f"{_count(effect['engine_prompt_n'])} of its {done.prompt_tokens} prompt tokens",
                           details={**done.to_json(), **effect, "signature": seat.signature}))
    return effect


def _count(n: int | None) -> str:
    return "an unreported number" if n is None else str(n)


__all__ = ["record_restore", "restore_for"]
