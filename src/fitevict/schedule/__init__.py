"""Who gets a seat, and when: the pure scheduler and the errors its answers carry.

    scheduler.py  PURE: one queue, turns, placements, victims; talks to the world only through ``Effects``
    errors.py     the answers a request can get instead of a seat (busy, refused, load failed), each with the
                  HTTP status the front door gives it

This stage sits between the planner (which it asks what a placement costs) and the supervisor (whose live
``Effects`` carry out its decisions); it imports nothing from the supervisor.
"""

from fitevict.schedule.errors import Busy, LoadFailed, Refused, SupervisorError
from fitevict.schedule.scheduler import Effects, Phase, SchedPolicy, Scheduler, Slot, Waiter, seat_room

__all__ = ["Busy", "Effects", "LoadFailed", "Phase", "Refused", "SchedPolicy", "Scheduler", "Slot", "SupervisorError",
           "Waiter", "seat_room"]
