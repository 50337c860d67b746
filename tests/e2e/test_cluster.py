"""One endpoint over a real Ray cluster of three nodes on this machine (``ray.cluster_utils.Cluster``), each node
with its own declared RAM budget, its own models folder and its own door with real llama-server seats; the
cluster's front door is a real ``fitevict serve --ray ADDRESS``, driven through the openai SDK.

The budgets (MiB), against the priced host bytes at the default context (the ~200 MB medium about 280 MiB, the
small models about 30 MiB each, where the engine keeps no extra host buffers; scaled up by the medium's price on a
machine whose engine does: ``_models.machine_budgets``):

    node   budget   files
    a      200      llama-medium, llama-gqa (+ adapters sql, poem), llama-q8_0
    b      400      llama-medium, llama-q8_0
    c      360      llama-medium, llama-gqa (+ adapters sql, poem)
    d      100      llama-q4_0 (joins later)

The nodes share this machine, so each door runs with ``budget.yield_to_others = false``: the other nodes' seats
are other programs' memory to it, and yielding to them would stop its own idle seats for memory that its budget
already leaves to them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from _frontdoor import FrontDoor, engine_pids_of, front_door, poll
from _models import machine_budgets
from faultrows import FaultSeen

ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.e2e

LAYOUT_MIB = {"a": 200, "b": 400, "c": 360, "d": 100}  # scaled to this machine (_models.machine_budgets)
FILES = {"a": ("llama-medium", "llama-gqa", "llama-q8_0"), "b": ("llama-medium", "llama-q8_0"),
         "c": ("llama-medium", "llama-gqa"), "d": ("llama-q4_0",)}
CHAT = [{"role": "user", "content": "hi"}]
KEY = "ck-test-cluster"  # the nodes' server.cluster_key, and the front door's


def _resources(zoo: dict, name: str) -> dict[str, float]:
    return {"fitevict_ram_limit_mib": machine_budgets(zoo, LAYOUT_MIB)[name], f"node_{name}": 1}


class Fleet:
    def __init__(self, cluster, nodes: dict[str, object], doors: list[FrontDoor], root: Path, zoo: dict) -> None:
        self.cluster, self.nodes, self.doors, self.root, self.zoo = cluster, nodes, doors, root, zoo

    def id_of(self, name: str) -> str:
        return self.nodes[name].node_id  # type: ignore[attr-defined]

    def name_of(self, node_id: str) -> str:
        return next(n for n in self.nodes if self.id_of(n) == node_id)


def _models(zoo: dict, root: Path, name: str) -> Path:
    from fitevict.zoo.gguf_adapters import write_adapters

    dest = root / f"models-{name}"
    dest.mkdir()
    for model in FILES[name]:
        shutil.copyfile(zoo[model].path, dest / f"{model}.gguf")
    if "llama-gqa" in FILES[name]:
        write_adapters(dest, names=("sql", "poem"))
    return dest


def _node_env(zoo: dict, root: Path, name: str) -> dict[str, str]:
    return {"FITEVICT_MODELS_DIRS": str(_models(zoo, root, name)), "FITEVICT_DATA_DIR": str(root / f"data-{name}"),
            "FITEVICT_YIELD_TO_OTHERS": "false", "FITEVICT_CONFIG": "", "FITEVICT_CLUSTER_KEY": KEY}


@pytest.fixture(scope="module")
def fleet(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("cluster")
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": _resources(zoo, "a"), "env_vars": _node_env(zoo, root, "a"), "include_dashboard": False})
    nodes = {"a": cluster.head_node}
    for n in ("b", "c"):
        nodes[n] = cluster.add_node(num_cpus=1, resources=_resources(zoo, n), env_vars=_node_env(zoo, root, n))
    cluster.wait_for_nodes()
    try:
        (root / "door").mkdir()
        with front_door(root / "door", "--ray", cluster.address,
                        env={"FITEVICT_CONFIG": "", "FITEVICT_CLUSTER_KEY": KEY}) as door:
            poll(lambda: _routable(door) == 3, "three routable nodes", timeout=180)
            yield Fleet(cluster, nodes, [door], root, zoo)
    finally:
        cluster.shutdown()


def _routable(door: FrontDoor) -> int:
    return httpx.get(door.base_url + "/health", timeout=10).json()["routable"]


def _client(door: FrontDoor) -> openai.OpenAI:
    return openai.OpenAI(base_url=door.base_url + "/v1", api_key="none", max_retries=0, timeout=300)


def chat(door: FrontDoor, model: str, **kw) -> tuple[str, str]:
    """One chat through the SDK: the node that answered (its name in the fixture) and the route taken."""
    raw = _client(door).chat.completions.with_raw_response.create(model=model, messages=CHAT, max_tokens=2, **kw)
    assert raw.parse().choices[0].message is not None
    return raw.headers["x-fitevict-node"], raw.headers["x-fitevict-route"]


def residents(door: FrontDoor) -> list[dict]:
    return httpx.get(door.base_url + "/v1/models/residents", timeout=60).json()["data"]


def nodes(door: FrontDoor) -> list[dict]:
    return httpx.get(door.base_url + "/v1/cluster/nodes", timeout=60).json()["data"]


def loads(door: FrontDoor, model: str) -> list[dict]:
    got = httpx.get(door.base_url + "/v1/models/history", params={"event": "load", "model": model, "limit": 1000},
                    timeout=60)
    return got.json()["data"]


def test_a_model_that_does_not_fit_on_a_loads_on_b(fleet: Fleet) -> None:
    door = fleet.doors[0]
    node, why = chat(door, "llama-medium")
    assert (fleet.name_of(node), why) == ("b", "load")  # a: too big; b: fits with the most room left
    rows = [r for r in residents(door) if r["key"] == "llama-medium"]
    assert [fleet.name_of(r["node"]) for r in rows] == ["b"]


def test_repeated_requests_hit_the_resident_node(fleet: Fleet) -> None:
    door = fleet.doors[0]
    got = [chat(door, "llama-medium") for _ in range(3)]
    assert {(fleet.name_of(n), why) for n, why in got} == {("b", "hit")}
    assert [fleet.name_of(e["node"]) for e in loads(door, "llama-medium")] == ["b"]


def test_streams_relay_through_the_cluster_door_and_name_the_node(fleet: Fleet) -> None:
    door = fleet.doors[0]
    body = {"model": "llama-medium", "messages": CHAT, "stream": True, "options": {"num_predict": 3}}
    with httpx.stream("POST", door.base_url + "/api/chat", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert (fleet.name_of(r.headers["x-fitevict-node"]), r.headers["x-fitevict-route"]) == ("b", "hit")
    assert len(lines) >= 2 and lines[-1]["done"] and not any(line["done"] for line in lines[:-1])
    raw = _client(door).chat.completions.with_raw_response.create(model="llama-medium", messages=CHAT,
                                                                  max_tokens=3, stream=True)
    chunks = list(raw.parse())
    assert (fleet.name_of(raw.headers["x-fitevict-node"]), raw.headers["x-fitevict-route"]) == ("b", "hit")
    assert len(chunks) >= 2 and chunks[-1].choices[0].finish_reason == "length"


def test_every_relayed_api_reaches_the_node_where_the_model_is(fleet: Fleet) -> None:
    """Anthropic's Messages, OpenAI's Responses and llama.cpp's own routes go where chat goes (server.routes)."""
    import anthropic

    door = fleet.doors[0]
    claude = anthropic.Anthropic(base_url=door.base_url, api_key="none", max_retries=0, timeout=300)
    raw = claude.messages.with_raw_response.create(model="llama-medium", max_tokens=2, messages=CHAT)
    assert raw.parse().type == "message"
    answered = [raw.headers]
    resp = _client(door).responses.with_raw_response.create(model="llama-medium", input="hi", max_output_tokens=2)
    assert resp.parse().status == "completed"
    answered.append(resp.headers)
    tok = httpx.post(door.base_url + "/tokenize", json={"model": "llama-medium", "content": "hi"}, timeout=120)
    assert tok.status_code == 200 and tok.json()["tokens"]
    answered.append(tok.headers)
    assert [(fleet.name_of(h["x-fitevict-node"]), h["x-fitevict-route"]) for h in answered] == [("b", "hit")] * 3


def test_metrics_ps_and_the_dashboard_name_the_node(fleet: Fleet) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    door, b = fleet.doors[0], fleet.id_of("b")
    text = httpx.get(door.base_url + "/metrics", timeout=60).text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert {fleet.name_of(s.labels["node"]) for s in fams["fitevict_budget_bytes"].samples} == {"a", "b", "c"}
    held = {(fleet.name_of(s.labels["node"]), s.labels["model"]) for s in fams["fitevict_resident_bytes"].samples}
    assert ("b", "llama-medium") in held
    assert sum(s.value for s in fams["fitevict_cluster_node_routable"].samples) == 3
    ps = subprocess.run([sys.executable, "-m", "fitevict.cli", "ps", "--url", door.base_url], capture_output=True,
                        text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert ps.returncode == 0, ps.stderr
    assert any(line.split()[:2] == [b[:8], "llama-medium"] for line in ps.stdout.splitlines()), ps.stdout
    html = httpx.get(door.base_url + "/dashboard", timeout=60).text
    row = html.split('<tr class="resident" data-model="llama-medium">')[1].split("</tr>")[0]
    assert f'title="{b}">{b[:8]}<' in row


def _p50s(direct: tuple[str, str], routed: str, n: int = 40) -> tuple[float, float]:
    """Median seconds of a one-token chat at the node's door and through the front door, alternated so that the
    machine's other load falls on both alike."""
    body = {"model": "llama-medium", "messages": CHAT, "max_tokens": 1}
    took: dict[str, list[float]] = {"direct": [], "routed": []}
    with httpx.Client(headers={"Authorization": f"Bearer {direct[1]}"}, timeout=60) as c:
        for _ in range(n):
            for how, url in (("direct", direct[0]), ("routed", routed)):
                t0 = time.perf_counter()
                assert c.post(url + "/v1/chat/completions", json=body).status_code == 200
                took[how].append(time.perf_counter() - t0)
    return statistics.median(took["direct"]), statistics.median(took["routed"])


def test_routing_overhead_over_the_node_door(fleet: Fleet) -> None:
    ray.init(address=fleet.cluster.address, namespace="fitevict", logging_level="WARNING")
    try:
        node_door = ray.get(ray.get_actor(f"fitevict-agent-{fleet.id_of('b')}").door.remote())
    finally:
        ray.shutdown()
    assert node_door["key"] == KEY  # the node's own server.cluster_key
    direct, routed = _p50s((node_door["url"], node_door["key"]), fleet.doors[0].base_url)
    print(f"cluster: a hit's p50 {1000 * routed:.1f} ms through the cluster's front door, {1000 * direct:.1f} ms at "
          f"the node's door: {1000 * (routed - direct):+.1f} ms for routing")
    assert routed < direct + 0.25


def test_adapters_route_to_their_base_node(fleet: Fleet) -> None:
    door = fleet.doors[0]
    first, why = chat(door, "llama-gqa:sql")
    assert (fleet.name_of(first), why) == ("c", "load")  # a and c have the files; c has more room left
    assert chat(door, "llama-gqa:poem") == (first, "hit")  # the base's seat serves every adapter of it
    assert [fleet.name_of(e["node"]) for e in loads(door, "llama-gqa")] == ["c"]


def test_admin_routes_reach_the_node_they_concern(fleet: Fleet) -> None:
    door, c = fleet.doors[0], fleet.id_of("c")

    def post(act: str) -> httpx.Response:
        return httpx.post(f"{door.base_url}/v1/models/llama-gqa/{act}", timeout=300)

    plan = post("plan").json()
    assert (fleet.name_of(plan["node"]), plan["route"], plan["plan"]["action"]) == ("c", "hit", "hit")
    assert sorted(fleet.name_of(n["node"]) for n in plan["nodes"]) == ["a", "c"]  # the nodes with its files
    gone = post("unload").json()
    assert [fleet.name_of(n) for n in gone["unloaded_on"]] == ["c"]
    assert not [r for r in residents(door) if r["key"] == "llama-gqa"]
    again = poll(lambda: (p := post("plan").json())["route"] != "hit" and p, "the unload in c's facts")
    assert (fleet.name_of(again["node"]), again["route"], again["plan"]["action"]) == ("c", "load", "ram")
    r = post("load")
    assert r.status_code == 200, r.text
    assert (r.json()["node"], r.json()["route"], r.headers["x-fitevict-node"]) == (c, "load", c)
    assert r.json()["resident"]["state"] == "ready"


@pytest.mark.fault(
    fault="`SIGTERM` to the cluster's front door (`serve --ray`)",
    kind="real door")
def test_two_front_doors_route_alike_and_load_once(fleet: Fleet, tmp_path: Path, fault_seen: FaultSeen) -> None:
    with front_door(tmp_path, "--ray", fleet.cluster.address, env={"FITEVICT_CONFIG": ""}) as second:
        poll(lambda: _routable(second) == 3, "the second front door's three nodes", timeout=120)
        doors = [fleet.doors[0], second, fleet.doors[0], second]
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda d: chat(d, "llama-q8_0"), doors))
    # SIGTERM (front_door's stop): a clean shutdown, not an exit by the signal
    assert fault_seen.running(second.proc.returncode, "the SIGTERMed front door's exit code") == 0
    assert len(fault_seen.client({fleet.name_of(n) for n, _why in got}, "the nodes that answered the 4 requests")) == 1
    assert fleet.name_of(got[0][0]) == "a"  # a and b have it; a has more room left after it
    assert fault_seen.history(len(loads(fleet.doors[0], "llama-q8_0")), "`load` events of the model") == 1


def test_a_killed_node_leaves_routing_and_its_models_load_elsewhere(fleet: Fleet) -> None:
    door = fleet.doors[0]
    assert [fleet.name_of(r["node"]) for r in residents(door) if r["key"] == "llama-medium"] == ["b"]
    b = fleet.id_of("b")
    pid = next(r["pid"] for r in nodes(door) if r["node"] == b)
    t0 = time.monotonic()
    fleet.cluster.remove_node(fleet.nodes["b"], allow_graceful=False)  # SIGKILL: b's raylet and its processes
    poll(lambda: _routable(door) == 2, "b to leave routing", timeout=60)
    detected = time.monotonic() - t0
    print(f"cluster: a killed node left routing {detected:.2f} s after its raylet was killed")
    node, why = chat(door, "llama-medium")
    # a: too big; c: room for it beside the small base it holds (no load is exclusive by default)
    assert (fleet.name_of(node), why) == ("c", "load")
    assert all(r["node"] != b for r in residents(door))
    assert detected < 15.0
    poll(lambda: not Path(f"/proc/{pid}").exists(), "b's door to stop with its agent", timeout=60)


def test_a_node_that_joins_is_used_without_a_restart(fleet: Fleet) -> None:
    door = fleet.doors[0]
    fleet.nodes["d"] = fleet.cluster.add_node(num_cpus=1, resources=_resources(fleet.zoo, "d"),
                                              env_vars=_node_env(fleet.zoo, fleet.root, "d"))
    poll(lambda: _routable(door) == 3, "d to join routing (a, c and d)", timeout=120)
    node, why = chat(door, "llama-q4_0")  # only d has its files
    assert (fleet.name_of(node), why) == ("d", "load")


def test_a_request_in_flight_on_a_lost_node_with_no_other_node_gets_a_503_naming_it(fleet: Fleet) -> None:
    """The node's door dies as a machine does (SIGKILL, no goodbye) while it generates an answer, before its first
    byte: the request goes to the next candidate, and here there is none (a is too small, b is dead)."""
    door, c = fleet.doors[0], fleet.id_of("c")
    pid = next(r["pid"] for r in nodes(door) if r["node"] == c)
    engines = engine_pids_of(pid)
    assert engines
    body = {"model": "llama-medium", "messages": CHAT, "max_tokens": 900, "ignore_eos": True}
    try:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(httpx.post, door.base_url + "/v1/chat/completions", json=body, timeout=300)
            poll(lambda: any(r["in_flight"] for r in residents(door) if r["node"] == c), "a request in flight on c")
            os.kill(pid, signal.SIGKILL)
            r = answer.result(timeout=120)
    finally:
        for e in engines:  # the door's seats, orphaned by its SIGKILL
            os.kill(e, signal.SIGKILL)
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert (err["code"], err["lost"], r.headers["x-should-retry"]) == ("no_node", [c], "true")
    assert f"{c}: lost before the first byte" in err["message"]
    poll(lambda: all(row["node"] != c or not row["routable"] for row in nodes(door)), "c to leave routing")


def test_cluster_stop_stops_every_agent_and_its_door(fleet: Fleet) -> None:
    door = fleet.doors[0]
    pids = {r["node"]: r["pid"] for r in nodes(door)}
    got = subprocess.run([sys.executable, "-m", "fitevict.cli", "cluster", "stop", "--ray", fleet.cluster.address,
                          "--json"], capture_output=True, text=True, timeout=180)
    assert got.returncode == 0, got.stdout + got.stderr
    rows = {r["node"]: r for r in json.loads(got.stdout)}
    # b's agent went with its node: listed gone, whether Ray still lists its name or declared its node dead; c's
    # door was killed
    ended = rows.pop(fleet.id_of("b"))
    assert "gone" in ended, ended
    assert {fleet.name_of(n): r.get("door_exit") for n, r in rows.items()} == {"a": 0, "c": -signal.SIGKILL, "d": 0}
    for node in (fleet.id_of(n) for n in "acd"):
        poll(lambda n=node: not Path(f"/proc/{pids[n]}").exists(), f"{fleet.name_of(node)}'s door to end")
    poll(lambda: _routable(door) == 0, "every node to leave routing")
