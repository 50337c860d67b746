"""Seats and who gets them: a pure scheduler, the effects that carry out its decisions, and the supervisor
that joins them to the front door.

    scheduler.py  PURE: queues, turns, placements, victims; talks to the world only through ``Effects``
    effects.py    the real Effects: start and stop engine processes, measure, verify release, record
    seat.py       one seat's state Enum, spawn and readiness
    release.py    the one stop path and its release verification
    measure.py    reading a seat after its load; engine overhead
    pricebook.py  what prices depend on (measurements, corrections, dry runs, overheads); builds the price sheets
    pricesheet.py one file's prices read ahead: the planner's footprint function, computation only
    orphans.py    seats an earlier fitevict left
    core.py       the Supervisor: acquire, load, unload, plan, shutdown, views
"""

from fitevict.contract import Contract
from fitevict.supervisor.core import ShutdownSummary, Supervisor
from fitevict.supervisor.errors import Busy, LoadFailed, Refused, SupervisorError
from fitevict.supervisor.measure import footprint_from_json, with_engine_overhead
from fitevict.supervisor.release import RELEASE_SLACK, Release, StopResult, release_check
from fitevict.supervisor.seat import SeatPhase, SeatState

__all__ = ["Busy", "Contract", "LoadFailed", "RELEASE_SLACK", "Refused", "Release", "SeatPhase", "SeatState",
           "ShutdownSummary", "StopResult", "Supervisor", "SupervisorError", "footprint_from_json", "release_check",
           "with_engine_overhead"]
