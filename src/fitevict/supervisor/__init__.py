"""Seats: the effects that carry out the scheduler's decisions (``fitevict.schedule``), and the supervisor that
joins them to the front door.

    core.py       the Supervisor: builds the parts below, and is the front door's entry (acquire, load, unload,
                  plan, shutdown, views)
    ports.py      the parts, named, that the effects and the rest work with (never the supervisor itself)
    effects.py    the real Effects: start and stop engine processes, measure, verify release, record
    seat.py       one seat's state Enum, spawn and readiness
    release.py    the one stop path and its release verification
    measure.py    reading a seat after its load; the engine overhead it showed
    accounts.py   what a seat's events say beyond its figures (strategy, timings, leak check, failures)
    planning.py   the request's file and configuration, the budget now, the plan
    processes.py  which engine runs an entry, its argv, port, log and store record
    history.py    events written, kept and waited for
    desk.py       the waiting requests' futures, stop waiters, shrink decisions, whether it takes work
    pressure_watch.py memory pressure from other programs: what the seats hold, the watch's state
    pressure_relief.py acting on that pressure: idle seats stopped, one pressure event
    kvkeep.py     the prompt cache kept across swaps
    shrinking.py  policy.shrink_ctx: a refused contract retried at the largest context that fits
    orphans.py    seats an earlier fitevict left
    views.py      what a resident looks like from outside

What a model costs (the price book, its sheets, what was learned) is ``fitevict.prices``.
"""

from fitevict.request.contract import Contract
from fitevict.supervisor.core import ShutdownSummary, Supervisor
from fitevict.schedule.errors import Busy, LoadFailed, Refused, SupervisorError
from fitevict.supervisor.release import RELEASE_SLACK, Release, StopResult, release_check
from fitevict.supervisor.seat import SeatState

__all__ = ["Busy", "Contract", "LoadFailed", "RELEASE_SLACK", "Refused", "Release", "SeatState",
           "ShutdownSummary", "StopResult", "Supervisor", "SupervisorError", "release_check"]
