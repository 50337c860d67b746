"""What the wait estimate reads, as measured on this door. PURE: every reading comes in with its time.

Per model:

- **load seconds**: the last load's wall time (placed to ready), as the door recorded it;
- **release seconds**: the last stop's wall time (stop begun to its memory verified back, or its hold ended);
- **per-slot generation rate at a concurrency**: tokens per second of one request, its generated tokens (the
  engine's count) over its seconds on an engine slot, keyed by how many requests ran on the door's seats at once while
  it ran (its *concurrency*: the seats of one machine share its cores, so a seat's aggregate rate is shared by every
  busy slot), an exponentially weighted mean per concurrency. A request handed to a seat whose slots are all busy
  waits in the engine's queue: it takes a slot when one of the seat's requests on a slot ends (the engine's queue is
  first come, first served), and its seconds on a slot count from then;
- **seconds per request at a concurrency**, for answers that carry no token count (embeddings);
- **typical generation**: the weighted mean of the tokens its answers generated, for a request that names no
  ``max_tokens``.

At a concurrency never measured, the nearest one measured is scaled by the sharing rule: an aggregate rate
``n' x r(n')`` shared by ``n`` busy slots gives each ``n' x r(n') / n``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fitevict.units import GiB

# a queued request (schedule.terms.Waiter): named, not imported, since terms builds on fair, and fair on nothing
Waiter = Any

SMOOTHING = 0.3  # weight of the newest reading in each mean
ASSUMED_LOAD_RATE = 1.0 * GiB  # bytes/s for a model when nothing was ever loaded here (the scheduler's)


def _mean(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


def _nearest(table: dict[int, float], n: int) -> int:
    """The measured concurrency nearest ``n`` (ties: the higher, the busier reading)."""
    return min(table, key=lambda k: (abs(k - n), -k))


@dataclass(slots=True)
class Measured:
    """The wait estimate's measured inputs, per model (module docstring), and the requests on each seat now."""

    load: dict[str, float] = field(default_factory=dict)
    release: dict[str, float] = field(default_factory=dict)
    rate: dict[str, dict[int, float]] = field(default_factory=dict)  # tokens/s of one slot, by concurrency
    per_request: dict[str, dict[int, float]] = field(default_factory=dict)  # seconds, by concurrency (no tokens)
    length: dict[str, float] = field(default_factory=dict)  # tokens generated per answer
    stopping: dict[str, float] = field(default_factory=dict)  # when each stop under way began
    # per seat: its requests in the order handed, each with when it took a slot (None: in the engine's queue)
    running: dict[str, dict[Waiter, float | None]] = field(default_factory=dict)

    # -- readings -------------------------------------------------------------------------------------------------

    def loaded(self, key: str, seconds: float) -> None:
        self.load[key] = seconds

    def stop_began(self, key: str, now: float) -> None:
        self.stopping[key] = now

    def released(self, key: str, now: float) -> None:
        began = self.stopping.pop(key, None)
        if began is not None:
            self.release[key] = max(0.0, now - began)

    def handed(self, key: str, w: Waiter, now: float, slots: int) -> None:
        """``w`` was handed ``key``'s seat of ``slots`` slots: it takes one now, or waits in the engine's queue."""
        on = self.running.setdefault(key, {})
        on[w] = now if sum(1 for t in on.values() if t is not None) < slots else None

    def ended(self, key: str, w: Waiter | None, now: float) -> None:
        """``w``'s request on ``key``'s seat ended: the first in the engine's queue takes its slot."""
        on = self.running.get(key, {})
        if on.pop(w, None) is not None:
            nxt = next((q for q, t in on.items() if t is None), None)
            if nxt is not None:
                on[nxt] = now

    def slot_since(self, key: str, w: Waiter) -> float | None:
        """When ``w`` took a slot of ``key``'s seat (None: it has not, or is not on the seat)."""
        return self.running.get(key, {}).get(w)

    def served(self, key: str, seconds: float, tokens: int | None = None, busy: int = 1) -> None:
        """A request of ``key`` took ``seconds`` on a slot of its seat, generating ``tokens`` (None: not counted),
        with ``busy`` requests running on the door's seats meanwhile."""
        if not (seconds > 0 and math.isfinite(seconds)):
            return
        n = max(1, busy)
        if tokens is not None and tokens > 0:
            rates = self.rate.setdefault(key, {})
            rates[n] = _mean(rates.get(n), tokens / seconds)
            self.length[key] = _mean(self.length.get(key), float(tokens))
        else:
            per = self.per_request.setdefault(key, {})
            per[n] = _mean(per.get(n), seconds)

    # -- figures --------------------------------------------------------------------------------------------------

    def load_of(self, key: str, nbytes: int) -> tuple[float, str]:
        """``key``'s load seconds: its own last load; never loaded here, the median of the loads measured here
        (a small model's load is mostly its process's start), else its bytes at 1 GiB/s."""
        if key in self.load:
            return self.load[key], f"load {key} {self.load[key]:.2f} s measured"
        if self.load:
            seconds = sorted(self.load.values())[len(self.load) // 2]
            return seconds, f"load {key} {seconds:.2f} s: the median of {len(self.load)} load(s) measured here"
        seconds = nbytes / ASSUMED_LOAD_RATE
        return seconds, f"load {key} {seconds:.2f} s assumed (nothing loaded here yet: its bytes at 1 GiB/s)"

    def release_of(self, key: str) -> tuple[float, str]:
        """``key``'s stop and release seconds: its own last; never stopped here, the median of those measured."""
        if key in self.release:
            return self.release[key], f"release {key} {self.release[key]:.2f} s measured"
        if self.release:
            seconds = sorted(self.release.values())[len(self.release) // 2]
            return seconds, f"release {key} {seconds:.2f} s: the median of {len(self.release)} stop(s) measured here"
        return 0.0, f"release {key} unavailable, because no stop was measured here yet (counted 0)"

    def tokens_of(self, key: str, w: Waiter) -> int | None:
        """The tokens ``w`` will generate: its ``max_tokens``, else its model's typical generation (None: neither)."""
        if getattr(w, "max_tokens", None):
            return int(w.max_tokens)
        typical = self.length.get(key)
        return None if typical is None else max(1, round(typical))

    def service_of(self, key: str, tokens: int | None, busy: int) -> tuple[float, str]:
        """Seconds on its seat of a request of ``key`` generating ``tokens`` while ``busy`` requests run on the
        door's seats: ``tokens / r(busy)``, the per-slot rate (module docstring); without tokens or a rate, its
        seconds per request at that concurrency."""
        n = max(1, busy)
        rates = self.rate.get(key)
        if rates and tokens is not None:
            m = _nearest(rates, n)
            per_slot = rates[m] * m / n
            return tokens / per_slot, f"service {key} {tokens} tok at {per_slot:.1f} tok/s/slot ({n} busy; measured at {m})"
        per = self.per_request.get(key)
        if per:
            m = _nearest(per, n)
            seconds = per[m] * n / m
            return seconds, f"service {key} {seconds:.3f} s/request ({n} busy; measured at {m})"
        return 0.0, f"service {key} unavailable, because no request of it has been measured yet (counted 0)"


__all__ = ["ASSUMED_LOAD_RATE", "Measured", "SMOOTHING"]
