"""``fitevict cluster stop``: stop every node agent on a Ray cluster, each after its door, and say what became of
each node, those that died before included.

An agent that is running is asked to stop its door (SIGTERM: the door stops its seats and verifies their memory
came back), then killed. An agent that had ended on its own (its node died, or its worker) is listed as ``gone``
with Ray's reason: once Ray declares a node dead its agent's name is free again, so the named actors no longer
show it, and it is read from Ray's actor table instead (which keeps dead actors). An agent a previous ``cluster
stop`` killed is not listed again, nor one that ended before that stop.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from fitevict.cluster.fleet import AGENT_PREFIX, NAMESPACE

log = logging.getLogger("fitevict.cluster")

KILLED = "RAY_KILL"  # Ray's reason for an actor ended by ray.kill (a stop)


def ended_agents(table: Iterable[Mapping[str, Any]], listed: set[str]) -> list[dict[str, Any]]:
    """The agents that ended on their own since the last stop, one per node (its latest), as ``gone`` rows.

    ``table``: Ray's actor table as rows of ``name``, ``state``, ``reason`` (Ray's ActorDiedErrorContext reason),
    ``message`` and ``ended_at``; ``listed``: the agents' names Ray lists as running (their nodes are asked)."""
    rows = [r for r in table if str(r["name"]).startswith(AGENT_PREFIX)]
    last_stop = max((float(r["ended_at"]) for r in rows if r["state"] == "DEAD" and r["reason"] == KILLED),
                    default=0.0)
    latest: dict[str, Mapping[str, Any]] = {}
    for r in rows:
        if (r["state"] != "DEAD" or r["reason"] == KILLED or r["name"] in listed
                or float(r["ended_at"]) <= last_stop):
            continue
        if r["name"] not in latest or float(r["ended_at"]) > float(latest[r["name"]]["ended_at"]):
            latest[r["name"]] = r
    return [{"node": name[len(AGENT_PREFIX):], "gone": f"the agent had ended ({r['reason'] or 'no reason given'}: "
                                                      f"{_first_line(r['message'])}), its door with it"}
            for name, r in sorted(latest.items())]


def _first_line(message: Any) -> str:
    return (str(message or "").strip().splitlines() or ["no message"])[0]


def _actor_table(ray: Any) -> list[dict[str, Any]]:
    """Ray's actor table, dead actors included, as ``ended_agents`` reads it."""
    out = []
    for info in ray._private.state.actors().values():
        ctx = getattr(info.get("DeathCause"), "actor_died_error_context", None)
        reason = ctx.DESCRIPTOR.fields_by_name["reason"].enum_type.values_by_number[ctx.reason].name if ctx else ""
        out.append({"name": info.get("Name") or "", "state": info.get("State"), "reason": reason,
                    "message": ctx.error_message if ctx else "",
                    "ended_at": float(info.get("EndTime") or 0)})
    return out


def stop_agents(address: str, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Stop every node agent on the Ray cluster at ``address`` (``auto``: this machine's), each after its door
    (SIGTERM: the door stops its seats and verifies their memory came back). Each agent's node with its door's exit
    status (``door_exit``), ``gone`` for an agent that had ended (its node died, say: its door went with it), or
    ``error``: why it could not be stopped (it is killed all the same, and its door with it)."""
    # Ray's driver prints the cluster's own notices (a node marked dead, say) to stdout whatever log_to_driver says:
    # they go to stderr here, so that stdout carries only the answer (``cluster stop --json``)
    with contextlib.redirect_stdout(sys.stderr):
        return _stop_agents(address, timeout_s)


def _stop_agents(address: str, timeout_s: float) -> list[dict[str, Any]]:
    import ray

    ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING, log_to_driver=False)
    try:
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        names = sorted(n for n in ray.util.list_named_actors() if n.startswith(AGENT_PREFIX))
        try:  # read before the stops below add theirs to it
            ended = ended_agents(_actor_table(ray), set(names))
        except Exception as e:  # Ray's actor table unread: the running agents are stopped all the same
            ended = [{"node": "(agents that had ended)",
                      "error": f"unavailable, because Ray's actor table could not be read: {type(e).__name__}: {e}"}]
        agents = {n: ray.get_actor(n, namespace=NAMESPACE) for n in names}
        asked = {n: a.stop.remote() for n, a in agents.items() if n[len(AGENT_PREFIX):] in alive}  # all at once
        out = [_stopped(ray, name, agent, asked.get(name), timeout_s) for name, agent in agents.items()]
        return sorted(out + ended, key=lambda r: r["node"])
    finally:
        ray.shutdown()


def _stopped(ray: Any, name: str, agent: Any, asked: Any, timeout_s: float) -> dict[str, Any]:
    """One running agent's row: its door's exit status once stopped, or why not; the agent is killed."""
    row: dict[str, Any] = {"node": name[len(AGENT_PREFIX):]}
    try:
        if asked is not None:
            row["door_exit"] = ray.get(asked, timeout=timeout_s)
        else:
            row["gone"] = "its node is no longer alive"
    except ray.exceptions.ActorDiedError:  # it died before (its node, say): its door went with it
        row["gone"] = "the agent had ended, its door with it"
    except ray.exceptions.ActorUnavailableError as e:  # its node's processes do not answer: Ray lists a killed
        # node as alive until its health checks fail (about 15 s)
        row["gone"] = (f"unreachable ({type(e).__name__}): its node does not answer; if that machine is still "
                       "up, its door may run on: stop it there")
    except Exception as e:  # the agent is unreachable or late
        row["error"] = f"{type(e).__name__}: {e}"
    ray.kill(agent, no_restart=True)
    return row


__all__ = ["ended_agents", "stop_agents"]
