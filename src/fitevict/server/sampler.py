"""The memory sampler: while the server runs, it reads every seat (PSS and RSS of its process tree from
smaps_rollup, device bytes by the kind of device: NVML, DRM fdinfo, an rpc-server's PSS) and the host (MemAvailable), keeps each seat's peaks over
its serving window, and stores the window (``seat_peaks``) through the store's writer when the seat is gone. A
window the store refuses (its disk full, its file locked or corrupt) is logged with the reason, held, and stored
again, in order, from the next reading on (in a task of its own: a store that makes writes wait never delays a
reading); sampling goes on (``HELD``: windows held at most, the oldest dropped
and counted beyond it).

It is a task of the server app's lifespan, woken every ``server.sample_seconds`` and at once by every recorded
history event (``Supervisor.on_event``), so a stopped seat's window is closed and stored without waiting a tick.

The MemAvailable baseline of a window is the host reading of the tick before the seat was first seen: the drop
then includes the seat's load. With other seats resident in the window the drop is the host's, not this seat's
alone; ``details["other_seats"]`` says how many there were.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fitevict.host import procmem
from fitevict.host.devmem import DeviceMeters
from fitevict.host.nvml import read_gpus
from fitevict.store import Store
from fitevict.store.faults import STORE_FAULTS, reason
from fitevict.store.peaks import SeatPeaks, op_put_peaks
from fitevict.store.records import Event
from fitevict.schedule.seats import SeatStatus

log = logging.getLogger("fitevict.sampler")
HELD = 1000  # windows the store refused, held for the next try (one per seat that ended)


@dataclass(frozen=True, slots=True)
class SeatReading:
    """One reading of one seat. A figure is None only with its reason."""

    pss_bytes: int | None
    rss_bytes: int | None
    committed_bytes: int | None  # Pss_Anon + Pss_Shmem: what the host gets back when the seat stops
    pss_source: str
    pss_reason: str
    gpu_bytes: int | None
    gpu_reason: str
    memory: procmem.ProcessMemory | None = None  # the process tree as read (the seat's ``measured`` from now on)
    gpu_by_device: dict[str, int | None] = field(default_factory=dict)  # NVML bytes of its processes per GPU


@dataclass(frozen=True, slots=True)
class Window:
    """A seat's serving window so far (pure: :func:`fold` makes the next one)."""

    seat_id: str
    model: str
    engine: str
    config: dict[str, Any]
    started_at: float
    baseline_available_bytes: int | None
    baseline: str
    samples: int = 0
    peak_pss_bytes: int | None = None
    peak_rss_bytes: int | None = None
    peak_gpu_bytes: int | None = None
    min_available_bytes: int | None = None
    other_seats: int = 0
    sources: tuple[str, ...] = ()
    reasons: dict[str, str] = field(default_factory=dict)


def _peak(old: int | None, new: int | None) -> int | None:
    return new if old is None else old if new is None else max(old, new)


def fold(w: Window, r: SeatReading, available: int | None, available_reason: str, others: int) -> Window:
    """The window after one more reading: peaks only grow; a failed reading keeps its reason."""
    reasons = dict(w.reasons)
    for name, value, why in (("peak_pss_bytes", r.pss_bytes, r.pss_reason), ("peak_rss_bytes", r.rss_bytes,
                             r.pss_reason), ("peak_gpu_bytes", r.gpu_bytes, r.gpu_reason),
                             ("peak_available_drop_bytes", available, available_reason)):
        if value is None:
            reasons.setdefault(name, why)
    sources = w.sources if r.pss_bytes is None or r.pss_source in w.sources else (*w.sources, r.pss_source)
    return replace(w, samples=w.samples + 1, peak_pss_bytes=_peak(w.peak_pss_bytes, r.pss_bytes),
                   peak_rss_bytes=_peak(w.peak_rss_bytes, r.rss_bytes),
                   peak_gpu_bytes=_peak(w.peak_gpu_bytes, r.gpu_bytes),
                   min_available_bytes=(w.min_available_bytes if available is None else available
                                        if w.min_available_bytes is None else min(w.min_available_bytes, available)),
                   other_seats=max(w.other_seats, others), sources=sources, reasons=reasons)


def close(w: Window, now: float) -> SeatPeaks:
    """The stored record of a finished window."""
    drop = None
    if w.baseline_available_bytes is not None and w.min_available_bytes is not None:
        drop = max(0, w.baseline_available_bytes - min(w.min_available_bytes, w.baseline_available_bytes))
    values = {"peak_pss_bytes": w.peak_pss_bytes, "peak_rss_bytes": w.peak_rss_bytes,
              "peak_gpu_bytes": w.peak_gpu_bytes, "peak_available_drop_bytes": drop}
    reasons = {k: (w.reasons.get(k) or "unavailable, because the seat was never sampled")
               for k, v in values.items() if v is None}
    sources = {"pss": "+".join(w.sources) or "none", "rss": "+".join(w.sources) or "none",
               "gpu": "measured by device kind (host.devmem): NVML, DRM fdinfo, rpc-server PSS", "available_drop": "meminfo MemAvailable: baseline - lowest in the window"}
    return SeatPeaks(seat_id=w.seat_id, model=w.model, engine=w.engine, config=w.config, started_at=w.started_at,
                     ended_at=now, samples=w.samples, **values, baseline_available_bytes=w.baseline_available_bytes,
                     details={"sources": sources, "reasons": reasons, "other_seats": w.other_seats,
                              "baseline": w.baseline})


def _read(seats: list[tuple[str, int]], nvml: Any, devices_of: Mapping[str, Sequence[str]] | None = None
          ) -> tuple[int | None, str, dict[str, SeatReading]]:
    """Blocking reads (run in a thread): the host, then each (seat id, pgid) process tree and its device bytes: NVML's
    GPUs, and each of the seat's other devices (``devices_of``) by its kind of reader (``nvml``: the
    ``host.devmem.DeviceMeters``, or an NVML-like alone)."""
    try:
        available, available_reason = procmem.read_meminfo().available_bytes, ""
    except procmem.HostMemoryError as e:
        available, available_reason = None, f"unavailable, because {e}"
    meters = DeviceMeters.of(nvml)
    gpus = read_gpus(meters.nvml) if seats else None
    out: dict[str, SeatReading] = {}
    for seat_id, pgid in seats:
        tree = procmem.read_tree(pgid)
        if tree.source == "unavailable":
            pss = rss = None
            why = f"unavailable, because {tree.reason}"
        else:
            pss, rss, why = tree.host_bytes, tree.rss_bytes, ""
        wanted = [d for d in (devices_of or {}).get(seat_id, ()) if d in meters.readers
                  and meters.readers[d].kind != "nvml" and d not in meters.unified((d,))]
        other = meters.held_by(set(tree.pids), wanted)
        used: dict[str, int | None] = {d: r.bytes for d, r in other.items()}
        reasons = [f"{d}: {r.reason}" for d, r in other.items() if r.bytes is None]
        if gpus is not None and gpus.available:
            used.update(gpus.used_by(set(tree.pids)))
            if any(v is None for v in gpus.used_by(set(tree.pids)).values()):
                reasons.append("NVML does not attribute memory to the seat")
        elif not other:
            reasons.append(gpus.reason if gpus else "no reading")
        gpu = None if reasons else sum(v or 0 for v in used.values())
        gpu_why = "" if gpu is not None else f"unavailable, because {'; '.join(reasons)}"
        out[seat_id] = SeatReading(pss, rss, tree.committed_bytes, tree.source, why, gpu, gpu_why, tree, used)
    return available, available_reason, out


class MemorySampler:
    """Samples the supervisor's seats; :meth:`run` is the lifespan task, :meth:`stop` stores what is open."""

    def __init__(self, sup: Any, store: Store, interval: float) -> None:
        self.sup = sup
        self.store = store
        self.interval = interval
        self.windows: dict[str, Window] = {}
        self._last_available: int | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.ticks = 0  # readings taken of every seat so far
        self.unstored: list[SeatPeaks] = []  # windows the store refused, oldest first: tried again with the next
        self.dropped = 0  # windows dropped beyond ``HELD`` while the store refused them
        self._warned = 0  # windows held when the last refusal was logged
        self._flush: asyncio.Task | None = None  # the held windows' retry (``_retry_held``)

    def poke(self, _ev: Event | None = None) -> None:
        """Sample now (registered on ``Supervisor.on_event``)."""
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="fitevict-memory-sampler")

    async def run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.tick()
            except Exception:
                log.exception("the memory sampler failed; the peaks of the open windows stop here")
                raise
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)

    async def tick(self) -> None:
        live = {s.id: s for s in self.sup.seats.values()
                if s.pgid is not None and s.state is not SeatStatus.GONE}
        available, why, readings = await asyncio.to_thread(
            _read, [(i, s.pgid) for i, s in live.items()], self.sup.meters,
            {i: s.config.devices for i, s in live.items()})
        now = self.sup.clock()
        for seat_id in [i for i in self.windows if i not in live]:
            await self._store(self.windows.pop(seat_id), now)
        self._retry_held()  # refused before: the store may take them now (in the background, never delaying a reading)
        for seat_id, s in live.items():
            w = self.windows.get(seat_id)
            if w is None:
                first = self._last_available is None
                w = Window(seat_id, s.key, s.engine, s.config.to_json(), now,
                           available if first else self._last_available,
                           "the first reading, taken with the seat already running" if first else
                           "the host reading just before the seat was first seen")
            r = readings[seat_id]
            self.windows[seat_id] = fold(w, r, available, why, len(live) - 1)
            s.take_reading(now, r.memory, r.gpu_by_device)  # its measured figure, and its peak over its life
        if available is not None:
            self._last_available = available
        await self.sup.check_outgrowth(now)  # a seat whose reading now exceeds its price: one outgrew event
        # memory pressure from other programs: the seats' committed bytes now are what fitevict holds
        await self.sup.check_pressure({s.key: readings[i].committed_bytes for i, s in live.items()})
        # memory that came back (another program let go, the pressure cleared) admits what waits for it now
        self.sup.remeasured()
        self.ticks += 1

    async def _store(self, w: Window, now: float) -> None:
        """Store ``w``'s window now; behind the held ones (by the background retry) while some are; one the store
        refuses is held (the log says why)."""
        held = bool(self.unstored) or (self._flush is not None and not self._flush.done())
        self.unstored.append(close(w, now))
        if held:
            self._retry_held()
        else:
            await self._store_held()

    def _retry_held(self) -> None:
        """Try the held windows again in a task of their own (one at a time), so that a store that makes each write
        wait (a lock past the busy timeout) never delays the readings."""
        if self.unstored and (self._flush is None or self._flush.done()):
            self._flush = asyncio.get_running_loop().create_task(self._store_held(), name="fitevict-peaks-retry")

    async def _store_held(self) -> None:
        """Store the held windows, oldest first, until the store refuses one."""
        while self.unstored:
            peaks = self.unstored[0]
            try:
                await self.store.awrite(op_put_peaks(peaks, self.store.row_bounds))
            except STORE_FAULTS as e:
                if len(self.unstored) != self._warned:  # once per window held, not at every reading
                    self._warned = len(self.unstored)
                    log.warning("the memory peaks of %s (seat %s) not stored: %s; %d window(s) held, tried again at "
                                "each reading", peaks.model, peaks.seat_id, reason(e), len(self.unstored))
                break
            self.unstored.pop(0)
        if len(self.unstored) > HELD:
            self.dropped += len(self.unstored) - HELD
            log.error("the memory sampler dropped %d held window(s) (%d in all) while the store refused them",
                      len(self.unstored) - HELD, self.dropped)
            del self.unstored[:-HELD]

    async def stop(self) -> None:
        """Stop sampling and store every open window (ended now)."""
        if self._task is not None:
            self._task.cancel()
            # a failure of the task was logged where it happened (run); the open windows are stored regardless
            await asyncio.gather(self._task, return_exceptions=True)
        now = self.sup.clock()
        for w in list(self.windows.values()):
            await self._store(w, now)
        self.windows.clear()
        if self._flush is not None:
            await asyncio.gather(self._flush, return_exceptions=True)
        if self.unstored:
            log.error("the memory peaks of %d seat window(s) never stored, lost as fitevict stops: %s",
                      len(self.unstored), ", ".join(f"{p.model} (seat {p.seat_id})" for p in self.unstored))

    def open_windows(self) -> list[SeatPeaks]:
        """The windows still open, as they would be stored now (for the live report)."""
        now = self.sup.clock()
        return [close(w, now) for w in self.windows.values()]
