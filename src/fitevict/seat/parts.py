"""The parts of the residents as a whole that a seat's life works with, as the seat's modules name them: the
history its events go to (the supervisor's ``History``), what the history counts a seat at on this machine and the
file a request loads (the supervisor's ``Planning``), and the saved prompts a seat may restore and where its engine
saves them (the supervisor's ``PromptKeep``). The supervisor builds the real parts and hands them in; the seat's
modules import none of them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fitevict import planner as pl
from fitevict.store.records import Event

if TYPE_CHECKING:
    from fitevict.seat.running import SeatState


class EventLog(Protocol):
    async def record(self, ev: Event) -> Event:
        """Write ``ev`` to the history; returns it with its id."""
        ...


class SeatFigures(Protocol):
    def path_for(self, request: pl.PlanRequest) -> Path:
        """The file a load of ``request`` reads."""
        ...

    def gpu_figure(self, seat: SeatState) -> int | None:
        """What the seat holds on GPUs; None on a machine without a GPU."""
        ...

    def spilled(self, seat: SeatState) -> int | None:
        """Model weights a load put in host RAM although the machine has a GPU; None without a GPU."""
        ...


class PromptFiles(Protocol):
    def prepare(self) -> Path:
        """The folder an engine that keeps prompts saves them in, made ready."""
        ...

    def matching(self, signature: str) -> list:
        """The saved prompts of ``signature`` a request may restore."""
        ...
