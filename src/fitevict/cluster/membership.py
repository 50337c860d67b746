"""Whether Ray's node list (its GCS) answers, and what a front door missed while it did not. Pure: the caller
passes the clock's readings and the node sets.

Ray keeps its membership in the GCS, on the head node. While the GCS is down (killed, restarting), the node list
does not answer, and no agent can be started; calls to running agents need no GCS and go on. A front door then
keeps the members it had, routes from their agents' facts, and says since when the list is unreadable and why.
When the list answers again, the outage is closed with what changed meanwhile: the nodes that left and joined
while the front door could not see it.

A Ray process ends when the GCS stays unreachable past its ``gcs_rpc_server_reconnect_timeout_s`` ("Failed to
connect to GCS within N seconds ... The program will terminate", exit code 1): the front door sets it for its
driver and the agents it starts (``server.ray_gcs_reconnect_seconds``), and says how long is left while it lasts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Outage:
    """A time (unix seconds) when Ray's node list did not answer: ``since`` the first read that failed, ``until``
    the first that answered again (None while it lasts), why, and the members that left and joined meanwhile."""

    since: float
    why: str
    until: float | None = None
    left: tuple[str, ...] = ()
    joined: tuple[str, ...] = ()

    def row(self, now: float) -> dict[str, Any]:
        end = self.until if self.until is not None else now
        return {"since": self.since, "until": self.until, "seconds": round(end - self.since, 3), "why": self.why,
                "left": list(self.left), "joined": list(self.joined)}


@dataclass(slots=True)
class Membership:
    """The state of Ray's node list as this front door reads it: ``down`` (the outage going on, or None), the last
    outage ended (``last``) and how many have ended."""

    down: Outage | None = None
    last: Outage | None = None
    outages: int = 0
    read_at: float | None = field(default=None)  # the last read that answered
    reconnect_s: float | None = None  # Ray ends this process once its GCS is unreachable this long (None: unknown)

    def unanswered(self, now: float, why: str) -> bool:
        """A read failed or is late; True when this starts an outage."""
        if self.down is not None:
            self.down.why = why
            return False
        self.down = Outage(now, why)
        return True

    def answered(self, now: float, left: set[str], joined: set[str]) -> Outage | None:
        """A read answered, with the members that ``left`` and ``joined`` since the previous one; the outage it
        ends, if any."""
        self.read_at = now
        ended, self.down = self.down, None
        if ended is None:
            return None
        ended.until, ended.left, ended.joined = now, tuple(sorted(left)), tuple(sorted(joined))
        self.last, self.outages = ended, self.outages + 1
        return ended

    def row(self, now: float) -> dict[str, Any]:
        """As ``/health`` and ``GET /v1/cluster/nodes`` show it: while the list is unreadable, ``down`` has the
        seconds left before Ray ends this front door if the GCS stays away (``ends_in_s``)."""
        down = self.down.row(now) if self.down is not None else None
        if down is not None and self.reconnect_s is not None:
            down["ends_in_s"] = round(max(self.reconnect_s - down["seconds"], 0.0), 3)
        return {"membership": "unreadable" if self.down is not None else "ok", "down": down,
                "last_outage": self.last.row(now) if self.last is not None else None,
                "outages": self.outages, "read_at": self.read_at, "gcs_reconnect_s": self.reconnect_s}


def describe(o: Outage) -> str:
    """An ended outage in words, for the log."""
    return (f"Ray's node list answered again after {o.row(o.until or o.since)['seconds']:g} s unreadable (last: "
            f"{o.why}); meanwhile {len(o.left)} node(s) left ({', '.join(o.left) or 'none'}) and {len(o.joined)} "
            f"joined ({', '.join(o.joined) or 'none'})")


__all__ = ["Membership", "Outage", "describe"]
