"""What fitevict has learned about its engines, read into a price book: one path for the server and the CLI.

A price book prices a model as the server will: with the engine process's own overhead (calibrated once per build,
raised by what loads have shown since), the transformers seats' overheads, every file's correction from its
accepted loads, and the stored measurements of the same signatures. ``prime_price_book`` reads all of it from the
store and the cache, so ``fitevict plan`` offline and the server's plan price the same state alike, and
``plan_policy`` gives both the same policy from the same config.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fitevict import planner as pl
from fitevict.config import Config
from fitevict.engines import build_pricer
from fitevict.engines.base import Unavailable
from fitevict.host.cpu import Cpu, this_cpu
from fitevict.pricing.footprint import HOST
from fitevict.store import Store
from fitevict.store.faults import STORE_FAULTS, reason
from fitevict.prices.book import HISTORY_LOADS, PriceBook, torch_version

log = logging.getLogger("fitevict.prices")

def torch_overhead_key(*, adapters: bool = False, cpu: Cpu | None = None, torch: str | None = None) -> str:
    """The store key of a transformers seat's own process bytes on this CPU with this torch (a seat with PEFT
    adapters imports peft too: its own key). Keyed by the CPU's fingerprint and torch's version: another machine's
    figure, or one taken under another torch (other libraries, other sizes), is not this one's. ``torch=""``: the
    older key, before torch's version keyed it."""
    kind = "transformers+peft" if adapters else "transformers"
    torch = torch_version() if torch is None else torch
    return f"engine-overhead:{kind}@{(cpu or this_cpu()).fingerprint}" + (f"+torch-{torch}" if torch else "")


def read_torch_overhead(book: PriceBook, store: Store, *, adapters: bool) -> tuple[int | None, str]:
    """A transformers seat's own process bytes stored for this CPU and torch, and where they came from: under the
    key with torch's version, else under the older key without it (read, and said so), else None."""
    key = torch_overhead_key(adapters=adapters, cpu=book.cpu, torch=book.torch)
    if got := store.compute_get(key):
        return int(got[HOST]), f"stored under {key}"
    old = torch_overhead_key(adapters=adapters, cpu=book.cpu, torch="")
    if got := store.compute_get(old):
        return int(got[HOST]), (f"stored under the older key {old}, before torch's version keyed it (this torch is "
                                f"{book.torch}); a seat measured here stores it under {key}")
    return None, "no seat was measured on this machine with this torch yet"


def overhead_key(binary: Path, cpu: Cpu | None = None) -> str:
    """The store key of what loads have shown of ``binary``'s process overhead (the part that does not scale with
    the model: keyed with the calibration record's version, whose figure it raises) on this machine: the engine
    build and the CPU (the build's family keys it), so that another machine sharing the store never raises this
    one's."""
    return build_pricer().overhead_key(binary, cpu)


def plan_policy(config: Config) -> pl.Policy:
    """The planner's policy from the config: the server's plans and ``fitevict plan`` use this one."""
    return pl.Policy(exclusive_fraction=config.policy.exclusive_fraction,
                     eviction=config.policy.eviction)  # type: ignore[arg-type]


def prime_price_book(book: PriceBook, store: Store, binary: Path, *, calibrate: bool) -> None:
    """Read what was learned into ``book`` (blocking I/O: run it off the event loop). ``calibrate``: measure the
    engine's process overhead now when this build was never calibrated (the server does; a dry ``plan`` does not,
    and then prices without it, as a first load would before calibration)."""
    build = build_pricer()
    can = build.calibratable(binary)
    calibrated = build.calibrated_overhead(binary) if can else None
    book.overhead_origin = (f"{binary} is not an executable named llama-server, so it was never calibrated"
                            if not can else "this engine build was never calibrated on this machine")
    if calibrated is None and calibrate and can:
        # first serve with this build: measure its own process overhead once, on the smallest model, filled
        got = build.calibrate_overhead(binary, timeout_s=60.0)
        calibrated = None if isinstance(got, Unavailable) else {k: int(v) for k, v in got["overhead"].items()}
        if isinstance(got, Unavailable):
            book.overhead_origin = f"its calibration failed: {got.reason}"
    if calibrated:
        book.engine_overhead.update(calibrated)
        book.overhead_origin = "calibrated"
    book.engine_pages = build.shared_pages(binary)  # measured by its calibration, else the rule (its files' sizes)
    book.torch_overhead, book.torch_origin = read_torch_overhead(book, store, adapters=False)
    book.peft_overhead, _ = read_torch_overhead(book, store, adapters=True)
    for dev, n in (store.compute_get(overhead_key(binary, book.cpu)) or {}).items():  # loads since raise it (lower bounds)
        if dev == HOST and int(n) > book.engine_overhead.get(HOST, 0):
            book.overhead_origin = "raised"
        book.engine_overhead[dev] = max(int(n), book.engine_overhead.get(dev, 0))
    book.learn_history([ev.details for ev in store.events(event="load", limit=HISTORY_LOADS)])
    book.learn_outgrowths((ev.time, ev.details) for ev in store.events(event="outgrew", limit=HISTORY_LOADS))
    book.forget()


async def learn_torch_overhead(book: PriceBook, store: Store, seen: int, *, adapters: bool = False) -> None:
    """A transformers seat's own process (Python, torch, their libraries, the seat server) beyond its priced model:
    measured (PSS minus the price), the largest seen kept, stored, and added to every transformers price. A seat with
    PEFT adapters (peft imported too) is learned apart."""
    known = book.peft_overhead if adapters else book.torch_overhead
    if seen > (known or 0):
        if adapters:
            book.peft_overhead = seen
        else:
            book.torch_overhead = seen
        book.forget()
        key = torch_overhead_key(adapters=adapters, cpu=book.cpu, torch=book.torch)
        if not adapters:
            book.torch_origin = f"stored under {key}"
        await store_learned(store, key, {HOST: seen})


async def learn_engine_overhead(book: PriceBook, store: Store, binary: Path, grown: dict[str, int]) -> None:
    """A load showed ``binary``'s process holding more beyond its buffers than known: raise it, and store it."""
    book.engine_overhead.update(grown)
    if HOST in grown:
        book.overhead_origin = "raised"
    book.forget()
    await store_learned(store, overhead_key(binary, book.cpu), dict(book.engine_overhead))


async def store_learned(store: Any, key: str, value: dict[str, int]) -> None:
    """Store a learned figure (an engine's overhead); a refusal is logged: this process keeps using it, and the next
    one learns it again."""
    try:
        await store.aio.compute_put(key, value)
    except STORE_FAULTS as e:
        log.warning("the learned %s not stored: %s; learned again by the next fitevict", key, reason(e))
