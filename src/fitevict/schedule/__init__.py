"""Who gets a seat, and when: the pure scheduler, the seat table it changes, and the errors its answers carry.

    seats.py      PURE: one record per seat, one closed state enum (starting, loading, ready, draining,
                  stopping, gone) and the table that owns them and is the one place a state changes
    scheduler.py  PURE: one queue, turns, placements, victims; talks to the world only through ``Effects``
    terms.py      PURE: the scheduler's policy, a waiting request (``Waiter``) and the ``Effects`` protocol
    errors.py     the answers a request can get instead of a seat (busy, refused, load failed), each with the
                  HTTP status the front door gives it

This stage sits between the planner (which it asks what a placement costs) and the supervisor (whose live
``Effects`` carry out its decisions); it imports nothing from the supervisor.
"""

from fitevict.schedule.errors import Busy, LoadFailed, Refused, SupervisorError
from fitevict.schedule.scheduler import Effects, SchedPolicy, Scheduler, Waiter
from fitevict.schedule.seats import Exit, Seat, SeatStatus, SeatTable, SeatView, seat_room

__all__ = ["Busy", "Effects", "Exit", "LoadFailed", "Refused", "SchedPolicy", "Scheduler", "Seat", "SeatStatus",
           "SeatTable", "SeatView", "SupervisorError", "Waiter", "seat_room"]
