"""Where a request goes, across nodes. Pure: no I/O, no clock (the caller passes ``now``), no Ray.

Each node reports its facts (``NodeFacts``: the seats it holds with their bytes and GreedyDual credit, its budget
and room per device, its queues, the models it has files for) with the time they were taken. For a model that no
node holds, each node that has its files answers a dry run of its own planner (``Verdict``). The rule:

1. **hit**: a node where the model (for an adapter: its base) is resident, least busy first;
2. **load without eviction**: the node where it fits with the most room left after the load;
3. **the cheapest eviction**: the node whose victims hold the least GreedyDual credit, summed (a victim's
   priority H above its node's floor L: what evicting it throws away, comparable between nodes);
4. **wait**: a node where it fits once requests in flight there finish;
5. else **refuse**, with each node's reason.

Ties go to the node id, so two front doors that see the same facts send the same request to the same node. Facts
older than ``max_age`` leave their node out of routing (it is presumed lost until it reports again). A node may
still refuse what its facts promised (they are a snapshot): ``meaning`` says what its answer means, and the caller
then tries the next candidate; ``no_node_status`` says how a request no node took is answered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

Why = Literal["hit", "load", "evict", "wait"]
# what a node's error answer means for the request it was offered (``meaning``)
Meaning = Literal["answer", "refused", "busy", "stopping", "gone", "cut"]
# a node's door that takes no new work (its supervisor shutting down) answers 503 with these words
STOPPING = "fitevict is shutting down"
# a node's door whose seat's engine does not take the connection answers 502 with these words
ENGINE_GONE = "cannot connect to the engine"
WHY_ORDER: dict[str, int] = {"hit": 0, "load": 1, "evict": 2, "wait": 3}
# the planner's loading actions, best placement first: all on the GPUs, split, then host RAM only
LOAD_ORDER: dict[str, int] = {"load": 0, "partial": 1, "ram": 2}
_EMPTY: Mapping[str, int] = MappingProxyType({})
# the first words of a node's reason to be left out: its facts failed or aged (lost), it lacks the model's files
NO_FACTS, OLD_FACTS, NO_FILES = "facts unavailable", "facts", "has no files for"
# the first words of a node's reason when it is out of routing (lost, stale, gone), and of a reason not about
# bytes (its dry run failed or answered an error)
OUT_OF_ROUTING = (OLD_FACTS, "lost", "left the cluster")
NOT_ON_BYTES = ("dry run failed", "dry run answered")


@dataclass(frozen=True, slots=True)
class NodeSeat:
    """A model resident on a node: its seat key, state, planned bytes per device, requests in flight and waiting,
    and its GreedyDual credit (H - L; None when the node did not say)."""

    key: str
    state: str = "ready"
    bytes: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    in_flight: int = 0
    waiting: int = 0
    credit: float | None = None


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What one node reported at ``taken_at`` (unix seconds). ``models``: seat key -> its base (adapters) or None,
    for every model this node has files for; ``names``: every name (keys and aliases) -> key. ``error``: the
    node's facts could not be read (why); such a node takes no request."""

    node: str
    url: str
    taken_at: float
    seats: tuple[NodeSeat, ...] = ()
    budget_bytes: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    room_bytes: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    waiting: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    models: Mapping[str, str | None] = field(default_factory=dict)
    names: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None

    def age(self, now: float) -> float:
        return max(0.0, now - self.taken_at)

    def seat(self, key: str) -> NodeSeat | None:
        return next((s for s in self.seats if s.key == key and s.state != "stopping"), None)

    @property
    def load(self) -> int:
        """Requests in flight and waiting on this node."""
        return sum(s.in_flight for s in self.seats) + sum(self.waiting.values())


@dataclass(frozen=True, slots=True)
class Verdict:
    """A node's dry run for the model (its planner's Plan, in short): ``action`` (hit, load, partial, ram, wait or
    refuse), the seat it plans for, the victims it would evict, free bytes per device after the plan, what it waits
    for, and its reason."""

    node: str
    action: str
    reason: str = ""
    key: str = ""  # the seat the plan is for
    evict: tuple[str, ...] = ()
    free_after: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    wait_for: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node to try, why (hit, load, evict or wait), the figure that ranked it, in words, and for a hit the seat
    that serves it there."""

    node: str
    why: Why
    detail: str = ""
    seat: str = ""


@dataclass(frozen=True, slots=True)
class Route:
    """The nodes to try, in order, and the nodes left out with their reasons (node, reason)."""

    candidates: tuple[Candidate, ...]
    refused: tuple[tuple[str, str], ...] = ()

    def reasons(self) -> str:
        return "; ".join(f"{n}: {r}" for n, r in self.refused) or "no node has this model's files"


def resolve(name: str, facts: Iterable[NodeFacts]) -> str | None:
    """The model key a name means on any node (its key or an alias; an Ollama ``:latest`` tag dropped), or None."""
    names = [name, name[: -len(":latest")]] if name.endswith(":latest") else [name]
    for f in sorted(facts, key=lambda f: f.node):
        for n in names:
            if n in f.names:
                return f.names[n]
    return None


def seat_key(key: str, facts: Iterable[NodeFacts]) -> str:
    """The key of the seat that serves ``key``: its base's for an adapter, else its own."""
    for f in facts:
        if key in f.models:
            return f.models[key] or key
    return key


def usable(facts: Iterable[NodeFacts], key: str, now: float, max_age: float) -> tuple[list[NodeFacts], list[tuple[str, str]]]:
    """The nodes that may take ``key`` (fresh facts, the model's files), and the others with why not."""
    ok: list[NodeFacts] = []
    out: list[tuple[str, str]] = []
    for f in sorted(facts, key=lambda f: f.node):
        if f.error is not None:
            out.append((f.node, f"{NO_FACTS}: {f.error}"))
        elif f.age(now) > max_age:
            out.append((f.node, f"{OLD_FACTS} {f.age(now):.1f} s old (more than {max_age:g} s): presumed lost"))
        elif key not in f.models:
            out.append((f.node, f"{NO_FILES} {key}"))
        else:
            ok.append(f)
    return ok, out


def hits(key: str, nodes: Sequence[NodeFacts]) -> list[Candidate]:
    """Nodes where the seat for ``key`` (its base's, for an adapter) is resident: least busy first, then most room,
    then node id."""
    found = []
    for f in nodes:
        s = f.seat(f.models.get(key) or key)
        if s is not None:
            found.append((s.in_flight + s.waiting, -sum(f.room_bytes.values()), f.node, s))
    found.sort(key=lambda t: t[:3])
    return [Candidate(node, "hit", f"{s.key} {s.state} there, {busy} request(s) in flight or waiting", s.key)
            for busy, _room, node, s in found]


def eviction_cost(v: Verdict, f: NodeFacts | None) -> float:
    """The summed GreedyDual credit of ``v``'s victims on their node (a victim whose credit is unknown counts as
    its whole planned bytes in GiB, so a known cost is preferred)."""
    total = 0.0
    for key in v.evict:
        s = f.seat(key) if f is not None else None
        if s is not None and s.credit is not None:
            total += max(0.0, s.credit)
        else:
            total += (sum(s.bytes.values()) if s is not None else 1 << 30) / (1 << 30)
    return total


def rank(verdicts: Iterable[Verdict], facts: Mapping[str, NodeFacts]) -> Route:
    """The candidates from the nodes' dry runs, in the routing rule's order; refusals with their reasons."""
    keyed: list[tuple[tuple, Candidate]] = []
    refused: list[tuple[str, str]] = []
    for v in sorted(verdicts, key=lambda v: v.node):
        if v.action == "hit":
            keyed.append(((0, 0, 0.0, v.node), Candidate(v.node, "hit", v.reason, v.key)))
        elif v.action == "wait" and v.key and v.key in v.wait_for:  # its own seat, loading (or busy) there
            keyed.append(((0, 1, 0.0, v.node), Candidate(v.node, "hit", v.reason, v.key)))
        elif v.action in LOAD_ORDER and not v.evict:
            room = sum(v.free_after.values())
            keyed.append(((1, LOAD_ORDER[v.action], -float(room), v.node),
                          Candidate(v.node, "load", f"{v.action}, {room} B left free after it")))
        elif v.action in LOAD_ORDER:
            cost = eviction_cost(v, facts.get(v.node))
            keyed.append(((2, LOAD_ORDER[v.action], cost, v.node),
                          Candidate(v.node, "evict", f"evicts {', '.join(v.evict)}: GreedyDual credit {cost:.4g}")))
        elif v.action == "wait":
            keyed.append(((3, 0, 0.0, v.node), Candidate(v.node, "wait", v.reason)))
        else:
            refused.append((v.node, v.reason or v.action))
    keyed.sort(key=lambda t: t[0])
    return Route(tuple(c for _k, c in keyed), tuple(refused))


def route(key: str, facts: Iterable[NodeFacts], verdicts: Iterable[Verdict] | None, now: float,
          max_age: float) -> Route:
    """The routing rule for ``key``: hits from the facts alone; without one (``verdicts`` None) the caller asks
    the usable nodes' dry runs and calls again with them."""
    nodes, out = usable(facts, key, now, max_age)
    found = hits(key, nodes)
    if found or verdicts is None:
        return Route(tuple(found), tuple(out))
    by_node = {f.node: f for f in nodes}
    ranked = rank((v for v in verdicts if v.node in by_node), by_node)
    return Route(ranked.candidates, tuple(out) + ranked.refused)


def meaning(status: int, body: str, why: Why, routable: bool) -> Meaning:
    """What a node's error answer (``status``, its ``body`` read whole, nothing of it sent to the client yet) means
    for a request routed there as ``why``, the node ``routable`` or not by now:

    - ``stopping``: a 503 from a door that is shutting down: the node leaves routing, the request goes on;
    - ``gone``: a 502 for a seat routed as a hit whose engine refused the connection: that residence is gone (the
      request never reached an engine), and the request goes on;
    - ``cut``: another 502 from a node out of routing: the request was in flight there when it was lost;
    - ``refused``: a 507, the node has no room for it; ``busy``: a 503 or 529, its queue is full: the next node;
    - ``answer``: the node's own answer, for the client."""
    if status == 503 and STOPPING in body:
        return "stopping"
    if status == 502 and why == "hit" and ENGINE_GONE in body:
        return "gone"
    if status == 502 and not routable:
        return "cut"
    if status == 507:
        return "refused"
    if status in (503, 529):
        return "busy"
    return "answer"


def no_node_status(refused: Iterable[tuple[str, str]], *, lost: bool, busy: bool) -> int:
    """The status of a request that no node took: 507 only when every live node with the model's files refused it
    on bytes (a dry run that answered ``refuse``, or a 507), else 503: a node was lost or stopped on the way
    (``lost``), was busy (``busy``), or a dry run failed, or no live node has the files (a retry may be served).
    ``refused``: each node's reason (``usable``'s, the dry runs', the nodes' answers); a node already out of
    routing before the request counts for neither."""
    if lost or busy:
        return 503
    whys = [why for _node, why in refused if not why.startswith((NO_FILES, *OUT_OF_ROUTING))]
    return 507 if whys and not any(why.startswith(NOT_ON_BYTES) for why in whys) else 503
