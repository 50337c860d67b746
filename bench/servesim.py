"""Ray Serve's model multiplexing, simulated: one replica per node, ``@serve.multiplexed(max_num_models_per_replica=N)``.

Modelled on Ray 2.60's source (``ray/serve/multiplex.py`` and ``ray/serve/_private/request_router/``):

- **Replica** (``_ModelMultiplexWrapper.load_model``): a request for a cached model moves it to the end of the LRU
  order and is served at once. Any other request enters the replica's load lock (one ``asyncio.Lock``, FIFO): its
  model id counts as the replica's at once (``_model_load_tasks``); holding the lock, a model cached meanwhile is
  returned, else when N models are cached the least recently used one is dropped from the cache
  (``unload_model_lru``) and the model is loaded, one load at a time. Counting models, never bytes.
- **A dropped model's bytes** are released when its last request in flight finishes (the model object has no
  ``__del__``: its memory goes when the last reference does), so no request is cut. A model asked for again while
  its dropped copy still drains is loaded again beside it.
- **Router** (``PowerOfTwoChoicesRequestRouter`` with ``MultiplexMixin``): on the first try, the replicas whose
  model ids include the request's (loaded or loading), or when none does the replicas with the fewest model ids;
  later tries within the matching timeout (uniform in 1-2 s, ``RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S``)
  the replicas with the fewest models; after it once more those, then every replica. Of two candidates drawn at
  random, the one with the shorter queue that accepts (fewer than ``max_ongoing_requests`` = 5 ongoing); when
  neither accepts, a retry after 0.025 s x 2^attempt, at most 0.5 s. Model ids reach the router at once (Serve
  pushes them every 0.1 s).
- Serve has no request timeout by default (``request_timeout_s`` unset): no request is lost; waits longer than
  fitevict's ``queue_timeout_seconds`` are counted beside.

Each model serves one request at a time (``-np 1``, as fitevict's seats here) and queues the rest, in the same
``tracesim.Sim`` engines that fitevict's nodes run.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

from clustersim import COPY, NodeSim, World

from fitevict.schedule.scheduler import Waiter

MAX_ONGOING = 5  # DEFAULT_MAX_ONGOING_REQUESTS
MATCH_TIMEOUT = 1.0  # RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S (uniform in [1, 2) per request)
BACKOFF = (0.025, 2, 0.5)  # initial, multiplier, max (RAY_SERVE_ROUTER_RETRY_*)


class Replica:
    """One Serve replica on one node: the multiplexer's LRU cache and load lock (the node's ``Policy``)."""

    name = "serve replica"

    def __init__(self, node: NodeSim, n_models: int) -> None:
        self.node, self.n = node, n_models
        self.cache: OrderedDict[str, str] = OrderedDict()  # model -> seat key, least recently used first
        self.lock: deque[Waiter] = deque()  # requests waiting for the load lock, FIFO
        self.loading: tuple[str, str] | None = None  # (model, seat key)
        self.ongoing = 0
        self.draining: set[str] = set()  # seats dropped from the cache, still serving
        self.copies: Counter = Counter()
        self.dropped = 0

    def model_ids(self) -> set[str]:
        """What the replica reports to the router: models cached, loading, or waiting for the lock."""
        return set(self.cache) | {w.key for w in self.lock} | ({self.loading[0]} if self.loading else set())

    # -- the simulator's Policy protocol ------------------------------------------------------------

    def arrive(self, w: Waiter) -> str | None:
        self.ongoing += 1
        if w.key in self.cache:
            self.cache.move_to_end(w.key)
            self.node.dispatch(w, self.cache[w.key])
        else:
            self.lock.append(w)
            self._pump()
        return None

    def loaded(self, key: str, **_kw: object) -> None:
        assert self.loading is not None and self.loading[1] == key
        self.cache[self.loading[0]] = key
        self.loading = None
        self._pump()

    def stopped(self, key: str) -> None:
        pass

    def finished(self, key: str) -> None:
        self.ongoing -= 1
        if key in self.draining and self._idle(key):
            self.draining.discard(key)
            self.node.stop(key, "evict", "dropped from the multiplexer's cache; its last request finished", None)

    def tick(self) -> None:
        pass

    # -- the load lock ------------------------------------------------------------------------------

    def _idle(self, seat_key: str) -> bool:
        s = self.node.seats[seat_key]
        return not s.serving and not s.engine_queue

    def _pump(self) -> None:
        while self.loading is None and self.lock:
            w = self.lock[0]
            if w.key in self.cache:
                self.lock.popleft()
                self.node.dispatch(w, self.cache[w.key])
                continue
            if self.n > 0 and len(self.cache) >= self.n:
                self._drop_lru()
            self.copies[w.key] += 1
            seat = f"{w.key}{COPY}{self.copies[w.key]}"
            self.loading = (w.key, seat)
            self.node.start_seat(seat)

    def _drop_lru(self) -> None:
        _model, seat = self.cache.popitem(last=False)
        self.dropped += 1
        if self._idle(seat):
            self.node.stop(seat, "evict", "dropped from the multiplexer's cache (least recently used)", None)
        else:
            self.draining.add(seat)


@dataclass(eq=False, slots=True)
class _Pending:
    key: str
    service: float
    client: int | None
    arrived: float
    timeout: float
    attempt: int = 0
    tried_first: bool = False
    tried_fewest: bool = False
    tried: list[int] = field(default_factory=list)


class ServeFront:
    """Serve's router over one replica per node (see the module docstring)."""

    def __init__(self, n_models: int, *, queue_timeout: float, seed: int = 0, name: str | None = None) -> None:
        self.n, self.queue_timeout = n_models, queue_timeout
        self.rng = random.Random(seed)
        self.name = name or f"Serve multiplexed N={n_models}"
        self.stats: Counter = Counter()

    def attach(self, world: World) -> None:
        self.world = world
        self.replicas = [Replica(n, self.n) for n in world.nodes]
        for n, r in zip(world.nodes, self.replicas):
            n.policy = r  # type: ignore[assignment]

    def arrive(self, key: str, service: float, client: int | None) -> None:
        p = _Pending(key, service, client, self.world.t, self.rng.uniform(MATCH_TIMEOUT, 2 * MATCH_TIMEOUT))
        self._try(p)

    def _fewest(self) -> list[int]:
        counts = [len(r.model_ids()) for r in self.replicas]
        least = min(counts)
        return [i for i, c in enumerate(counts) if c == least]

    def candidates(self, p: _Pending) -> list[int]:
        if self.world.t - p.arrived < p.timeout:
            holders = [i for i, r in enumerate(self.replicas) if p.key in r.model_ids()]
            out = self._fewest() if not holders or p.tried_first else holders
            p.tried_first = True
            return out
        if not p.tried_fewest:
            p.tried_fewest = True
            return self._fewest()
        return list(range(len(self.replicas)))

    def _try(self, p: _Pending) -> None:
        cands = self.candidates(p)
        chosen = self.rng.sample(cands, min(2, len(cands)))
        ok = [i for i in chosen if self.replicas[i].ongoing < MAX_ONGOING]
        self.stats["tries"] += 1
        if ok:
            i = min(ok, key=lambda i: self.replicas[i].ongoing)
            self.stats["decisions"] += 1
            self.world.nodes[i].arrive(p.key, p.service, p.client, p.arrived)
            return
        first, mult, most = BACKOFF
        delay = min(first * mult ** p.attempt, most)
        p.attempt += 1
        self.world.at(self.world.t + delay, self._try, p)


def dropped(front: ServeFront) -> int:
    return sum(r.dropped for r in front.replicas)
