"""A short real run of the cluster comparison: a Zipf slice through a real ``fitevict serve --ray`` and through a
real Ray Serve deployment with ``@serve.multiplexed`` (``serve_zoo.py``), each on its own real 3-node Ray cluster
on this machine (``ray.cluster_utils.Cluster``), with the same trace, models and per-node budget.

Both sides run real llama-server processes (max_tokens 1). fitevict: each node's door plans against the node's
declared budget (``fitevict_ram_limit_mib``). Serve: one replica per node, models counted (N), never bytes. Loads,
reload bytes and Serve's N are counted with one ruler on both sides: each model's bytes as a door plans them
(``fitevict plan``: ctx 4096, -np 1, the process's own overhead included). Over-budget events: fitevict's from its
doors' planned bytes, sampled every 0.1 s from the residents; Serve's from its replicas' loads and releases as they
happen. Writes ``bench/cluster_real.json``.

    .venv/bin/python bench/cluster_real.py
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _docs import STARTED, Stamp  # noqa: E402
from _serve import cpu_model, load_average  # noqa: E402
from trace_replay import CONTRACT, count_lru_fill, count_lru_max  # noqa: E402
from traces import zipf_trace, zoo_specs  # noqa: E402
from tracesim import Trace, percentile  # noqa: E402

from fitevict.pricing.footprint import HOST  # noqa: E402

MODELS = ("llama-q8_0", "llama-q4_0", "qwen3-headdim", "qwen2-k256", "mamba", "gemma2-swa")
# the per-node budget, from the doors' prices of the day: room for three models of the mean size, so that the two
# largest fit and the three largest do not (checked; Serve's N then differs by the rule that picks it)
MEAN_MODELS_PER_NODE = 3
REQUESTS, RATE, SEED = 90, 3.0, 5
NODES = ("a", "b", "c")
MiB = 2**20
OUT = HERE / "cluster_real.json"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_env(root: Path, zoo: Path, name: str) -> dict[str, str]:
    models = root / f"models-{name}"
    models.mkdir(exist_ok=True)
    for m in MODELS:
        shutil.copyfile(zoo / f"{m}.gguf", models / f"{m}.gguf")
    src = str(HERE.parent / "src")
    return {"FITEVICT_MODELS_DIRS": str(models), "FITEVICT_DATA_DIR": str(root / f"data-{name}"),
            "FITEVICT_YIELD_TO_OTHERS": "false", "FITEVICT_CONFIG": "", "FITEVICT_OLLAMA": "false",
            "FITEVICT_HF_CACHE": "false", "FITEVICT_LMSTUDIO": "false",
            "PYTHONPATH": os.pathsep.join([str(HERE), src])}


def door_sizes(zoo: Path) -> dict[str, int]:
    """Each model's bytes as a node's door plans them (``fitevict plan KEY --json``: this machine's price for its
    llama-server, the process's own overhead included): the ruler of both sides' bytes in the real run."""
    env = {**os.environ, "FITEVICT_CONFIG": "", "FITEVICT_OLLAMA": "false", "FITEVICT_HF_CACHE": "false",
           "FITEVICT_LMSTUDIO": "false", "PYTHONPATH": str(HERE.parent / "src")}
    out = {}
    for m in MODELS:
        got = subprocess.run([sys.executable, "-m", "fitevict.cli", "plan", m, "--models-dir", str(zoo), "--json"],
                             capture_output=True, text=True, env=env, timeout=300, check=True)
        out[m] = sum(json.loads(got.stdout)["needed_bytes"].values())
    return out


def node_budget_mib(sizes: dict[str, int]) -> int:
    """Room for MEAN_MODELS_PER_NODE models of the mean size, in MiB, where the two largest fit and the three
    largest do not."""
    mib = sorted((v / MiB for v in sizes.values()), reverse=True)
    budget = math.ceil(MEAN_MODELS_PER_NODE * sum(mib) / len(mib))
    if not (sum(mib[:2]) <= budget < sum(mib[:3])):
        raise SystemExit(f"a budget of {budget} MiB does not separate the two largest ({sum(mib[:2]):.1f} MiB) from "
                         f"the three largest ({sum(mib[:3]):.1f} MiB): the comparison needs other models")
    return budget


def start_cluster(root: Path, zoo: Path, budget_mib: int):
    from ray.cluster_utils import Cluster

    res = {"fitevict_ram_limit_mib": budget_mib, "serve_slot": 1}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": res, "env_vars": node_env(root, zoo, "a"), "include_dashboard": False})
    for n in NODES[1:]:
        cluster.add_node(num_cpus=1, resources=res, env_vars=node_env(root, zoo, n))
    cluster.wait_for_nodes()
    return cluster


def replay(trace: Trace, send: Callable[[str], tuple[bool, str]]) -> list[dict]:
    """Each request at its time (open loop); its latency is arrival to answer."""
    out: list[dict] = []
    t0 = time.monotonic()

    def one(r) -> None:
        a = time.monotonic()
        try:
            ok, info = send(r.key)
        except Exception as e:  # noqa: BLE001  # a lost request, whatever the cause
            ok, info = False, f"{type(e).__name__}: {e}"
        out.append({"t": a - t0, "model": r.key, "latency": time.monotonic() - a, "ok": ok, "info": info[:200]})

    with ThreadPoolExecutor(max_workers=48) as pool:
        for r in trace.arrivals:
            time.sleep(max(0.0, t0 + r.t - time.monotonic()))
            pool.submit(one, r)
    return out


def loads_of(events: Sequence[tuple[float, str]], sizes: dict[str, int]) -> dict:
    """Loads in time order (time, model): their count and bytes, and the bytes of those loaded before anywhere."""
    seen: set[str] = set()
    loaded = reload = 0
    for _t, m in sorted(events):
        loaded += sizes[m]
        reload += sizes[m] if m in seen else 0
        seen.add(m)
    return {"loads": len(events), "loaded_bytes": loaded, "reload_bytes": reload}


def latency_summary(rows: Sequence[dict]) -> dict:
    lat = [r["latency"] for r in rows if r["ok"]]
    lost = [r for r in rows if not r["ok"]]
    return {"requests": len(rows), "served": len(lat), "lost": len(lost), "lost_examples": [r["info"] for r in lost[:3]],
            "p50_s": percentile(lat, 0.5), "p99_s": percentile(lat, 0.99), "max_s": max(lat, default=None)}


class OverBudget:
    """Per node: resident bytes over time, each change from within the budget to above it an event."""

    def __init__(self, budget: int) -> None:
        self.budget, self.events, self.max_over = budget, 0, 0
        self.over: dict[str, bool] = {}

    def see(self, node: str, held: int) -> None:
        over = held > self.budget
        if over and not self.over.get(node, False):
            self.events += 1
        self.over[node] = over
        self.max_over = max(self.max_over, held - self.budget)


def sample_residents(url: str, ob: OverBudget, stop: threading.Event) -> None:
    nodes: set[str] = set()
    while not stop.wait(0.1):
        try:
            rows = httpx.get(url + "/v1/models/residents", timeout=5).json()["data"]
        except (httpx.HTTPError, KeyError, ValueError):
            continue
        held: Counter = Counter()
        for row in rows:
            nodes.add(row["node"])
            held[row["node"]] += sum(int(d.get("planned_bytes") or 0) for d in (row.get("devices") or {}).values())
        for n in nodes:
            ob.see(n, held[n])


def front_door(root: Path, address: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "FITEVICT_CONFIG": "", "PYTHONPATH": str(HERE.parent / "src")}
    log = (root / "door.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "fitevict.cli", "serve", "--port", str(port), "--data-dir",
                             str(root / "door"), "--ray", address], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"fitevict serve exited: {(root / 'door.log').read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).json().get("routable") == 3:
                return proc, url
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise RuntimeError("fitevict's front door did not see three routable nodes within 240 s")


def routing_hop(cluster_address: str, url: str, model: str, n: int = 40) -> dict:
    """A hit's one-token chat at the node's own door and through the cluster's front door, alternated ``n`` times
    so that the machine's other load falls on both alike: the medians and what routing adds (measured)."""
    import ray

    rows = httpx.get(url + "/v1/models/residents", timeout=60).json()["data"]
    node = next(r["node"] for r in rows if r["key"] == model)
    ray.init(address=cluster_address, namespace="fitevict", logging_level="WARNING", log_to_driver=False)
    try:
        door = ray.get(ray.get_actor(f"fitevict-agent-{node}").door.remote())
    finally:
        ray.shutdown()
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    took: dict[str, list[float]] = {"direct": [], "routed": []}
    with httpx.Client(headers={"Authorization": f"Bearer {door['key']}"}, timeout=60) as c:
        for _ in range(n):
            for how, base in (("direct", door["url"]), ("routed", url)):
                t0 = time.perf_counter()
                if c.post(base + "/v1/chat/completions", json=body).status_code != 200:
                    raise RuntimeError(f"{how}: a hit of {model} was not answered 200")
                took[how].append(time.perf_counter() - t0)
    direct, routed = statistics.median(took["direct"]), statistics.median(took["routed"])
    return {"model": model, "n": n, "direct_p50_s": direct, "routed_p50_s": routed, "added_s": routed - direct}


def run_fitevict(root: Path, zoo: Path, trace: Trace, sizes: dict[str, int], budget_mib: int) -> dict:
    (root / "fitevict").mkdir()
    cluster = start_cluster(root / "fitevict", zoo, budget_mib)
    try:
        proc, url = front_door(root / "fitevict", cluster.address)
        ob, stop = OverBudget(budget_mib * MiB), threading.Event()
        sampler = threading.Thread(target=sample_residents, args=(url, ob, stop), daemon=True)
        sampler.start()
        client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=64))

        def send(model: str) -> tuple[bool, str]:
            r = client.post(url + "/v1/chat/completions", json={
                "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
            return r.status_code == 200, f"{r.status_code} {r.headers.get('x-fitevict-route', '')} {r.text[:120]}"

        rows = replay(trace, send)
        time.sleep(0.5)
        stop.set()
        sampler.join()
        hist = httpx.get(url + "/v1/models/history", params={"event": "load", "limit": 1000}, timeout=60).json()["data"]
        events = [(float(h["time"]), h["model"]) for h in hist]
        routes = Counter(r["info"].split(" ")[1] if r["ok"] else "lost" for r in rows)
        out = {"policy": "fitevict cluster", **latency_summary(rows), **loads_of(events, sizes),
               "over_events": ob.events, "max_over_bytes": max(0, ob.max_over), "routes": dict(routes),
               "loads_per_node": dict(Counter(h.get("node", "?") for h in hist)),
               "hop": routing_hop(cluster.address, url, trace.arrivals[-1].key)}  # resident: the last one asked
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        return out
    finally:
        cluster.shutdown()


def run_serve(root: Path, zoo: Path, trace: Trace, sizes: dict[str, int], n: int, why: str, binary: str,
              budget_mib: int) -> dict:
    import ray
    from ray import serve

    from serve_zoo import RECORDER, Recorder, make_app

    here = root / f"serve-{n}-{why.replace(' ', '-')}"
    here.mkdir()
    cluster = start_cluster(here, zoo, budget_mib)
    try:
        ray.init(address=cluster.address, namespace=RECORDER[1], logging_level="WARNING", log_to_driver=False)
        rec = Recorder.options(name=RECORDER[0], namespace=RECORDER[1]).remote()
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        paths = {m: str(zoo / f"{m}.gguf") for m in MODELS}
        serve.run(make_app(n, binary, paths, sizes), name="zoo", route_prefix="/")
        client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=64))

        def send(model: str) -> tuple[bool, str]:
            r = client.post(f"http://127.0.0.1:{port}/", headers={"serve_multiplexed_model_id": model}, json={})
            return r.status_code == 200, f"{r.status_code} {r.text[:120]}"

        rows = replay(trace, send)
        time.sleep(1.0)
        events = ray.get(rec.all.remote())
        ob, held = OverBudget(budget_mib * MiB), Counter()
        for _t, node, ev, m, b in sorted(events):
            held[node] += b if ev == "load" else -b
            ob.see(node, held[node])
        loads = [(t, m) for t, _node, ev, m, _b in events if ev == "load"]
        out = {"policy": f"Serve N={n} ({why})", **latency_summary(rows), **loads_of(loads, sizes),
               "over_events": ob.events, "max_over_bytes": max(0, ob.max_over),
               "loads_per_node": dict(Counter(node for _t, node, ev, _m, _b in events if ev == "load"))}
        serve.shutdown()
        return out
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> int:
    from fitevict.engines.llama_cpp.install import resolve_binary
    from fitevict.zoo import write_zoo

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the clusters' shutdowns run
    found = resolve_binary("llama-server")
    if found.path is None:
        raise SystemExit(f"no llama-server: {found.why}")
    binary = str(found.path)
    with tempfile.TemporaryDirectory(prefix="fitevict-cluster-real-") as tmp:
        root = Path(tmp)
        write_zoo(root / "zoo", only=sorted(MODELS))
        specs = zoo_specs(root / "zoo", CONTRACT)
        table_sizes = {k: sum(m.bytes.values()) for k, m in specs.items()}
        sizes = door_sizes(root / "zoo")
        specs = {k: replace(m, bytes={HOST: sizes[k]}) for k, m in specs.items()}
        trace = zipf_trace(list(MODELS), n=REQUESTS, rate=RATE, service=0.0, s=1.0, seed=SEED)
        budget_mib = node_budget_mib(sizes)
        budget = budget_mib * MiB
        safe, fill = count_lru_max(specs, budget), count_lru_fill(specs, budget)
        t0 = time.time()
        result = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(), "load_before": load_average(),
                  "stamp": STARTED.to_json(), "took_s": 0.0, "budget_mib": budget_mib, "models": list(MODELS),
                  "sizes_mib": {k: round(v / MiB, 2) for k, v in sizes.items()},
                  "table_sizes_mib": {k: round(v / MiB, 2) for k, v in table_sizes.items()},
                  "trace": trace.about.replace("service 0 s each", "each served for real (max_tokens 1)"), "rows": []}
        runs = [lambda: run_fitevict(root, root / "zoo", trace, sizes, budget_mib)]
        runs += [lambda n=n, why=why: run_serve(root, root / "zoo", trace, sizes, n, why, binary, budget_mib)
                 for n, why in ((safe, "largest safe"), (fill, "mean fits"))]
        for run in runs:
            result["rows"].append(run())
            result["took_s"] = time.time() - t0
            result["load_after"] = load_average()
            OUT.write_text(json.dumps(result, indent=1, default=str) + "\n")  # each side as soon as it is done
            print(json.dumps(result["rows"][-1], default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
