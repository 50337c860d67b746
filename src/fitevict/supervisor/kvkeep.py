"""The prompt cache kept across swaps: llama-server slots saved before a seat stops, restored when it loads again.

Seats start with ``--slot-save-path <data_dir>/kv``. Before a seat is evicted or unloaded for idleness, every slot
holding a prompt of at least ``policy.prompt_cache_min_tokens`` tokens is saved (``POST /slots/{id}?action=save``),
each file beside a JSON record: model, the seat's signature (the model file, its load configuration, and the engine
build on this CPU), token count, bytes and the seat's prefill rate as its engine timed it. The files, all models
together, stay within ``policy.prompt_cache_disk`` and never take the data dir's disk below 1 GiB free: the oldest
go first. A saved prompt that a newer one of the same signature extends is replaced by it.

When a seat with the same signature loads again, the first requests it serves are tokenized by the engine itself
(``/apply-template`` for chats, ``/tokenize`` with special tokens, as the server does) and compared token by token
with each saved prompt; the one sharing the longest prefix (at least half of ``prompt_cache_min_tokens``) is
restored into a slot, and the request is sent to that slot (``id_slot``). Nothing else is ever restored: a file
of another signature or engine build is not a candidate, and a restore that fails is logged and the request runs
cold.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from fitevict.engines import loopback, saved_prompt, traits
from fitevict.units import GiB, format_size

log = logging.getLogger("fitevict.kvkeep")
DISK_FLOOR = 1 * GiB  # saved prompts never take the data dir's disk below this much free
ESTIMATE = ("estimate: shared prefix tokens / the prefill rate the model's last seat measured over its prefills of "
            "256 tokens or more (its engine timings)")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(frozen=True, slots=True)
class SavedPrompt:
    """One saved slot, as its JSON record beside the file says."""

    file: str  # the file's name in the keep's directory
    model: str
    signature: str  # model file + load configuration + engine build @ CPU: only an identical seat restores it
    engine: str  # the engine build @ CPU, for the record
    tokens: int  # the engine's count of what it saved (n_saved)
    bytes: int  # the engine's count of what it wrote (n_written)
    saved_at: float
    save_seconds: float | None  # the engine's save_ms, in seconds; None when its answer had none (``engine_seconds``)
    prompt_per_second: float | None  # the seat's prefill rate (its engine timings); None when it had none


@dataclass(frozen=True, slots=True)
class Restored:
    """A restore done for one request: engine-reported tokens and seconds, and the estimate of prefill saved."""

    file: str
    slot: int
    shared_tokens: int  # the request's prompt and the saved one share this many leading tokens (compared here)
    prompt_tokens: int  # the request's prompt, as the engine tokenized it
    kv_restored_tokens: int  # the engine's n_restored
    kv_restore_seconds: float | None  # the engine's restore_ms, in seconds; None when its answer had none
    prefill_seconds_saved: float | None  # an estimate (ESTIMATE); None when no prefill rate was known

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "sources": {
            "shared_tokens": "compared token by token with the engine's own tokenization of the request",
            "prompt_tokens": "the engine's own tokenization of the request (/apply-template, /tokenize)",
            "kv_restored_tokens": "engine-reported: n_restored",
            "kv_restore_seconds": timing_source(self.kv_restore_seconds, "restore_ms"),
            "prefill_seconds_saved": ESTIMATE if self.prefill_seconds_saved is not None else
            "unavailable, because the model's last seat prefilled no long prompt"}}


def restore_effect(done: Restored, timings: Mapping[str, float]) -> dict[str, Any]:
    """Whether a restore counted, from the next answer's own timings (llama.cpp #26676: a restore can report success
    and the engine still process the whole prompt again). The restored prefix counts as kept when the engine took
    all of it but at most one token from its cache (``timings.cache_n``; llama-server evaluates the last token of a
    prompt it holds whole again, for its logits); without ``cache_n``, when it processed (``timings.prompt_n``) no
    more than the prompt's tokens beyond the shared prefix, plus that one."""
    prompt_n, cache_n = timings.get("prompt_n"), timings.get("cache_n")
    figures = {"kv_restored_tokens": done.kv_restored_tokens, "shared_tokens": done.shared_tokens,
               "prompt_tokens": done.prompt_tokens, "engine_prompt_n": None if prompt_n is None else int(prompt_n),
               "engine_cache_n": None if cache_n is None else int(cache_n)}
    if cache_n is not None:
        again = max(0, done.shared_tokens - int(cache_n))
        how = "the shared prefix less the engine's timings.cache_n"
    elif prompt_n is not None:
        again = max(0, int(prompt_n) - (done.prompt_tokens - done.shared_tokens))
        how = "the engine's timings.prompt_n less the prompt's tokens beyond the shared prefix"
    else:
        return {**figures, "effective": None, "reprocessed_tokens": None,
                "effect": "unavailable, because the answer after the restore carried no timings.prompt_n or cache_n"}
    effective = again <= 1
    said = (f"effective: the engine processed {figures['engine_prompt_n']} prompt tokens, {again} of the "
            f"{done.shared_tokens} restored" if effective else
            f"not effective: the restore reported {done.kv_restored_tokens} tokens restored, yet the engine "
            f"processed {figures['engine_prompt_n']} prompt tokens, {again} of the {done.shared_tokens} shared ones "
            "again (llama.cpp #26676)")
    return {**figures, "effective": effective, "reprocessed_tokens": again, "effect": said,
            "reprocessed_source": f"engine-reported: {how}"}


def engine_seconds(doc: Any, key: str) -> float | None:
    """One of the engine's own timings of a slot action (``timings[key]``, milliseconds) in seconds; None when its
    answer did not send it (never 0.0: ``timing_source`` says why)."""
    v = (doc.get("timings") or {}).get(key) if isinstance(doc, dict) else None
    return float(v) / 1000 if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def timing_source(seconds: float | None, key: str) -> str:
    return (f"measured by the engine: timings.{key}" if seconds is not None else
            f"unavailable, because the engine's answer had no timings.{key}")


class PromptKeep:
    """The saved prompts on disk, and the engine calls that save and restore them."""

    def __init__(self, root: Path, *, min_tokens: int, disk_budget: int) -> None:
        self.root = root
        self.min_tokens = min_tokens
        self.disk_budget = disk_budget

    def prepare(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root

    def index(self) -> list[SavedPrompt]:
        """Every saved prompt whose record and file are both there (a record without its file is dropped)."""
        out = []
        for rec in sorted(self.root.glob("*.json")) if self.root.is_dir() else []:
            try:
                saved = SavedPrompt(**json.loads(rec.read_text()))
            except (OSError, ValueError, TypeError) as e:
                log.warning("ignoring the saved prompt record %s: %s", rec, e)
                continue
            if (self.root / saved.file).is_file():
                out.append(saved)
            else:
                rec.unlink(missing_ok=True)
        return out

    def sweep(self) -> list[tuple[str, str]]:
        """At start: remove what a save that never finished left (fitevict killed during it): a slot file without its
        record, a file shorter or longer than its record says (the engine's n_written), a record that cannot be read
        or whose file is gone, a record half written. Returns (name, why) for each file removed, also logged."""
        removed: list[tuple[str, str]] = []
        files = {p.name: p for p in self.root.iterdir() if p.is_file()} if self.root.is_dir() else {}
        kept: set[str] = set()
        for name, path in files.items():
            if not name.endswith(".json"):
                continue
            try:
                saved = SavedPrompt(**json.loads(path.read_text()))
                size = files[saved.file].stat().st_size if saved.file in files else None
            except (OSError, ValueError, TypeError) as e:
                size, why = None, f"its record cannot be read ({e})"
            else:
                why = (f"its slot file {saved.file} is missing" if size is None else
                       f"its slot file has {size} bytes, its record says {saved.bytes}" if size != saved.bytes else "")
            if not why:
                kept.update((name, saved.file))
                continue
            removed.append((name, why))
        removed += [(n, "a record half written" if n.endswith(".tmp") else
                     "a slot file without a record: its save never finished")
                    for n in files if n not in kept and not n.endswith(".json")]
        for name, why in removed:
            (self.root / name).unlink(missing_ok=True)
            log.warning("saved prompt %s removed: %s", name, why)
        return removed

    def matching(self, signature: str) -> list[SavedPrompt]:
        return [s for s in self.index() if s.signature == signature]

    def drop(self, saved: SavedPrompt) -> None:
        (self.root / saved.file).unlink(missing_ok=True)
        (self.root / f"{saved.file}.json").unlink(missing_ok=True)

    def _room(self) -> int:
        """Bytes the keep may still write: within its budget, and above the disk floor."""
        used = sum(s.bytes for s in self.index())
        free = shutil.disk_usage(self.root).free
        return max(0, min(self.disk_budget - used, free - DISK_FLOOR))

    def _fit(self, keep: SavedPrompt) -> bool:
        """Drop the oldest other prompts until ``keep`` fits the budget; False (and ``keep`` dropped, the others
        kept) when it cannot fit even alone."""
        if keep.bytes > self.disk_budget:
            self.drop(keep)
            return False
        while self._room() < 0 or sum(s.bytes for s in self.index()) > self.disk_budget:
            others = sorted((s for s in self.index() if s.file != keep.file), key=lambda s: s.saved_at)
            if not others:
                self.drop(keep)
                return False
            self.drop(others[0])
        if shutil.disk_usage(self.root).free < DISK_FLOOR:
            self.drop(keep)
            return False
        return True

    async def save(self, port: int, model: str, signature: str, engine: str,
                   prompt_per_second: float | None) -> tuple[list[SavedPrompt], list[str]]:
        """Save every slot of the seat at ``port`` holding at least ``min_tokens`` tokens. Returns what was saved and
        a note for each slot that was not (and why)."""
        saved: list[SavedPrompt] = []
        notes: list[str] = []
        async with loopback.aclient(f"http://127.0.0.1:{port}", 120) as client:
            r = await client.get("/slots")
            if r.status_code != 200:
                return [], [f"GET /slots answered {r.status_code}: nothing saved"]
            slots = sorted(r.json(), key=lambda s: -int(s.get("n_prompt_tokens") or 0))
            for slot in slots:
                n = int(slot.get("n_prompt_tokens") or 0)
                if n < self.min_tokens:
                    continue
                if self._room() <= 0:
                    notes.append(f"slot {slot['id']}: {n} tokens not saved: no room within policy.prompt_cache_disk="
                                 f"{format_size(self.disk_budget)} and {format_size(DISK_FLOOR)} of disk kept free")
                    break
                got = await self._save_one(client, int(slot["id"]), model, signature, engine, prompt_per_second)
                if isinstance(got, str):
                    notes.append(got)
                else:
                    saved.append(got)
        return saved, notes

    async def _save_one(self, client: httpx.AsyncClient, slot: int, model: str, signature: str, engine: str,
                        rate: float | None) -> SavedPrompt | str:
        name = f"{hashlib.sha256(signature.encode()).hexdigest()[:16]}-{time.time_ns()}-s{slot}.bin"
        r = await client.post(f"/slots/{slot}", params={"action": "save"}, json={"filename": name})
        if r.status_code != 200:
            return f"slot {slot}: the engine answered {r.status_code} to save: {r.text[:200]}"
        doc = r.json()
        keep = SavedPrompt(file=name, model=model, signature=signature, engine=engine, tokens=int(doc["n_saved"]),
                           bytes=int(doc["n_written"]), saved_at=time.time(),
                           save_seconds=engine_seconds(doc, "save_ms"),
                           prompt_per_second=rate)
        await asyncio.to_thread(self._file, keep)
        if not await asyncio.to_thread(self._fit, keep):
            return f"slot {slot}: {keep.tokens} tokens ({format_size(keep.bytes)}) do not fit the disk budget"
        return keep

    def _file(self, keep: SavedPrompt) -> None:
        """Write ``keep``'s record; drop older prompts of the same signature that it extends."""
        record, tmp = self.root / f"{keep.file}.json", self.root / f"{keep.file}.json.tmp"
        tmp.write_text(json.dumps(asdict(keep)))
        tmp.replace(record)  # a record is whole or absent, never half written
        new = saved_prompt(self.root / keep.file)
        for old in self.matching(keep.signature):
            if old.file == keep.file:
                continue
            with contextlib.suppress(OSError, ValueError):
                tokens = saved_prompt(self.root / old.file)
                if common_prefix(tokens, new) == len(tokens):
                    self.drop(old)

    def best(self, candidates: Sequence[SavedPrompt], prompt: Sequence[int]) -> tuple[SavedPrompt, int] | None:
        """The saved prompt sharing the longest prefix with ``prompt`` (at least half of ``min_tokens``)."""
        best: tuple[SavedPrompt, int] | None = None
        for s in candidates:
            try:
                shared = common_prefix(saved_prompt(self.root / s.file), prompt)
            except (OSError, ValueError) as e:
                log.warning("saved prompt %s unreadable, dropped: %s", s.file, e)
                self.drop(s)
                continue
            if shared >= max(1, self.min_tokens // 2) and (best is None or shared > best[1]):
                best = (s, shared)
        return best


async def keep_before_stop(kv: PromptKeep, seat: Any, event: str, *, enabled: bool, machine: str,
                           clock: Callable[[], float]) -> dict[str, Any]:
    """Save the seat's long prompts before an eviction or idle unload (``enabled``: ``policy.prompt_cache``), keyed
    to this ``machine``; the stop event's details."""
    if event not in ("evict", "idle-unload") or not traits(seat.engine).keeps_prompts or not enabled:
        return {}
    t0 = clock()
    try:
        saved, notes = await kv.save(seat.port, seat.key, seat.signature, machine, seat.timings.bulk_prefill_rate())
    except Exception as e:  # noqa: BLE001 - a failed save costs the cache, never the stop
        why = f"{type(e).__name__}: {e}".rstrip(": ")  # a broken connection's error may have no words of its own
        log.warning("%s: saving its prompts before the stop failed: %s", seat.key, why)
        saved, notes = [], [f"saving failed: {why}"]
    return {"kv_saved": [{"file": s.file, "tokens": s.tokens, "bytes": s.bytes, "signature": s.signature,
                          "save_seconds": s.save_seconds,
                          "save_seconds_source": timing_source(s.save_seconds, "save_ms")} for s in saved],
            "kv_save_seconds": clock() - t0, "kv_save_notes": notes,
            "kv_save_source": "measured: the time the saves added to this stop; tokens and bytes engine-reported"}


__all__ = ["ESTIMATE", "PromptKeep", "Restored", "SavedPrompt", "common_prefix", "engine_seconds", "keep_before_stop",
           "restore_effect", "timing_source"]
