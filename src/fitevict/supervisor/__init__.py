"""Seats: the effects that carry out the scheduler's decisions (``fitevict.schedule``), and the supervisor that
joins them to the front door.

    core.py       the Supervisor: builds the parts below, and is the front door's entry (acquire, load, unload,
                  plan, shutdown, views)
    ports.py      the parts, named, that the effects and the rest work with (never the supervisor itself)
    effects.py    the real Effects: the scheduler's commands, handed to the collaborators below
    loading.py    a load, from its price to its record (a failed or cancelled one recorded too)
    seatprice.py  what a new seat is priced at
    launching.py  an engine process from spawn to healthy, with its retries (a taken port, a repack crash)
    readiness.py  what a healthy seat starts with
    learning.py   what a load teaches: overheads, the guarded measurement stored
    loadrecord.py a load's record
    stopping.py   a stop the scheduler asked for, recorded
    watching.py   a serving seat's exit no stop asked for: a crash
    ending.py     every stop's end: the process group stopped, the release verified, the seat forgotten
    seat.py       one seat's process: spawn and readiness
    release.py    the one stop path and its release verification
    measure.py    reading a seat after its load; the engine overhead it showed
    storing.py    the store's record of each live seat; measurements stored and read
    accounts.py   what a seat's events say beyond its figures (strategy, timings, leak check, failures)
    planning.py   the request's file and configuration, the budget now, the plan
    processes.py  which engine runs an entry, its argv, port and log
    history.py    events written, kept and waited for
    desk.py       the waiting requests' futures, stop waiters, shrink decisions, whether it takes work
    pressure_watch.py memory pressure from other programs: what the seats hold, the watch's state
    pressure_relief.py acting on that pressure: idle seats stopped, one pressure event
    kvkeep.py     the prompt cache kept across swaps
    shrink.py     policy.shrink_ctx: a refused contract retried at the largest context that fits (the arithmetic:
                  ``fitevict.shrink``)
    orphans.py    seats an earlier fitevict left
    views.py      what a resident looks like from outside

What a model costs (the price book, its sheets, what was learned) is ``fitevict.prices``.
"""

from fitevict.request.contract import Contract
from fitevict.supervisor.core import ShutdownSummary, Supervisor
from fitevict.schedule.errors import Busy, LoadFailed, Refused, SupervisorError
from fitevict.seat.release import RELEASE_SLACK, Release, StopResult, release_check
from fitevict.seat.running import SeatState

__all__ = ["Busy", "Contract", "LoadFailed", "RELEASE_SLACK", "Refused", "Release", "SeatState",
           "ShutdownSummary", "StopResult", "Supervisor", "SupervisorError", "release_check"]
