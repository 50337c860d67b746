"""Several simulated nodes on one virtual clock, and fitevict's cluster front door over them.

Each node is a ``tracesim.Sim`` (its own seats, engines, budget and measurements) whose events go on one shared
heap, so every node sees the same time. A front door receives each request of the trace and chooses the node:

- ``FitevictFront``: the real routing rule (``fitevict.cluster.route.route``) over ``NodeFacts`` polled from every
  node every ``poll`` simulated seconds (as ``cluster/fleet.py`` polls the agents), and on a miss over each node's
  fresh dry run (``Verdict`` from the real planner, ``fitevict.planner.plan``, over the node's real ``Scheduler``
  residents). Each node runs the real ``Scheduler`` over its own declared budget, as its door would;
- ``servesim.ServeFront``: Ray Serve's multiplexed deployment, one replica per node.

Loads count cluster-wide: a load is a reload when that model was loaded before on any node. A node's
over-budget event is a change of its resident bytes from within its budget to above it.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from tracesim import Clocked, FitevictPolicy, ModelSpec, Sim, Trace, _Job, percentile

from fitevict.budget import Budget
from fitevict.cluster.route import NodeFacts, NodeSeat, Verdict, route
from fitevict.schedule.scheduler import SchedPolicy, Waiter

COPY = "~"  # a seat key "model~n": the n-th copy of a model on a node (Serve may hold two while one drains)
MAX_EVENTS = 20_000_000


def model_of(seat_key: str) -> str:
    return seat_key.split(COPY, 1)[0]


class _Specs(dict):
    """The node's models; a copy's seat key resolves to its model's spec."""

    def __missing__(self, key: str) -> ModelSpec:
        return dict.__getitem__(self, model_of(key))


class NodeSim(Sim):
    """One node: a ``Sim`` whose clock and event heap are the world's."""

    def __init__(self, world: World, name: str, models: Mapping[str, ModelSpec], budget: Budget,
                 **kw: Any) -> None:
        self.world, self.name = world, name
        super().__init__(_Specs(models), budget, **kw)
        self.models = _Specs(models)
        self.limit = sum(budget.budget_bytes(d) for d in budget.names)
        self.over_events = 0

    @property  # type: ignore[override]
    def t(self) -> float:
        return self.world.t

    @t.setter
    def t(self, _value: float) -> None:  # the world's clock moves, not the node's
        pass

    def at(self, when: float, fn: Callable[..., Any], *args: Any) -> list:
        return self.world.at(when, fn, *args)

    def _next(self, client: int) -> None:
        self.world.next_client(client)

    def arrive(self, key: str, service: float, client: int | None, arrived: float) -> None:
        """A request the front door sent here; its wait counts from ``arrived`` (at the front door)."""
        assert self.policy is not None
        self._n += 1
        w = Waiter(self.models[key].request, self.t, request_id=f"{self.name}-r{self._n}")
        self.jobs[w] = _Job(arrived, service, client)
        got = self.policy.arrive(w)
        if got is not None:
            self._hand(w, got)

    def start(self, waiter: Waiter, plan: Any) -> None:
        if waiter.key not in self.seats:
            self.world.count_load(model_of(waiter.key), sum(self.models[waiter.key].bytes.values()))
        super().start(waiter, plan)

    def start_seat(self, seat_key: str) -> None:
        """Load a seat under its own key (a copy of its model: ``model~n``)."""
        spec = self.models[seat_key]
        self.start(Waiter(replace(spec.request, key=seat_key), self.t), None)

    def _hold(self, bytes: Mapping[str, int], sign: int) -> None:
        was = sum(self.resident.values()) > self.limit
        super()._hold(bytes, sign)
        if not was and sum(self.resident.values()) > self.limit:
            self.over_events += 1


class Front(Protocol):
    name: str

    def attach(self, world: World) -> None: ...

    def arrive(self, key: str, service: float, client: int | None) -> None: ...


@dataclass(frozen=True, slots=True)
class ClusterResult:
    policy: str
    trace: str
    nodes: int
    requests: int
    served: int
    lost: int
    lost_by: Mapping[str, int]
    loads: int
    loaded_bytes: int
    reload_bytes: int
    over_events: int
    over_max_bytes: int  # the largest excess of one node's resident bytes over its budget (0: never over)
    wait_p50: float
    wait_p99: float
    wait_max: float
    over_timeout: int  # served requests that waited longer than queue_timeout_seconds
    makespan: float
    loads_per_node: tuple[int, ...]
    anomalies: tuple[str, ...]
    routing: Mapping[str, float]  # the front door's own counters and timings


class World(Clocked):
    """The nodes, the shared clock, the trace's clients, and the front door."""

    def __init__(self, n_nodes: int, models: Mapping[str, ModelSpec], budget_bytes: int, *,
                 eviction: str = "cost", exclusive_fraction: float = 1.0) -> None:
        from fitevict.pricing.footprint import HOST

        self.t = 0.0
        self._heap: list[list] = []
        self._seq = 0
        self.models = dict(models)
        budget = Budget.declared({HOST: budget_bytes})
        width = len(str(n_nodes - 1))
        self.nodes = [NodeSim(self, f"node-{i:0{width}d}", models, budget, eviction=eviction,
                              exclusive_fraction=exclusive_fraction) for i in range(n_nodes)]
        self.ever_loaded: set[str] = set()
        self.loads = self.loaded_bytes = self.reload_bytes = 0
        self.lost: Counter = Counter()
        self.pending_arrivals = 0
        self._clients: list[deque[str]] = []
        self._trace: Trace | None = None
        self.front: Front | None = None

    def busy(self) -> bool:
        """Requests still to come or still somewhere in the cluster."""
        return self.pending_arrivals > 0 or any(n.jobs for n in self.nodes)

    def next_client(self, client: int) -> None:
        q = self._clients[client]
        if q:
            assert self._trace is not None
            self.pending_arrivals += 1
            self.at(self.t + self._trace.think, self._arrive, q.popleft(), self._trace.service, client)

    def _arrive(self, key: str, service: float, client: int | None) -> None:
        assert self.front is not None
        self.pending_arrivals -= 1
        self.front.arrive(key, service, client)

    def lose(self, client: int | None, why: str) -> None:
        """A request the front door could not send anywhere."""
        self.lost[why] += 1
        if client is not None:
            self.next_client(client)

    def run(self, front: Front, trace: Trace) -> ClusterResult:
        self.front, self._trace = front, trace
        for r in trace.arrivals:
            self.pending_arrivals += 1
            self.at(r.t, self._arrive, r.key, r.service, None)
        self._clients = [deque(seq) for seq in trace.clients]
        for i in range(len(self._clients)):
            self.next_client(i)
        front.attach(self)
        anomalies: list[str] = []
        self.run_events(MAX_EVENTS, anomalies)
        return self.result(front, trace, anomalies)

    def result(self, front: Front, trace: Trace, anomalies: list[str]) -> ClusterResult:
        waits = [w for n in self.nodes for w in n.waits]
        lost: Counter = Counter(self.lost)
        for node in self.nodes:
            for w, job in node.jobs.items():
                anomalies.append(f"{node.name}: request for {w.key} (arrived {job.arrived:.3f} s) never answered")
                lost["never answered"] += 1
            lost.update(node.lost)
            anomalies.extend(f"{node.name}: {a}" for a in node.anomalies)
        timeout = getattr(front, "queue_timeout", math.inf)
        return ClusterResult(
            policy=front.name, trace=trace.name, nodes=len(self.nodes), requests=trace.requests,
            served=sum(n.served for n in self.nodes), lost=sum(lost.values()), lost_by=dict(lost), loads=self.loads,
            loaded_bytes=self.loaded_bytes, reload_bytes=self.reload_bytes,
            over_events=sum(n.over_events for n in self.nodes),
            over_max_bytes=max(0, max(n.over_budget for n in self.nodes)),
            wait_p50=percentile(waits, 0.5), wait_p99=percentile(waits, 0.99), wait_max=max(waits, default=math.nan),
            over_timeout=sum(1 for w in waits if w > timeout),
            makespan=max(n.last_answer for n in self.nodes), loads_per_node=tuple(n.loads for n in self.nodes),
            anomalies=tuple(anomalies), routing=dict(getattr(front, "stats", {})))


class FitevictFront:
    """fitevict's cluster front door: facts polled every ``poll`` s, the real routing rule, dry runs on a miss;
    each node runs the real ``Scheduler`` over its declared budget."""

    def __init__(self, policy: SchedPolicy, *, idle_unload_seconds: float = 0.0, poll: float = 0.5,
                 max_age: float = 5.0, name: str = "fitevict cluster") -> None:
        self.policy, self.idle_unload_seconds = policy, idle_unload_seconds
        self.poll, self.max_age, self.name = poll, max_age, name
        self.queue_timeout = policy.queue_timeout_seconds
        self.facts: list[NodeFacts] = []
        self.stats: Counter = Counter()

    def attach(self, world: World) -> None:
        self.world = world
        self.by_name = {n.name: n for n in world.nodes}
        for n in world.nodes:
            n.policy = FitevictPolicy(n, self.policy, idle_unload_seconds=self.idle_unload_seconds)
        self._models = {k: None for k in world.models}
        self._names = {k: k for k in world.models}
        self._poll()

    def _poll(self) -> None:
        t0 = time.perf_counter()
        self.facts = [self.node_facts(n) for n in self.world.nodes]
        self.stats["polls"] += 1
        self.stats["facts_s"] += time.perf_counter() - t0
        if self.world.busy():
            self.world.at(self.world.t + self.poll, self._poll)

    def node_facts(self, node: NodeSim) -> NodeFacts:
        sched = node.policy.sched  # type: ignore[union-attr]
        waiting = Counter(w.key for w in sched.queue)
        seats = tuple(NodeSeat(s.key, s.status.value, node.held(s.key), s.in_flight, waiting.get(s.key, 0),
                           s.priority - sched.inflation) for s in sched.seats.values())
        budget = {d: node.declared.budget_bytes(d) for d in node.declared.names}
        held: Counter = Counter()
        for s in seats:
            held.update(s.bytes)
        return NodeFacts(node.name, "", self.world.t, seats, budget, {d: budget[d] - held[d] for d in budget},
                         dict(waiting), self._models, self._names)

    def verdict(self, node: NodeSim, key: str) -> Verdict:
        """The node's dry run, as its door answers ``POST /v1/models/{id}/plan``."""
        sched = node.policy.sched  # type: ignore[union-attr]
        p = sched.plan(node.models[key].request, self.world.t)
        return Verdict(node.name, p.action, reason=p.reason, key=p.key, evict=tuple(e.key for e in p.evict),
                       free_after=dict(p.free_bytes_after), wait_for=tuple(p.wait_for))

    def arrive(self, key: str, service: float, client: int | None) -> None:
        now = self.world.t
        t0 = time.perf_counter()
        r = route(key, self.facts, None, now, self.max_age)
        t1 = time.perf_counter()
        self.stats["decisions"] += 1
        if r.candidates:
            self.stats["hits"] += 1
            self.stats["hit_route_s"] += t1 - t0
        else:
            verdicts = [self.verdict(self.by_name[f.node], key) for f in self.facts if f.error is None]
            t2 = time.perf_counter()
            r = route(key, self.facts, verdicts, now, self.max_age)
            t3 = time.perf_counter()
            self.stats["misses"] += 1
            self.stats["miss_route_s"] += (t1 - t0) + (t3 - t2)
            self.stats["dry_runs"] += len(verdicts)
            self.stats["dry_run_s"] += t2 - t1
        if not r.candidates:
            self.world.lose(client, "refused by every node")
            return
        self.by_name[r.candidates[0].node].arrive(key, service, client, now)


def run_cluster(n_nodes: int, models: Mapping[str, ModelSpec], budget_bytes: int, trace: Trace,
                make: Callable[[], Front], *, eviction: str = "cost", exclusive_fraction: float = 1.0) -> ClusterResult:
    world = World(n_nodes, models, budget_bytes, eviction=eviction, exclusive_fraction=exclusive_fraction)
    return world.run(make(), trace)


def route_costs(r: ClusterResult) -> dict[str, float]:
    """Per decision, in microseconds: a hit's rule, a miss's rule, a miss's dry runs (all nodes, summed, and per
    node), the facts of one node at one poll."""
    s = r.routing
    per = lambda a, b: 1e6 * s.get(a, 0.0) / s[b] if s.get(b) else math.nan  # noqa: E731
    return {"hit_us": per("hit_route_s", "hits"), "miss_us": per("miss_route_s", "misses"),
            "dry_runs_us": per("dry_run_s", "misses"), "dry_run_node_us": per("dry_run_s", "dry_runs"),
            "facts_node_us": 1e6 * s.get("facts_s", 0.0) / max(1, s.get("polls", 0) * r.nodes),
            "hits": s.get("hits", 0), "misses": s.get("misses", 0)}
