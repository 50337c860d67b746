"""Seats: one record per seat, one closed state enum, one table that owns both. PURE: no I/O, no clock reads.

A seat's life, and the only moves it can make (``MOVES``)::

    STARTING ──> LOADING ──> READY <──> DRAINING
       │            │          │           │
       └────────────┴──────────┴───────────┴──> STOPPING ──> GONE (how: stopped, failed or crashed)

- STARTING: placed by the scheduler; its process does not run yet (victims stopping, a dry run, the spawn).
- LOADING: its process runs and reads weights; not healthy yet.
- READY: serving; DRAINING: its turn is over or an unload waits, so it finishes what it has and takes nothing new.
- STOPPING: its stop has begun; it still holds memory until the release is verified (or the hold runs out).
- GONE: it holds nothing; ``exit`` says how it left. A gone seat leaves the table.

A seat that fails or crashes may go straight to GONE from any state. The ``SeatTable`` is the one place a seat's
state changes (``move``), and a move the diagram does not draw raises. The scheduler changes seats through the table;
every other reader gets ``view()``: the same records, each read through a ``SeatView``, which sets nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Protocol

from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.pages import SharedPages


class SeatStatus(str, enum.Enum):
    """A seat's state. A str, so ``seat.status == "ready"`` reads as it says."""

    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    GONE = "gone"

    def __str__(self) -> str:
        return self.value


class Exit(str, enum.Enum):
    """How a gone seat left."""

    STOPPED = "stopped"  # a stop it was asked for (evict, unload, idle, shutdown, a cancelled load)
    FAILED = "failed"  # its load failed
    CRASHED = "crashed"  # its process exited on its own while serving

    def __str__(self) -> str:
        return self.value


S = SeatStatus
MOVES: Mapping[SeatStatus, frozenset[SeatStatus]] = MappingProxyType({
    S.STARTING: frozenset({S.LOADING, S.STOPPING, S.GONE}),
    S.LOADING: frozenset({S.READY, S.STOPPING, S.GONE}),
    S.READY: frozenset({S.DRAINING, S.STOPPING, S.GONE}),
    S.DRAINING: frozenset({S.READY, S.STOPPING, S.GONE}),
    S.STOPPING: frozenset({S.GONE}),
    S.GONE: frozenset(),
})
PLACING = frozenset({S.STARTING, S.LOADING})  # placed, not serving yet
SERVING = frozenset({S.READY, S.DRAINING})  # its process serves (a drain finishes what it has)


class SeatMoveError(RuntimeError):
    """A move the seat's life does not allow: names the seat, both states and the moves it had."""


@dataclass(eq=False, slots=True)
class Seat:
    """One seat: what the scheduler decides on, and (``process``) what the supervisor runs for it."""

    key: str
    config: LoadConfig
    source: str
    since: float  # when it was placed
    status: SeatStatus = S.STARTING
    exit: Exit | None = None  # set when GONE
    pinned: bool = False
    ready_at: float | None = None
    turn_start: float | None = None
    turn_served: int = 0  # requests handed since its turn began
    turn_rank: int | None = None  # the highest class (lowest rank) handed since its turn began
    last_used: float | None = None  # None: never used (idle unload leaves it alone)
    in_flight: int = 0
    loaded_bytes: Mapping[str, int] = field(default_factory=dict)  # what it held when it became ready, per device
    loaded_source: str = "predicted"
    reload_seconds: float | None = None
    priority: float = 0.0  # GreedyDual-Size H
    keep_alive: float | None = None
    stop_after: tuple[str, str] | None = None  # (event, reason) once drained: an unload waits for it
    drained: bool = False  # its stop began while it drained (its turn over, or an unload waiting for it)
    process: Holds | None = None  # its running process (seat.running.SeatState); None before and after
    # its engine binary's own file pages, shared with every seat of that binary (``pricing.pages``): not in its
    # figures; the first seat of the binary carries them (``Scheduler.residents``)
    pages: SharedPages | None = None

    @property
    def bytes(self) -> Mapping[str, int]:
        return self.held()[0]

    @property
    def bytes_source(self) -> str:
        return self.held()[1]

    def held(self, carried: int = 0) -> tuple[Mapping[str, int], str]:
        """What the planner counts for it, per device, and where that came from, when it carries ``carried`` bytes
        of its binary's shared pages: what its process holds now (``Holds.held``), else what it held when it became
        ready, with them."""
        if self.process is not None:
            return self.process.held(carried) if carried else self.process.held()
        if not carried:
            return self.loaded_bytes, self.loaded_source
        return {**self.loaded_bytes, HOST: self.loaded_bytes.get(HOST, 0) + carried}, self.loaded_source

    @property
    def outgrowing(self) -> bool:
        """Its process holds more than it was priced at, by more than the bound (``Holds.outgrowing``)."""
        return self.process is not None and self.process.outgrowing

    @property
    def capacity(self) -> int:
        return max(1, self.config.n_parallel or 4)  # no -np: this engine runs 4 slots

    def room(self, engine_queue_depth: int | None, rank: int = 0) -> int:
        """Requests it may have in flight when the next is of the class at ``rank`` (``seat_room``)."""
        return seat_room(self.capacity, engine_queue_depth, rank)


class Holds(Protocol):
    """A seat's process that says what it holds: bytes per device and where that figure came from, and whether that
    outgrew its price."""

    def held(self, carried: int = 0) -> tuple[Mapping[str, int], str]: ...
    @property
    def outgrowing(self) -> bool: ...


SEAT_FIELDS = frozenset({f.name for f in fields(Seat)} | {n for n, v in vars(Seat).items() if isinstance(v, property)})


class SeatView:
    """A seat as a reader sees it: every field and property of ``Seat`` (``SEAT_FIELDS``, taken from the class), read
    through to the record (never a copy), none to set."""

    __slots__ = ("_seat",)

    def __init__(self, seat: Seat) -> None:
        object.__setattr__(self, "_seat", seat)

    def __getattr__(self, name: str) -> Any:
        if name in SEAT_FIELDS:
            return getattr(self._seat, name)
        raise AttributeError(f"{name}: a seat has no such field (it has {', '.join(sorted(SEAT_FIELDS))})")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{name}: a seat is read-only here; the scheduler changes seats through its table")

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    def __repr__(self) -> str:
        return f"SeatView({self._seat!r})"


def seat_room(slots: int, engine_queue_depth: int | None, rank: int = 0) -> int:
    """Requests a seat may have in flight when the next is of the class at ``rank`` (0: the top class): its slots,
    plus, for the top class, the ones waiting in the engine so that it never idles between two batches (``None``: one
    more batch, as many as its slots). A lower class is handed only a free slot, so that nothing of it waits in the
    engine's queue: a higher class's request waits for at most one lower-class request per slot, on its own seat
    (it is handed the engine's queue) and when a lower class's turn is ended for it (the drain finishes only the
    requests on the slots)."""
    if rank > 0:
        return slots
    return slots + (slots if engine_queue_depth is None else engine_queue_depth)


class SeatTable:
    """Every seat that holds (or is about to hold) memory, by model key: at most one per key."""

    def __init__(self) -> None:
        self._seats: dict[str, Seat] = {}

    # -- reading ----------------------------------------------------------------------------------

    def get(self, key: str) -> Seat | None:
        return self._seats.get(key)

    def __getitem__(self, key: str) -> Seat:
        return self._seats[key]

    def __contains__(self, key: object) -> bool:
        return key in self._seats

    def __iter__(self) -> Iterator[str]:
        return iter(self._seats)

    def __len__(self) -> int:
        return len(self._seats)

    def values(self) -> list[Seat]:
        return list(self._seats.values())

    def view(self) -> Views:
        """The table, read-only: a live mapping of the same records, each read through a ``SeatView``."""
        return Views(self._seats)

    def in_status(self, *statuses: SeatStatus) -> list[Seat]:
        return [s for s in self._seats.values() if s.status in statuses]

    def running(self) -> Running:
        """The seats whose process runs, as their processes, by key: a live, read-only mapping."""
        return Running(self._seats)

    # -- changing -----------------------------------------------------------------------------------

    def place(self, seat: Seat) -> Seat:
        """A new seat (STARTING, or READY for one adopted from an earlier fitevict) for a key that has none."""
        if seat.key in self._seats:
            raise SeatMoveError(f"{seat.key}: placed while its seat is still {self._seats[seat.key].status}")
        if seat.status not in (S.STARTING, S.READY):
            raise SeatMoveError(f"{seat.key}: a new seat starts STARTING (or READY when adopted), not {seat.status}")
        self._seats[seat.key] = seat
        return seat

    def attach(self, seat: Seat, process: Any) -> None:
        """``process`` (the supervisor's record of a running engine) now runs for ``seat``."""
        seat.process = process

    def detach(self, seat: Seat, process: Any) -> None:
        """``process`` exited: ``seat`` (still counted until its release is verified) has no process any more."""
        if seat.process is process:
            seat.process = None

    def move(self, seat: Seat, status: SeatStatus, *, exit: Exit | None = None) -> None:
        """``seat`` moves to ``status`` (GONE takes ``exit`` and leaves the table). Raises on a move ``MOVES`` does
        not allow, naming both states."""
        if status is seat.status and status is not S.GONE:
            return
        if status not in MOVES[seat.status]:
            allowed = ", ".join(sorted(m.value for m in MOVES[seat.status])) or "none"
            raise SeatMoveError(f"{seat.key}: cannot move {seat.status} -> {status} (from {seat.status}: {allowed})")
        if (status is S.GONE) != (exit is not None):
            raise SeatMoveError(f"{seat.key}: GONE and only GONE takes how it left (got {status}, exit {exit})")
        seat.status, seat.exit = status, exit
        if status is S.GONE and self._seats.get(seat.key) is seat:
            del self._seats[seat.key]


class Views(Mapping[str, SeatView]):
    """Seat key -> its record, read-only (``SeatTable.view``): the same table."""

    def __init__(self, seats: Mapping[str, Seat]) -> None:
        self._seats = seats

    def __getitem__(self, key: str) -> SeatView:
        return SeatView(self._seats[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._seats)

    def __len__(self) -> int:
        return len(self._seats)


class Running(Mapping[str, Any]):
    """Seat key -> the process running for it (``SeatTable.running``): the same table, read-only."""

    def __init__(self, seats: Mapping[str, Seat]) -> None:
        self._seats = seats

    def __getitem__(self, key: str) -> Any:
        seat = self._seats.get(key)
        if seat is None or seat.process is None:
            raise KeyError(key)
        return seat.process

    def __iter__(self) -> Iterator[str]:
        return iter([k for k, s in self._seats.items() if s.process is not None])

    def __len__(self) -> int:
        return sum(1 for s in self._seats.values() if s.process is not None)


__all__ = ["Exit", "MOVES", "PLACING", "Running", "SEAT_FIELDS", "SERVING", "Seat", "SeatMoveError", "SeatStatus",
           "SeatTable", "SeatView", "Views", "seat_room"]
