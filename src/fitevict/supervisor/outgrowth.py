"""Seats that outgrow their price: the memory sampler's latest reading of each seat against what it was priced at.

A seat holds more than its price when its context fills beyond a stale price, when its engine leaks, or when a
transformers seat keeps tensors. The planner counts the live reading already (``SeatState.bytes_on``); this is the
seat's mark: once its reading exceeds its price by more than ``budget.outgrow_margin`` (the rule is
:func:`fitevict.pressure.outgrowth`), it gets one ``outgrew`` history event with the figures and its growth rate since
its load, it is marked in the residents view, ``ps``, the dashboard and ``/metrics``, and under memory pressure it is
stopped before every healthy idle seat (the eviction policy's one order, ``planner.eviction``). The price book learns
from it: the seat's peak reading per device less its price (``pricing.grown``) joins the next price of the same file
and configuration on this machine, and the event carries it (``price_learned``) so that a restart learns it again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

from fitevict.engines import prices_own_process
from fitevict.pressure import Outgrowth, outgrowth
from fitevict.pricing.grown import Grown, grown, without_grown
from fitevict.pricing.footprint import HOST
from fitevict.schedule.seats import SERVING
from fitevict.store.records import Event
from fitevict.supervisor.ports import Ports
from fitevict.seat.running import SeatState

log = logging.getLogger("fitevict.outgrowth")

SOURCE = ("measured: the memory sampler's latest reading (host: PSS of the process tree from smaps_rollup; GPU: NVML "
          "bytes of its processes) against the seat's price (predicted); growth rate from the reading after its load")


def seat_outgrowth(seat: SeatState, bound: int, now: float, unpriced: int = 0) -> Outgrowth | None:
    """The device on which ``seat``'s latest reading exceeds its price by the most beyond ``bound`` (None: none).
    ``unpriced``: host bytes its price knowingly left out and that are known now (a transformers seat priced before
    this machine's first such seat measured its process), counted with the price."""
    live = seat.live_bytes()
    found = []
    for dev in (HOST, *seat.config.devices):
        since = now - seat.load_read_at if seat.load_read_at is not None else None
        price = seat.predicted.bytes_on(dev) + (unpriced if dev == HOST else 0)
        o = outgrowth(dev, live.get(dev), price, bound, seat.load_bytes.get(dev), since)
        if o is not None:
            found.append(o)
    return max(found, key=lambda o: o.over - o.bound, default=None)


async def check_outgrowth(parts: Ports, now: float) -> list[Event]:
    """After a reading of every seat: each serving seat that now outgrows its price (and did not before) is marked
    and gets its one ``outgrew`` event. Returns the events recorded."""
    bound = int(parts.config.budget.outgrow_margin)
    out = []
    for seat in list(parts.seats.values()):
        if seat.outgrew is not None or seat.load_read_at is None or seat.state not in SERVING:
            continue
        unpriced = 0
        if prices_own_process(seat.engine):  # its overhead, if learned only after its price was made
            known = parts.prices.torch_overhead_for(seat.config.loras) or 0
            unpriced = max(0, known - (seat.predicted_overhead or 0))
        found = seat_outgrowth(seat, bound, now, unpriced)
        if found is None:
            continue
        seat.outgrew = {**found.to_json(), "at": now, "readings": seat.readings}
        learned = await _learn(parts, seat, now, unpriced)
        alloc = seat.measured.bytes_on(found.device) if seat.measured is not None else None
        ev = Event(time=now, event="outgrew", model=seat.key, engine=seat.engine, reason=found.reason(seat.key),
                   host_bytes=found.reading if found.device == HOST else None,
                   vram_bytes=found.reading if found.device != HOST else None,
                   predicted_bytes=seat.predicted.whole_bytes, buffers_predicted_bytes=seat.predicted.total_bytes,
                   engine_reported_bytes=seat.measured.total_bytes if seat.measured is not None else None,
                   details={**found.to_json(), "source": SOURCE, "config": seat.config.to_json(),
                            "machine": parts.prices.machine, "pid": seat.pid, "readings": seat.readings,
                            "allocated_bytes": alloc, "overhead_bytes": seat.overhead_on(found.device),
                            "overhead_source": seat.overhead_source(found.device),
                            "planned_bytes": seat.bytes_on(found.device), "unpriced_overhead_bytes": unpriced,
                            "peak_bytes": seat.peak_bytes.get(found.device), "price_learned": learned})
        log.warning("%s", ev.reason)
        out.append(await parts.history.record(ev))
    return out


async def _learn(parts: Ports, seat: SeatState, now: float, unpriced: int) -> dict | None:
    """What the price book learns from ``seat``'s outgrowth (``pricing.grown``): its peak reading per device less its
    price without any earlier lesson; the next price of its file and configuration on this machine includes it. The
    event's ``price_learned`` (None when the file cannot be read, with the reason in the log)."""
    price = {d: without_grown(seat.predicted, d) + (unpriced if d == HOST else 0) for d in (HOST, *seat.config.devices)}
    g: Grown | None = grown(seat.peak_bytes, price, now)
    if g is None:
        return None
    try:
        st = await asyncio.to_thread(os.stat, seat.model_path)
    except OSError as e:
        log.warning("%s: its outgrowth is not learned, because its file cannot be read: %s", seat.key, e)
        return None
    ident = (str(seat.model_path), st.st_size, st.st_mtime_ns)
    parts.prices.learn_outgrowth(ident, seat.config, g)
    return {**g.to_json(), "file": {"path": ident[0], "size": ident[1], "mtime_ns": ident[2]},
            "priced_bytes": price, "label": g.label()}


async def recycle(parts: Ports, outgrew: Event, load: Callable[[str], Awaitable[object]]) -> None:
    """``policy.recycle_outgrown``: the seat that ``outgrew`` names is drained (it takes nothing new; requests for the
    model wait), stopped once its requests in flight end (a ``recycle`` event with the outgrowth's figures) and
    loaded again: by the requests waiting for it, else here (``load``: its default configuration), priced with
    what it outgrew to (``pricing.grown``)."""
    key = outgrew.model
    record = parts.scheduler.seats.get(key)
    if record is None or parts.seats.get(key) is None:
        return
    reason = (f"recycled (policy.recycle_outgrown): {outgrew.reason}; {record.in_flight} request(s) in flight when "
              "it outgrew, drained before the stop; loaded again for the requests waiting, else at once (its default "
              "configuration)")
    fut = parts.desk.stop_future(key)
    if not parts.scheduler.unload(key, reason, event="recycle"):
        parts.desk.forget_stop_future(key, fut)
        return
    await fut
    if not parts.scheduler.waiting(key) and not parts.desk.closed and parts.seats.get(key) is None:
        try:
            await load(key)
        except Exception as e:  # noqa: BLE001 - the model loads on its next request; the failure is in history
            log.warning("%s: loading it again after its recycle failed: %s: %s", key, type(e).__name__, e)


__all__ = ["SOURCE", "check_outgrowth", "recycle", "seat_outgrowth"]
