"""The fleet as a front door sees it: Ray's alive nodes, one node agent on each (started here when missing), and
each node's latest facts with their age.

Ray is the membership: ``ray.nodes()`` says which nodes are alive, and a node agent is a named, detached actor per
node (``fitevict-agent-<node id>`` in the ``fitevict`` namespace), pinned to it by node affinity, so every front
door on the cluster finds the same agents. The fleet polls, every ``poll_s``: the node list (a node that joins
gets an agent; a node Ray declares dead leaves), and each agent's facts, with a deadline (``call_timeout_s``).
A node whose facts cannot be read leaves routing at once, as does one whose door refuses connections
(``lost``), and its residents leave the routing table in the same step: a lost node is nobody's residence. It comes
back when it reports again, with facts asked after it was lost. A node whose door said it is shutting down
(``stopping``) never comes back: its door is on its way out; a seat whose engine refused a connection leaves its
node's residents (``drop_resident``) until the node's next facts, asked after that.

The node list comes from Ray's GCS (on the head node); facts come from the agents directly. A node list that does
not answer within the deadline (the GCS killed or restarting) leaves the members as they were: routing goes on
from their facts, and ``membership`` says since when the list is unreadable, then what changed meanwhile.

With a cluster key of its own (``server.cluster_key``), a front door offers it to the agents it starts and uses
only nodes whose doors admit it: a node whose agent runs with another key stays out (``refused``, asked again
every ``REFUSED_RETRY_S``. ``stop.stop_agents`` stops every agent on a cluster, and its door.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from fitevict.cluster.agent import NodeAgent, budget_from_resources
from fitevict.cluster.facts import node_facts, verdict_of
from fitevict.cluster.membership import Membership, describe
from fitevict.cluster.route import NodeFacts, Verdict

log = logging.getLogger("fitevict.cluster")

NAMESPACE = "fitevict"
AGENT_PREFIX = "fitevict-agent-"
REFUSED_RETRY_S = 30.0
# A Ray worker that ends SIGKILLs its child processes (Ray 2.60's default): the agent's door would go without its
# goodbye. Off for the agent's worker, the door gets SIGTERM from the parent-death signal instead and stops as one
# machine does (waiting requests answered 503, a load under way ended in its history, seats stopped and verified).
AGENT_ENV = {"RAY_kill_child_processes_on_worker_exit": "0"}
# How long a Ray process waits for an unreachable GCS before it ends (Ray's default: 60 s): the front door's driver
# (``gcs_reconnect_env``) and each agent's worker run with ``server.ray_gcs_reconnect_seconds``.
GCS_RECONNECT = "RAY_gcs_rpc_server_reconnect_timeout_s"


def gcs_reconnect_env(seconds: int) -> dict[str, str]:
    """The environment that makes a Ray process wait ``seconds`` for an unreachable GCS before it ends."""
    return {GCS_RECONNECT: str(int(seconds))}


def agent_name(node_id: str) -> str:
    return AGENT_PREFIX + node_id


def ensure_agent(node: dict[str, Any], options: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    """The agent of a Ray node (``ray.nodes()`` row), started pinned to it unless one runs there already, its worker
    with ``AGENT_ENV`` and ``env``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node_id = node["NodeID"]
    opts = {**budget_from_resources(node.get("Resources") or {}), **options}
    actor = ray.remote(num_cpus=0, max_concurrency=8, max_restarts=0)(NodeAgent)
    return actor.options(name=agent_name(node_id), namespace=NAMESPACE, get_if_exists=True, lifetime="detached",
                         scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                         runtime_env={"env_vars": {**AGENT_ENV, **(env or {})}}).remote(
        node_id, node["NodeManagerAddress"], opts)


@dataclass
class Member:
    """One node: its agent, its door (url, key) once known, and its latest facts."""

    node: str
    agent: Any
    url: str = ""
    key: str = ""
    pid: int | None = None  # the door's process, on its node
    facts: NodeFacts | None = None
    lost_since: float | None = None  # when the fleet saw it fail (facts, connection), until it reports again
    why_lost: str = ""
    stopping: bool = False  # its door said it is shutting down: it never takes a request again
    changed_at: float = 0.0  # when the fleet last took something out of its facts: older facts do not put it back
    joined: float = field(default_factory=time.time)


class Fleet:
    """Membership and facts, refreshed by ``run()``; ``snapshot()`` for routing, ``verdicts()`` for a miss."""

    def __init__(self, *, poll_s: float = 0.5, call_timeout_s: float = 2.0, max_age_s: float = 5.0,
                 options: dict[str, Any] | None = None, start_timeout_s: float = 180.0,
                 key: str | None = None, gcs_reconnect_s: int | None = None) -> None:
        self.poll_s, self.call_timeout_s, self.max_age_s = poll_s, call_timeout_s, max_age_s
        self.start_timeout_s = start_timeout_s
        self.key = key
        self.options = {**(options or {}), **({"key": key} if key else {})}
        self.members: dict[str, Member] = {}
        self.refused: dict[str, tuple[float, str]] = {}  # node -> (when, why): its door does not admit our key
        self._starting: dict[str, asyncio.Task] = {}
        self._wake = asyncio.Event()
        self.membership = Membership(reconnect_s=gcs_reconnect_s)
        self.agent_env = gcs_reconnect_env(gcs_reconnect_s) if gcs_reconnect_s is not None else {}
        self._listing: asyncio.Future | None = None  # Ray's node list being read (it may outlast a poll)

    # -- membership ---------------------------------------------------------------------------------

    async def _alive(self) -> dict[str, dict[str, Any]] | None:
        """Ray's alive nodes by id; None when its node list does not answer within ``call_timeout_s`` (the read
        goes on, and a later poll takes its answer) or fails: ``membership`` says since when, and why."""
        import ray

        if self._listing is None:
            self._listing = asyncio.ensure_future(asyncio.to_thread(ray.nodes))
        done, _ = await asyncio.wait({self._listing}, timeout=self.call_timeout_s)
        if not done:
            why = f"no answer within {self.call_timeout_s:g} s"
        else:
            listing, self._listing = self._listing, None
            try:
                return {n["NodeID"]: n for n in listing.result() if n.get("Alive")}
            except Exception as e:  # the GCS refused or is gone: the members stay as they were
                why = f"{type(e).__name__}: {e}"
        if self.membership.unanswered(time.time(), why):
            log.warning("Ray's node list (its GCS) does not answer (%s): the %d node(s) known stay, routed by their "
                        "agents' facts; no node can join until it answers; %s", why, len(self.members),
                        self._until_ended())
        return None

    def _until_ended(self) -> str:
        """What happens if the GCS stays away, for the log."""
        limit = self.membership.reconnect_s
        if limit is None:
            return "if it stays away past Ray's gcs_rpc_server_reconnect_timeout_s, Ray ends this front door"
        return (f"if it stays away {limit:g} s (server.ray_gcs_reconnect_seconds), Ray ends this front door with exit "
                "code 1, and the agents it started with it; raise that, and the same setting for every node's "
                "`ray start` (docs/cluster.md), to ride out longer outages")

    async def sync_nodes(self) -> None:
        """Agents for Ray's alive nodes; nodes Ray declares dead leave. While Ray's node list does not answer, the
        members stay as they were."""
        alive = await self._alive()
        if alive is None:
            return
        left = {n for n in self.members if n not in alive}
        for node_id in left:
            log.warning("node %s left the cluster (Ray: not alive)", node_id)
            del self.members[node_id]
        now = time.time()
        joined = {n for n in alive if n not in self.members and n not in self.refused}
        ended = self.membership.answered(now, left, joined)
        if ended is not None:
            log.warning(describe(ended))
        for node_id, n in alive.items():
            if node_id in self.refused and now - self.refused[node_id][0] < REFUSED_RETRY_S:
                continue
            if node_id not in self.members and node_id not in self._starting:
                self._starting[node_id] = asyncio.create_task(self._join(n))

    async def _join(self, node: dict[str, Any]) -> None:
        node_id = node["NodeID"]
        try:
            agent = ensure_agent(node, self.options, self.agent_env)
            door = await asyncio.wait_for(agent.door.remote(), self.start_timeout_s)
            if self.key is not None and door["key"] != self.key:
                why = "its door admits another cluster key (server.cluster_key): restart its agent with this one"
                self.refused[node_id] = (time.time(), why)
                log.warning("node %s stays out: %s", node_id, why)
                return
            self.refused.pop(node_id, None)
            m = Member(node_id, agent, door["url"], door["key"], door.get("pid"))
            self.members[node_id] = m
            await self._refresh(m)
            log.info("node %s joined: door %s", node_id, m.url)
        except Exception as e:  # a node whose agent cannot start stays out, and is retried next poll
            log.warning("node %s: no agent: %r", node_id, e)
        finally:
            self._starting.pop(node_id, None)

    async def wait_started(self) -> None:
        """Until every agent being started has answered (or failed)."""
        while self._starting:
            await asyncio.gather(*self._starting.values(), return_exceptions=True)

    # -- facts --------------------------------------------------------------------------------------

    async def _refresh(self, m: Member) -> None:
        asked = time.time()
        try:
            raw = await asyncio.wait_for(m.agent.facts.remote(), self.call_timeout_s)
        except Exception as e:  # the agent is dead or late: its node leaves routing until it reports again
            self.mark_lost(m.node, f"facts not read within {self.call_timeout_s:g} s: {type(e).__name__}")
            return
        f = node_facts(raw)
        if f.error is not None:
            m.facts = f
            self.mark_lost(m.node, f.error)
        elif m.stopping or asked <= m.changed_at:  # its door is going, or these facts predate what the fleet saw
            return
        else:
            m.facts, m.lost_since, m.why_lost = f, None, ""

    def mark_lost(self, node: str, why: str, *, stopping: bool = False) -> None:
        """``node`` leaves routing now, and its residents with it; ``stopping``: for good (its door is going)."""
        m = self.members.get(node)
        if m is None:
            return
        m.stopping = m.stopping or stopping
        m.changed_at = time.time()
        if m.facts is not None and m.facts.seats:
            m.facts = replace(m.facts, seats=())
        if m.lost_since is None:
            m.lost_since, m.why_lost = m.changed_at, why
            log.warning("node %s leaves routing: %s", node, why)

    def drop_resident(self, node: str, key: str, why: str) -> None:
        """The seat ``key`` is no residence on ``node`` any more (its engine refused a connection), until the
        node's next facts asked after now say otherwise."""
        m = self.members.get(node)
        if m is None or m.facts is None:
            return
        m.changed_at = time.time()
        m.facts = replace(m.facts, seats=tuple(s for s in m.facts.seats if s.key != key))
        log.warning("node %s: %s is no residence there now: %s", node, key, why)

    def routable(self, node: str) -> bool:
        """Whether ``node`` takes requests now (a member, not lost, with facts that did not fail)."""
        m = self.members.get(node)
        return m is not None and m.lost_since is None and m.facts is not None and m.facts.error is None

    async def refresh(self, nodes: list[str] | None = None) -> None:
        ms = [m for n, m in self.members.items() if nodes is None or n in nodes]
        await asyncio.gather(*(self._refresh(m) for m in ms))

    def poke(self) -> None:
        """Poll now (after a load or a failure), not at the next period."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:  # at once: a node list that is late (the GCS away) holds no facts back
                await asyncio.gather(self.sync_nodes(), self.refresh())
            except Exception:
                log.exception("fleet poll failed")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass

    def snapshot(self) -> list[NodeFacts]:
        """Every member's facts; a lost member's as an error, so routing leaves it out and says why."""
        out = []
        for m in self.members.values():
            if m.lost_since is not None:
                out.append(NodeFacts(m.node, m.url, m.lost_since, error=f"lost: {m.why_lost}"))
            elif m.facts is not None:
                out.append(m.facts)
        return out

    async def verdicts(self, model: str, nodes: list[str], contract: dict | None) -> list[Verdict]:
        """The dry runs of ``nodes`` for ``model``, asked at once; a node that does not answer in time refuses."""
        async def one(node: str) -> Verdict:
            m = self.members.get(node)
            if m is None:
                return Verdict(node, "refuse", "left the cluster")
            try:
                got = await asyncio.wait_for(m.agent.plan.remote(model, contract), self.call_timeout_s * 5)
            except Exception as e:
                return Verdict(node, "refuse", f"dry run failed: {type(e).__name__}: {e}")
            return verdict_of(node, got["status"], got["body"])

        return list(await asyncio.gather(*(one(n) for n in nodes)))

    def rows(self, now: float) -> list[dict[str, Any]]:
        """Each member as ``GET /v1/cluster/nodes`` shows it: its door, whether it is routable, since when it is
        lost and why, the age of its facts, its residents, budget, room and models."""
        rows = []
        for m in self.members.values():
            f = m.facts
            rows.append({"node": m.node, "url": m.url, "pid": m.pid, "routable": self.routable(m.node),
                         "lost_since": m.lost_since, "why_lost": m.why_lost or None,
                         "facts_age_s": round(f.age(now), 3) if f is not None else None,
                         "residents": [s.key for s in f.seats] if f is not None else [],
                         "budget_bytes": dict(f.budget_bytes) if f is not None else {},
                         "room_bytes": dict(f.room_bytes) if f is not None else {},
                         "models": sorted(f.models) if f is not None else []})
        rows += [{"node": n, "url": "", "pid": None, "routable": False, "lost_since": t, "why_lost": why,
                  "facts_age_s": None, "residents": [], "budget_bytes": {}, "room_bytes": {}, "models": []}
                 for n, (t, why) in self.refused.items() if n not in self.members]
        return sorted(rows, key=lambda r: r["node"])

    def door(self, node: str) -> tuple[str, str] | None:
        m = self.members.get(node)
        return (m.url, m.key) if m is not None else None
