"""Faults across a real Ray cluster on this machine (``ray.cluster_utils.Cluster``): the cluster's front door is a
real ``fitevict serve --ray``, each node runs its own door with real llama-server seats.

    node   budget   files                         engine
    h      500 MiB  llama-medium, llama-q8_0,     llama-server        (the head: Ray's GCS, kept in RocksDB, so
                    llama-q4_0                                         that it can be restarted)
    x      600 MiB  llama-medium, llama-gqa       a llama-server that holds llama-medium's start on a FIFO
    z      800 MiB  llama-q4_0                    a llama-server that holds llama-q4_0's start on a FIFO (the
                                                  node killed during a load; no other test routes to it)

The held engines time the faults: a load that started is known by the file its engine writes, and it stays
unfinished until the node is killed, so no fault depends on a race with the machine's speed. Ray declares a node
dead after 3 missed health checks of 1 s here (its default is about 15 s).

The tests share one cluster and run in order: the GCS restart first (nothing killed yet), then x's door killed,
then z killed during a load, then ``cluster stop``, which lists the nodes that died.

The front door starts with Ray's GCS reconnect timeout at 3 s in its environment (``RAY_GCS_SHORT``), shorter than
the GCS outage of the first test, as Ray's default 60 s is shorter than a longer outage: its own
``server.ray_gcs_reconnect_seconds`` (600 s) must win, or Ray ends it while the GCS is down.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from _frontdoor import FrontDoor, front_door, poll
from _held import held_engine, release
from faultrows import FaultSeen

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.e2e

KEY = "ck-test-ray-faults"
BUDGETS_MIB = {"h": 500, "x": 600, "z": 800}
FILES = {"h": ("llama-medium", "llama-q8_0", "llama-q4_0"), "x": ("llama-medium", "llama-gqa"), "z": ("llama-q4_0",)}
HELD = {"x": "llama-medium", "z": "llama-q4_0"}  # the model whose seat start each node's engine holds
CHAT = [{"role": "user", "content": "hi"}]
RAY_GCS_SHORT = {"RAY_gcs_rpc_server_reconnect_timeout_s": "3"}  # as if Ray waited 3 s for its GCS (60 s: its default)


class Rig:
    def __init__(self, cluster, nodes: dict, door: FrontDoor, root: Path, zoo: dict, real: Path) -> None:
        self.cluster, self.nodes, self.door, self.root, self.zoo, self.real = cluster, nodes, door, root, zoo, real

    def id_of(self, name: str) -> str:
        return self.nodes[name].node_id

    def name_of(self, node_id: str) -> str:
        return next(n for n in self.nodes if self.id_of(n) == node_id)

    def started(self, name: str) -> list[int]:
        """The pids of the held seats that started on ``name``."""
        f = self.root / f"engine-{name}" / "gate.started"
        return [int(p) for p in f.read_text().split()] if f.exists() else []


def _resources(name: str) -> dict[str, float]:
    return {"fitevict_ram_limit_mib": BUDGETS_MIB[name]}


def _node_env(zoo: dict, root: Path, name: str, real: Path) -> dict[str, str]:
    models = root / f"models-{name}"
    models.mkdir()
    for model in FILES[name]:
        (models / f"{model}.gguf").symlink_to(zoo[model].path)
    env = {"FITEVICT_MODELS_DIRS": str(models), "FITEVICT_DATA_DIR": str(root / f"data-{name}"),
           "FITEVICT_YIELD_TO_OTHERS": "false", "FITEVICT_CONFIG": "", "FITEVICT_CLUSTER_KEY": KEY}
    if name in HELD:
        env["FITEVICT_LLAMA_SERVER"] = str(held_engine(root / f"engine-{name}", real, HELD[name]) / "llama-server")
    return env


@pytest.fixture(scope="module")
def rig(zoo: dict, llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("ray-faults")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": _resources("h"), "env_vars": _node_env(zoo, root, "h", llama_server),
        "include_dashboard": False,
        "_system_config": {"gcs_storage": "rocksdb", "gcs_storage_path": str(root / "gcs"),
                           "health_check_period_ms": 1000, "health_check_timeout_ms": 1000,
                           "health_check_failure_threshold": 3}})
    nodes = {"h": cluster.head_node, **{n: cluster.add_node(num_cpus=1, resources=_resources(n),
                                                            env_vars=_node_env(zoo, root, n, llama_server))
                                        for n in ("x", "z")}}
    cluster.wait_for_nodes()
    try:
        (root / "door").mkdir()
        with front_door(root / "door", "--ray", cluster.address,
                        env={"FITEVICT_CONFIG": "", "FITEVICT_CLUSTER_KEY": KEY, **RAY_GCS_SHORT}, timeout=240) as door:
            poll(lambda: health(door)["routable"] == 3, "three routable nodes", timeout=180)
            yield Rig(cluster, nodes, door, root, zoo, llama_server)
    finally:
        for name in HELD:  # a held engine still waiting (a test that failed half-way) is let go, to end with its node
            release(root / f"engine-{name}" / "gate")
        cluster.shutdown()


def health(door: FrontDoor) -> dict:
    return httpx.get(door.base_url + "/health", timeout=10).json()


def nodes(door: FrontDoor) -> dict:
    return httpx.get(door.base_url + "/v1/cluster/nodes", timeout=30).json()


def chat(door: FrontDoor, model: str, **kw) -> httpx.Response:
    return httpx.post(door.base_url + "/v1/chat/completions", timeout=300,
                      json={"model": model, "messages": CHAT, "max_tokens": 2, **kw})


def where(r: httpx.Response, rig: Rig) -> tuple[int, str, str]:
    assert r.status_code == 200, r.text
    return r.status_code, rig.name_of(r.headers["x-fitevict-node"]), r.headers["x-fitevict-route"]


def events(rig: Rig, name: str) -> list[tuple[str, str, str]]:
    """(event, model, reason) of every history row in a node's own store, read without its door (oldest first)."""
    with sqlite3.connect(f"file:{rig.root / f'data-{name}' / 'fitevict.db'}?mode=ro", uri=True) as db:
        return [tuple(r) for r in db.execute("SELECT event, model, reason FROM events ORDER BY id")]


def seats(rig: Rig, name: str) -> list[tuple[int, str]]:
    """(pid, model) of every seat record in a node's own store, read without its door."""
    with sqlite3.connect(f"file:{rig.root / f'data-{name}' / 'fitevict.db'}?mode=ro", uri=True) as db:
        return [tuple(r) for r in db.execute("SELECT pid, model FROM seats")]


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
        except OSError:
            continue
    return out


def gone(pid: int) -> bool:
    """The process ended (reaped, or a zombie left for whoever adopted it to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.fault(
    fault="the head node's Ray GCS killed, then started again (its tables kept in RocksDB), with a front door "
          "running (`serve --ray`) whose environment has Ray wait 3 s for its GCS, shorter than the outage",
    kind="real door")
def test_the_gcs_restarted_the_front_door_keeps_its_nodes_and_serves(rig: Rig, fault_seen: FaultSeen) -> None:
    door = rig.door
    assert where(chat(door, "llama-gqa"), rig)[1] == "x"
    killed = time.time()
    rig.cluster.head_node.kill_gcs_server()
    try:
        down = poll(lambda: health(door)["ray"]["down"], "the front door to see Ray's node list unreadable")
        assert down["since"] >= killed and "no answer within" in down["why"]
        assert health(door)["ray"]["gcs_reconnect_s"] == 600 and 0 < down["ends_in_s"] <= 600
        max_age = 5.0  # the fleet's facts deadline: facts read since then were read with the GCS down
        poll(lambda: all(killed + max_age < time.time() - r["facts_age_s"] for r in nodes(door)["data"]),
             f"facts read more than {max_age:g} s after the GCS was killed", timeout=60)
        routable = [r["routable"] for r in nodes(door)["data"]]
        assert fault_seen.running(routable, "nodes routable, the GCS down") == [True, True, True]
        seen_hit = fault_seen.client(where(chat(door, "llama-gqa"), rig), "a hit, the GCS down (status, node, route)")
        assert seen_hit[1:] == ("x", "hit")
        # the dry runs go to the agents
        seen_load = fault_seen.client(where(chat(door, "llama-q8_0"), rig), "a load, the GCS down")
        assert seen_load[1:] == ("h", "load")
        # all of it while the GCS was down
        assert fault_seen.history(health(door)["ray"]["membership"], "`/health` ray.membership") == "unreadable"
        assert fault_seen.running(door.proc.poll(), "the front door's exit code (none: running)") is None
        assert time.time() - killed > float(RAY_GCS_SHORT[
            "RAY_gcs_rpc_server_reconnect_timeout_s"])  # past what its environment gave Ray
        for row in nodes(door)["data"]:  # each agent's worker (its door's parent) waits as long as the front door
            agent = int(Path(f"/proc/{row['pid']}/stat").read_text().rsplit(")", 1)[1].split()[1])
            assert b"RAY_gcs_rpc_server_reconnect_timeout_s=600\0" in Path(f"/proc/{agent}/environ").read_bytes()
    finally:
        rig.cluster.head_node.start_gcs_server()
    back = poll(lambda: (h := health(door)["ray"])["membership"] == "ok" and h["last_outage"], "the node list again",
                timeout=120)
    assert back["seconds"] > max_age
    assert fault_seen.lost(back["left"], "`/health` ray.last_outage: nodes left") == [] and back["joined"] == []
    assert fault_seen.running(health(door)["routable"], "routable nodes after") == 3
    assert fault_seen.client(where(chat(door, "llama-q8_0"), rig), "a hit after")[1:] == ("h", "hit")
    said = "Ray's node list answered again after"
    assert fault_seen.history(said in door.log(), f"the log says {said!r}") is True


@pytest.mark.fault(
    fault="a node's door `SIGKILL`ed (the machine dies: its seats with it) while it holds a streamed answer that "
          "began and a request whose answer had not (its model loading)",
    kind="real door")
def test_a_node_lost_before_its_first_byte_is_retried_and_a_started_stream_ends_node_lost(
        rig: Rig, fault_seen: FaultSeen) -> None:
    door, x = rig.door, rig.id_of("x")
    assert where(chat(door, "llama-gqa"), rig)[1] == "x"  # resident there (a hit, after the GCS test)
    row = next(r for r in nodes(door)["data"] if r["node"] == x)
    stream_body = {"model": "llama-gqa", "messages": CHAT, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    with ThreadPoolExecutor(1) as pool, httpx.stream("POST", door.base_url + "/v1/chat/completions",
                                                     json=stream_body, timeout=300) as s:
        lines = (line for line in s.iter_lines() if line.startswith("data:"))
        first = json.loads(next(lines)[5:])
        assert first["choices"] and s.headers["x-fitevict-node"] == x
        loading = pool.submit(chat, door, "llama-medium")
        poll(lambda: rig.started("x"), "llama-medium's seat to start on x (held)")
        seats = children(row["pid"])
        assert len(seats) == 2  # the streaming seat and the held one
        os.kill(row["pid"], signal.SIGKILL)
        rest = [json.loads(line[5:]) for line in lines if line[5:].strip() != "[DONE]"]
        r = loading.result(timeout=300)
    assert rest and fault_seen.client(rest[-1]["error"]["code"], "the stream's last event: error.code") == "node_lost"
    assert rest[-1]["error"]["node"] == x, rest[-1:]
    assert fault_seen.client(where(r, rig), "the other request (status, node, route)")[1:] == ("h", "load")
    for pid in seats:
        poll(lambda p=pid: gone(p), f"x's seat {pid} to end with its door")
    fault_seen.running(all(gone(p) for p in seats), "x's seats ended with its door")
    assert not fault_seen.running(any(r["routable"] for r in nodes(door)["data"] if r["node"] == x), "x routable")
    assert fault_seen.history([f"{e} {m}" for e, m, _ in events(rig, "x")], "x's own store") == ["load llama-gqa"]
    poll(lambda: ("load", "llama-medium") in [(e, m) for e, m, _ in events(rig, "h")],
         "the retried load in h's store (its history is written after the answer)")
    fault_seen.history(("load", "llama-medium") in [(e, m) for e, m, _ in events(rig, "h")],
                       "the retried `load` in h's store")


@pytest.mark.fault(
    fault="a node killed (its Ray processes `SIGKILL`ed: `Cluster.remove_node`) while its door loads a model for a "
          "request",
    kind="real door")
def test_a_node_killed_during_a_load_sends_the_request_on(rig: Rig, fault_seen: FaultSeen) -> None:
    door, z = rig.door, rig.id_of("z")
    pid = next(r["pid"] for r in nodes(door)["data"] if r["node"] == z)
    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(chat, door, "llama-q4_0")
        (seat,) = poll(lambda: rig.started("z"), "llama-q4_0's seat to start on z (held)")
        rig.cluster.remove_node(rig.nodes["z"], allow_graceful=False)
        r = loading.result(timeout=300)
    assert fault_seen.client(where(r, rig), "the request (status, node, route)")[1:] == ("h", "load")
    poll(lambda: gone(seat) and gone(pid), "z's door and its held seat to end")
    fault_seen.running(gone(seat) and gone(pid), "z's door and its held seat ended")
    poll(lambda: all(r["node"] != z for r in nodes(door)["data"]), "z to leave the front door's view", timeout=60)
    ends = [f"{e}: {reason}" for e, m, reason in events(rig, "z") if m == "llama-q4_0"]
    # its door said goodbye
    assert fault_seen.history(ends, "z's own store") == ["unload: fitevict is shutting down: load cancelled"], ends
    assert fault_seen.running(seats(rig, "z"), "z's seat records") == []


@pytest.mark.fault(
    fault="`fitevict cluster stop` after a node died (Ray declared it dead) and another node's door was killed",
    kind="real door")
def test_cluster_stop_lists_a_node_that_died_as_gone(rig: Rig, fault_seen: FaultSeen) -> None:
    pids = [r["pid"] for r in nodes(rig.door)["data"]]
    got = subprocess.run([sys.executable, "-m", "fitevict.cli", "cluster", "stop", "--ray", rig.cluster.address,
                          "--json"], capture_output=True, text=True, timeout=180)
    assert fault_seen.client(got.returncode, "`cluster stop --json` exit code") == 0, got.stdout + got.stderr
    rows = {rig.name_of(r["node"]): r for r in json.loads(got.stdout)}
    assert fault_seen.client(sorted(rows), "nodes listed") == ["h", "x", "z"], rows
    assert "NODE_DIED" in fault_seen.client(rows["z"]["gone"], "z gone"), rows["z"]
    exits = fault_seen.client((rows["h"].get("door_exit"), rows["x"].get("door_exit")), "door_exit of h, x")
    assert exits == (0, -signal.SIGKILL), rows
    for pid in pids:
        poll(lambda p=pid: gone(p), f"door {pid} to end")
    fault_seen.running(all(gone(p) for p in pids), "every node's door ended")
    h = events(rig, "h")
    unloaded = {m for e, m, r in h if e == "unload" and "shutting down" in r}
    assert fault_seen.history(unloaded == {m for e, m, _ in h if e == "load"},
                              "h's store: each load ended by a shutdown `unload`") is True
