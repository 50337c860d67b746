"""What a finished load teaches, from the reading right after it (``measure.Meter``): the engine overhead it showed
(a transformers seat's own process beyond its priced model; a llama-server seat's memory beyond its buffers, when
more than known), both stored; whether its measurement is plausible (``guard``: the walk of the weights a
transformers seat found, the measured total against the file's size and the last measurement of the same
signature); and, when accepted, the measurement stored, the price book told to price again, and the file's price
corrected at its other settings (a llama-server load of a model file with no projector). What it learned goes into
the load's record (``Learned.details``).

``Learning`` works with four parts: the price book, the store, the processes (the engine that reads the seat's log,
and its binary, which keys a learned overhead) and the clock (when the measurement was stored).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fitevict import guard as guard_mod
from fitevict.engines import traits
from fitevict.guard import Verdict
from fitevict.pricing.footprint import HOST
from fitevict.prices.book import PriceBook
from fitevict.prices.learned import learn_engine_overhead, learn_torch_overhead
from fitevict.prices.overhead import grown_overhead
from fitevict.store import Store
from fitevict.store.records import Measurement
from fitevict.seat.accounts import file_bytes
from fitevict.seat.measure import overhead_seen
from fitevict.seat.processes import Processes
from fitevict.seat.running import SeatState, log_text
from fitevict.seat.storing import last_measurement, store_measurement


@dataclass(frozen=True, slots=True)
class Learned:
    verdict: Verdict  # the guard's: an accepted measurement was stored
    details: dict[str, Any]  # what the load's record says of it


class Learning:
    def __init__(self, prices: PriceBook, store: Store, processes: Processes, clock: Callable[[], float]) -> None:
        self.prices, self.store, self.processes, self.clock = prices, store, processes, clock

    async def learn(self, seat: SeatState) -> Learned:
        """Learn the overhead, guard the measurement, store it if accepted."""
        prices, store = self.prices, self.store
        walk = self.processes.engine_for(seat.entry).document(log_text(seat.log_path))
        await self._overhead(seat, walk)
        measured_total = seat.measured.total_bytes if seat.measured else None
        previous = await last_measurement(store, seat.signature)
        verdict = guard_mod.check_walk(walk["walk"].get("weight_bytes")) if walk is not None else None
        if verdict is None or verdict.accepted:
            # the 1 MiB floor is llama.cpp's (its buffers alone exceed it); a walk that found weights is the proof
            # of a load for a transformers seat, so only the ratio against the same signature applies there
            floor = 0 if walk is not None else guard_mod.IMPLAUSIBLE_FLOOR_BYTES
            verdict = guard_mod.check_measurement(measured_total, file_bytes=file_bytes(seat.model_path),
                                                  previous=previous.total_bytes if previous else None,
                                                  floor_bytes=floor)
        details: dict[str, Any] = {
            "machine": prices.machine,  # what was learned here prices this machine only
            "guard": {"accepted": verdict.accepted, "check": verdict.check, "reason": verdict.reason},
            "compute_source": prices.compute_source(seat.model_path, seat.config),
            "previous_measured_bytes": previous.total_bytes if previous else None,
        }
        if seat.repack_crash is not None:  # kept with the file and machine: the next load starts with -nr
            st = seat.model_path.stat()
            details["repack_crash"] = {**seat.repack_crash.to_json(), "machine": prices.machine,
                                       "file": {"path": str(seat.model_path), "size": st.st_size,
                                                "mtime_ns": st.st_mtime_ns}}
        if measured_total:
            details["prediction_error"] = (seat.predicted.total_bytes - measured_total) / measured_total
        learnable = walk is None and seat.entry.mmproj is None and seat.measured is not None
        if learnable:  # the file this load measured: its error corrects the same file's price at other settings
            st = seat.model_path.stat()
            details["file"] = {"path": str(seat.model_path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        if verdict.accepted and seat.measured is not None:
            mem = seat.load_mem
            details["measurement_stored"] = await store_measurement(store, Measurement(
                signature=seat.signature, model=seat.key, engine=seat.engine, measured_at=self.clock(),
                footprint=seat.measured.to_json(),
                host_committed_bytes=mem.committed_bytes if mem else None,
                host_mapped_bytes=mem.mapped_bytes if mem else None, total_bytes=measured_total))
            prices.forget()  # a new measurement overrides the priced figure for its signature
            if learnable:
                prices.learn(seat.model_path, seat.config, seat.measured)
        return Learned(verdict, details)

    async def _overhead(self, seat: SeatState, walk: dict | None) -> None:
        mem = seat.load_mem  # the reading right after the load (the sampler's later ones are the live figure)
        if walk is not None and mem is not None and mem.host_bytes is not None:
            # a transformers seat: its own process (Python, torch and their libraries, as the budget counts them:
            # PSS) is what it holds beyond its priced model, cache and activations; the largest seen is kept
            priced = seat.predicted.bytes_on(HOST) - int(seat.predicted_overhead or 0)
            await learn_torch_overhead(self.prices, self.store, mem.host_bytes - priced,
                                       adapters=bool(seat.config.loras))
        elif traits(seat.engine).overhead == "calibrated":  # the build's calibrated figure: only its seats teach it
            grown = grown_overhead(self.prices.engine_overhead, overhead_seen(seat, self.prices.engine_overhead))
            if grown:
                await learn_engine_overhead(self.prices, self.store, self.processes.engine_binary, grown)
