"""The scheduler's terms: its policy (``SchedPolicy``), a request waiting for a seat (``Waiter``) and everything it
asks of the world (``Effects``, the narrow "syscall table" the supervisor carries out). PURE."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from fitevict import planner as pl
from fitevict.budget import Budget
from fitevict.config import EVICTION_POLICIES
from fitevict.config.records import PolicyConfig, default
from fitevict.schedule.errors import SupervisorError
from fitevict.schedule.fair import Share

Eviction = str  # a registered eviction policy's name (``planner.eviction.POLICIES``, ``config.EVICTION_POLICIES``)


@dataclass(frozen=True, slots=True)
class SchedPolicy:
    # every default is the config's (config.records.PolicyConfig): one default per knob
    max_turn_seconds: float = default(PolicyConfig, "max_turn_seconds")
    max_wait_seconds: float = default(PolicyConfig, "max_wait_seconds")
    min_residency_seconds: float = default(PolicyConfig, "min_residency_seconds")
    queue_timeout_seconds: float = default(PolicyConfig, "queue_timeout_seconds")
    max_queue: int = default(PolicyConfig, "max_queue")
    engine_queue_depth: int | None = default(PolicyConfig, "engine_queue_depth")  # None: one batch (the slots)
    eviction: Eviction = default(PolicyConfig, "eviction")

    def __post_init__(self) -> None:
        if self.eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction {self.eviction!r} is not one of {', '.join(EVICTION_POLICIES)}")
        for name in ("max_turn_seconds", "max_wait_seconds", "min_residency_seconds", "queue_timeout_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(eq=False, slots=True)
class Waiter:
    """One request waiting for a seat. Identity is the object itself."""

    request: pl.PlanRequest
    arrived: float
    request_id: str | None = None
    keep_alive: float | None = None  # seconds after its last request (None: the policy's); inf: forever
    hold: bool = True  # False: an admin load, which needs the seat ready but serves nothing
    origin: Mapping[str, str] | None = None  # where it came from (the route, the name asked by), for history
    share: Share = Share()  # who it is, for fairness: its client (key), class and caps (schedule.fair)
    max_tokens: int | None = None  # the most tokens it may generate, as it asked (the wait estimate's input)
    tag: float = 0.0  # its virtual start, stamped when it is queued (schedule.fair.Fairness)

    @property
    def key(self) -> str:
        return self.request.key


class Effects(Protocol):
    """Everything the scheduler does to the world. Calls return at once; completions come back as inputs."""

    def now(self) -> float: ...

    def budget(self) -> Budget:
        """The memory a plan may place in now (a fresh reading)."""

    def prices(self, request: pl.PlanRequest) -> pl.FootprintFn:
        """What each configuration of ``request``'s file costs: prices read ahead, so that pricing is computation."""

    def start(self, waiter: Waiter, plan: pl.Plan) -> None:
        """Begin loading ``plan``; answer with ``Scheduler.loaded`` or ``Scheduler.load_failed``."""

    def stop(self, key: str, event: str, reason: str, request_id: str | None) -> None:
        """Begin stopping (or cancelling the load of) ``key``; answer with ``Scheduler.stopped``."""

    def dispatch(self, waiter: Waiter, key: str) -> None:
        """Hand seat ``key`` to ``waiter`` (already counted in flight when it holds)."""

    def reject(self, waiter: Waiter, error: SupervisorError) -> None: ...

    def wake_at(self, when: float) -> None:
        """Call ``Scheduler.tick`` at (or soon after) ``when``; a later call replaces an earlier one."""

    def prefetch(self, path: str) -> None:
        """Begin reading ``path`` (a load's file or folder) into the page cache while its victims stop: reclaimable
        memory, never budgeted. Nothing answers it; a failure only costs the load its head start."""


def stop_words(e: pl.Eviction, head: str) -> tuple[str, str]:
    """The event and reason of a victim's stop for a placement of ``head``: an eviction, or the replacement of
    ``head``'s own seat (the planner's words say why: ``planner.mismatch``)."""
    if e.key != head:
        return "evict", f"evicted for {head}: {e.reason}"
    return "unload", f"replaced: {head} is asked for under another configuration ({e.reason.removeprefix('replace: ')})"


__all__ = ["Effects", "Eviction", "SchedPolicy", "Waiter", "stop_words"]
