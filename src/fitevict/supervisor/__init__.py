"""The machine's residents as a whole: the supervisor that joins the scheduler's decisions (``fitevict.schedule``)
to the front door, the effects that carry them out, and what is about every seat together. One seat's life, from
its price to its end, is ``fitevict.seat``.

    core.py       the Supervisor: builds the parts below, and is the front door's entry (acquire, load, unload,
                  plan, shutdown, views)
    ports.py      the parts, named, that the effects and the rest work with (never the supervisor itself)
    effects.py    the real Effects: the scheduler's commands, handed to the seat's collaborators (``fitevict.seat``)
    planning.py   the request's file and configuration, the budget now, the plan
    history.py    events written, kept and waited for
    desk.py       the waiting requests' futures, stop waiters, shrink decisions, whether it takes work
    loadreport.py what serving one request cost in loading, as data (history, headers, plan dry runs)
    pressure_watch.py memory pressure from other programs: what the seats hold, the watch's state
    pressure_relief.py acting on that pressure: idle seats stopped, one pressure event
    outgrowth.py  seats whose readings outgrew their prices: the decision, the record, the recycle
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
