"""A node that dies under load, on a real Ray cluster of three nodes on this machine (``ray.cluster_utils.Cluster``):
the cluster's front door is a real ``fitevict serve --ray``, each node runs its own door with real llama-server
seats, every node has every model's files, and the budgets differ (MiB, scaled up by the medium's price where the
engine keeps extra host buffers: ``_models.machine_budgets``):

    node   budget
    h      60      the head (Ray's GCS): room for about one small model
    x      220
    y      280

A Zipf load of chats runs from three client threads; y's raylet is SIGKILLed under it (its agent's worker
ends with it, and its door gets SIGTERM and drains). Every request sent after the node left routing is answered
200 by a live node; the models resident on the dead node load elsewhere on their next request; only requests in
flight there may be cut, each 502 ``node_lost`` with ``x-should-retry: true``. Then x's door is SIGTERMed
while its raylet lives, with a load held there (``_held``: its engine waits on a FIFO) and a second request
waiting on it as a hit: both go on to a live node within the same request, and the node stays out of routing.

The tests share one cluster and run in order.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

E2E = str(Path(__file__).resolve().parent.parent / "e2e")
if E2E not in sys.path:
    sys.path.insert(0, E2E)

from _frontdoor import FrontDoor, front_door, poll  # noqa: E402
from faultrows import FaultSeen  # noqa: E402
from _held import held_engine, release  # noqa: E402
from _models import machine_budgets  # noqa: E402

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.e2e

KEY = "ck-test-node-dies"
LAYOUT_MIB = {"h": 60, "x": 220, "y": 280}  # scaled to this machine (_models.machine_budgets)
MODELS = ("llama-q8_0", "llama-q4_0", "qwen3-headdim", "qwen2-k256", "mamba", "gemma2-swa")
HELD_MODEL = "llama-tied"  # every node has it, the Zipf load does not ask for it; its seat start is held on x
CHAT = [{"role": "user", "content": "hi"}]


@dataclass
class Sent:
    """One request of the load: when it was sent and answered (monotonic seconds), and how."""

    model: str
    sent: float
    done: float = 0.0
    status: int = 0
    node: str = ""
    route: str = ""
    code: str = ""
    retry: str = ""


class Rig:
    def __init__(self, cluster, nodes: dict, door: FrontDoor, root: Path) -> None:
        self.cluster, self.nodes, self.door, self.root = cluster, nodes, door, root

    def started(self, name: str) -> list[int]:
        """The pids of the held seats that started on ``name``."""
        f = self.root / f"engine-{name}" / "gate.started"
        return [int(p) for p in f.read_text().split()] if f.exists() else []

    def id_of(self, name: str) -> str:
        return self.nodes[name].node_id

    def name_of(self, node_id: str) -> str:
        return next((n for n in self.nodes if self.id_of(n) == node_id), node_id)


def _node_env(zoo: dict, root: Path, name: str, real: Path) -> dict[str, str]:
    models = root / f"models-{name}"
    models.mkdir()
    for m in (*MODELS, HELD_MODEL):
        shutil.copyfile(zoo[m].path, models / f"{m}.gguf")
    env = {"FITEVICT_MODELS_DIRS": str(models), "FITEVICT_DATA_DIR": str(root / f"data-{name}"),
           "FITEVICT_YIELD_TO_OTHERS": "false", "FITEVICT_CONFIG": "", "FITEVICT_CLUSTER_KEY": KEY}
    if name == "x":
        env["FITEVICT_LLAMA_SERVER"] = str(held_engine(root / f"engine-{name}", real, HELD_MODEL) / "llama-server")
    return env


@pytest.fixture(scope="module")
def rig(zoo: dict, llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("node-dies")
    budgets = machine_budgets(zoo, LAYOUT_MIB)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"fitevict_ram_limit_mib": budgets["h"]},
        "env_vars": _node_env(zoo, root, "h", llama_server), "include_dashboard": False})
    nodes = {"h": cluster.head_node}
    for n in ("x", "y"):
        nodes[n] = cluster.add_node(num_cpus=1, resources={"fitevict_ram_limit_mib": budgets[n]},
                                    env_vars=_node_env(zoo, root, n, llama_server))
    cluster.wait_for_nodes()
    try:
        (root / "door").mkdir()
        with front_door(root / "door", "--ray", cluster.address,
                        env={"FITEVICT_CONFIG": "", "FITEVICT_CLUSTER_KEY": KEY}, timeout=240) as door:
            poll(lambda: len(routable(door)) == 3, "three routable nodes", timeout=180)
            yield Rig(cluster, nodes, door, root)
    finally:
        release(root / "engine-x" / "gate")  # a held engine still waiting (a test that failed half-way) is let go
        cluster.shutdown()


def nodes_of(door: FrontDoor) -> list[dict]:
    return httpx.get(door.base_url + "/v1/cluster/nodes", timeout=30).json()["data"]


def routable(door: FrontDoor) -> set[str]:
    return {r["node"] for r in nodes_of(door) if r["routable"]}


def residents(door: FrontDoor) -> dict[str, set[str]]:
    """node -> the models resident there."""
    out: dict[str, set[str]] = {}
    for r in httpx.get(door.base_url + "/v1/models/residents", timeout=60).json()["data"]:
        out.setdefault(r["node"], set()).add(r["key"])
    return out


def send(door: FrontDoor, model: str) -> Sent:
    s = Sent(model, time.monotonic())
    r = httpx.post(door.base_url + "/v1/chat/completions", timeout=300,
                   json={"model": model, "messages": CHAT, "max_tokens": 2})
    s.done, s.status = time.monotonic(), r.status_code
    s.node, s.route = r.headers.get("x-fitevict-node", ""), r.headers.get("x-fitevict-route", "")
    s.retry = r.headers.get("x-should-retry", "")
    if r.status_code != 200:
        err = r.json().get("error") or {}
        s.code, s.node = str(err.get("code") or ""), s.node or str(err.get("node") or "")
    return s


def loads(door: FrontDoor, model: str) -> list[dict]:
    """The live nodes' load events of ``model`` (each with its node and unix time)."""
    got = httpx.get(door.base_url + "/v1/models/history", params={"event": "load", "model": model, "limit": 1000},
                    timeout=60)
    return got.json()["data"]


def zipf(n: int, seed: int) -> list[str]:
    """``n`` model names drawn by Zipf's law (s = 1) over ``MODELS``, in a fixed order."""
    rnd = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(MODELS))]
    return rnd.choices(MODELS, weights=weights, k=n)


def run_load(door: FrontDoor, models: list[str], out: list[Sent], clients: int = 3) -> None:
    lock = threading.Lock()
    queue = iter(models)

    def client() -> None:
        while True:
            with lock:
                model = next(queue, None)
            if model is None:
                return
            got = send(door, model)
            with lock:
                out.append(got)

    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client) for _ in range(clients)]:
            f.result()


def left_routing(door: FrontDoor, node: str) -> float:
    """Poll until ``node`` is out of routing; the monotonic time it was seen so."""
    poll(lambda: node not in routable(door), "the node to leave routing", timeout=60)
    return time.monotonic()


def check_after(sent: list[Sent], dead: str, t_kill: float, t_left: float, seen: FaultSeen) -> None:
    """Sent after the node left routing: 200 from a live node. Anything else: in flight when it died, and 502
    ``node_lost`` naming it."""
    for s in sent:
        if s.sent >= t_left:
            assert seen.client((s.status, s.node != dead), "sent after the node left routing: (status, live node)") \
                == (200, True), s
        elif s.status != 200:
            assert s.done >= t_kill
            got = seen.client((s.status, s.code, s.node == dead, s.retry),
                              "cut in flight: (status, code, naming the node, x-should-retry)")
            assert got == (502, "node_lost", True, "true"), s
    # every request has its answer (a transport error would have failed ``send``): those not 200 were checked above
    seen.lost(sum(1 for s in sent if s.status != 200), f"of {len(sent)} requests, cut in flight (502 node_lost)")


@pytest.mark.fault(
    fault="a node's raylet `SIGKILL`ed under a Zipf load from three clients (its agent's worker ends with it; its "
          "door gets `SIGTERM` and drains)",
    kind="real door")
def test_a_raylet_killed_under_a_zipf_load(rig: Rig, fault_seen: FaultSeen) -> None:
    door = rig.door
    warm: list[Sent] = []
    run_load(door, zipf(24, seed=1), warm)
    assert all(s.status == 200 for s in warm), [s for s in warm if s.status != 200]
    held = residents(door)
    victim = "y"  # the largest budget: it holds the most
    dead = rig.id_of(victim)
    only_there = {m for m in held.get(dead, ()) if not any(m in ms for n, ms in held.items() if n != dead)}
    assert only_there, held

    sent: list[Sent] = []
    loader = threading.Thread(target=run_load, args=(door, zipf(60, seed=2), sent))
    loader.start()
    poll(lambda: len(sent) >= 10, "the load under way", timeout=300)
    t_kill, killed_at = time.monotonic(), time.time()
    rig.nodes[victim].kill_raylet()
    t_left = left_routing(door, dead)
    loader.join()
    after = {m: send(door, m) for m in sorted(only_there)}  # each dead node's model, once more
    check_after(sent + list(after.values()), dead, t_kill, t_left, fault_seen)
    firsts = {}
    for m in only_there:  # loaded on a live node since the kill; its first answer from one, measured
        moved = any(e["node"] != dead and e["time"] >= killed_at for e in loads(door, m))
        assert fault_seen.history(moved, "each of its models: a `load` on a live node since the kill"), (
            m, loads(door, m))
        firsts[m] = min(s.done for s in sent + list(after.values())
                        if s.model == m and s.done >= t_kill and s.status == 200 and s.node != dead) - t_kill
    for s in sorted(sent, key=lambda s: s.sent):
        if s.done >= t_kill:
            print(f"  {s.sent - t_kill:+7.2f} {s.done - t_kill:+7.2f} {s.model:14} {s.status} "
                  f"{rig.name_of(s.node)} {s.route or s.code}")
    cut = [s for s in sent if s.status != 200]
    print(f"cluster: {victim}'s raylet killed under a Zipf load: out of routing {t_left - t_kill:.2f} s after "
          f"(seen by polling); the first answer from a live node for one of its models ({', '.join(sorted(only_there))}) "
          f"{min(firsts.values()):.2f} s after the kill, each loaded on a live node since; "
          f"{sum(s.sent >= t_left for s in sent)} requests sent after it left, all 200; "
          f"{len(cut)} cut in flight ({', '.join(s.code for s in cut) or 'none'})")
    assert fault_seen.running(dead in residents(door), "seats on the dead node in the front door's view") is False


def gone(pid: int) -> bool:
    """The process ended (reaped, or a zombie left for its parent to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def queued(row: dict, model: str) -> int:
    """Requests waiting at a node's own door for ``model`` (its seat loading, or busy)."""
    got = httpx.get(row["url"] + "/v1/models/residents", headers={"authorization": f"Bearer {KEY}"}, timeout=30)
    return int(got.json()["waiting"].get(model, 0))


@pytest.mark.fault(
    fault="a node's door `SIGTERM`ed while its raylet and agent live, a load held there and a second request "
          "waiting on it as a hit",
    kind="real door")
def test_a_door_sigtermed_while_its_raylet_lives(rig: Rig, fault_seen: FaultSeen) -> None:
    """The node's door is told to stop (SIGTERM) while a load there is held and a second request for the same
    model waits on it (a hit: its seat is loading there). The door answers both 503 "shutting down"; both go on to
    a live node within the same request. Its agent and raylet live on; the node stays out of routing."""
    door, victim = rig.door, "x"
    node = rig.id_of(victim)
    assert routable(door) == {rig.id_of("h"), node}
    for m in sorted(residents(door).get(node, ())):  # x empty: the most room left after a load is there
        assert httpx.post(f"{door.base_url}/v1/models/{m}/unload", timeout=300).status_code == 200
    row = poll(lambda: next((r for r in nodes_of(door) if r["node"] == node and not r["residents"]), None),
               "x empty in the front door's facts")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(send, door, HELD_MODEL)  # loads where it fits with the most room left: held there
        poll(lambda: rig.started(victim), f"{HELD_MODEL}'s seat to start on x")
        poll(lambda: HELD_MODEL in next(r for r in nodes_of(door) if r["node"] == node)["residents"],
             "the loading seat in the node's facts")
        second = pool.submit(send, door, HELD_MODEL)  # a hit on the node: it waits on the load
        poll(lambda: queued(row, HELD_MODEL) >= 2, "both requests waiting at the node's door")
        t_kill = time.monotonic()
        os.kill(row["pid"], signal.SIGTERM)  # the door drains and stops; its agent and raylet live on
        t_left = left_routing(door, node)
        answers = [first.result(timeout=300), second.result(timeout=300)]
    again = send(door, HELD_MODEL)
    check_after([*answers, again], node, t_kill, t_left, fault_seen)
    both = fault_seen.client([(a.status, a.node != node) for a in answers], "both requests: (status, live node)")
    assert both == [(200, True)] * 2, answers
    assert fault_seen.client((again.status, again.route), "once more: (status, route)") == (200, "hit")
    assert again.node == answers[1].node
    ended = rig.root / f"data-{victim}" / "node-door.log"
    try:
        poll(lambda: gone(row["pid"]), "the door to end", timeout=60)
    except AssertionError:
        raise AssertionError(f"the door {row['pid']} did not end: {ended.read_text()[-3000:]}") from None
    fault_seen.running(gone(row["pid"]), "the node's door ended")
    out = next(r for r in nodes_of(door) if r["node"] == node)  # its agent still answers: the node stays out
    assert fault_seen.running(out["routable"], "the node routable (its agent alive)") is False
    assert fault_seen.running(out["residents"], "its residents") == [], out
