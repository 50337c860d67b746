"""Planning at life size: the contention simulations with models and budgets of real proportions, and one real run
where two life-size models fit and three do not. Writes the ``lifesize-planning`` section of docs/benchmarks.md.

The simulations run the real ``Scheduler`` and planner in simulated time beside the baselines (``trace_replay``'s
policies over ``tracesim.Sim``), with each model's bytes the price ``fitevict serve`` plans with on this machine
(its ``POST /v1/models/{m}/plan``: mapped + committed host bytes, the engine process's overhead included) and its
load and release seconds measured by one load and unload through the same front door. Both are stored in
``bench/lifesize_planning.json`` by ``--measure``, so a rerun of the simulations needs no model loaded.

    .venv/bin/python bench/lifesize_planning.py --measure   # prices and load seconds, through fitevict serve
    .venv/bin/python bench/lifesize_planning.py --real      # the real run (about 2.5 minutes)
    .venv/bin/python bench/lifesize_planning.py             # the simulations; writes the doc section
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402
from lifesize_planning_doc import doc_body, sim_table  # noqa: E402
from trace_replay import Case, run_case  # noqa: E402
from traces import adversarial_trace, bursty_trace, total_bytes, zipf_trace  # noqa: E402
from tracesim import ModelSpec, Result  # noqa: E402

from fitevict import planner as pl  # noqa: E402
from fitevict.config import load_config  # noqa: E402
from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term  # noqa: E402
from fitevict.pricing.loadconfig import LoadConfig  # noqa: E402

GiB = 2**30
DATA = Path(__file__).resolve().parent / "lifesize_planning.json"
MEASURED = ("qwen2.5-0.5b", "llama-3.2-1b", "gemma-3-1b", "llama-3.1-8b", "qwen3-30b-a3b-6l", "bge-small-en-v1.5")
Q8 = "llama-3.1-8b-q8_0"  # scaled from llama-3.1-8b (no life-size file): see scaled_q8
WORKSTATION = ("llama-3.1-8b", Q8, "qwen3-30b-a3b-6l")
LAPTOP = ("llama-3.1-8b", "qwen3-30b-a3b-6l", "llama-3.2-1b", "gemma-3-1b", "qwen2.5-0.5b", "bge-small-en-v1.5")
REAL = ("qwen2.5-0.5b", "llama-3.2-1b", "gemma-3-1b")
OTHERS = {"workstation": 4 * GiB, "laptop": 3 * GiB}  # declared: the OS, a desktop and a browser
RESERVE = 1 * GiB  # the configuration's default ram_reserve
LONG_TIMEOUT = 900.0  # queue_timeout_seconds of the second table: room for two back-to-back loads of these models


def footprint_of(m: Mapping) -> Footprint:
    """The front door's price as a Footprint: its device terms and sources, mapped and committed host bytes."""
    d = m["footprint"]["devices"][0]
    terms = {t: Term(int(d[f"{t}_bytes"]), d["sources"][t]) for t in ("model", "context", "compute", "output")}
    return Footprint((DeviceFootprint(HOST, **terms),), host_mapped_bytes=int(m["host_mapped_bytes"]),
                     host_committed_bytes=int(m["host_committed_bytes"]), host_source="measured")


def spec_of(key: str, m: Mapping, time_source: str) -> ModelSpec:
    cfg = LoadConfig.from_json(m["config"])
    fp = footprint_of(m)
    assert fp.bytes_on(HOST) == m["needed_bytes"], (key, fp.bytes_on(HOST), m["needed_bytes"])
    return ModelSpec(key=key, request=pl.PlanRequest(key, cfg, "max-gpu"), config=cfg, footprint=fp,
                     bytes={HOST: fp.bytes_on(HOST)}, bytes_source="fitevict serve's plan on this machine",
                     load_seconds=float(m["load_seconds"]),
                     release_seconds=float(m["exit_seconds"] or 0) + float(m["release_seconds"] or 0),
                     time_source=time_source)


def scaled_q8(m8: Mapping, models_dir: Path) -> dict:
    """An 8B Q8_0 (no life-size file): llama-3.1-8b's structure with every Q4_0 tensor retyped Q8_0 (34 bytes per
    32 weights instead of 18, offsets laid out again), priced by the same pricer under the same configuration, with
    the Q4_0 file's dry-run compute bytes (same shapes) and the engine overhead as ``fitevict price`` adds it. The
    same steps on the unchanged structure give the front door's own price to the byte (checked here). Load seconds:
    the Q4_0 file's measured load scaled by the file sizes (declared)."""
    from fitevict.cli.price import process_overhead
    from fitevict.engines.llama_cpp.machine import host_buffers
    from fitevict.pricing.gguf import load_structure
    from fitevict.pricing.price import price
    from gguf import GGMLQuantizationType as Q

    s = load_structure(models_dir / "llama-3.1-8b.gguf")
    cfg = LoadConfig.from_json(m8["config"])
    compute = {HOST: int(m8["footprint"]["devices"][0]["compute_bytes"])}
    host = host_buffers()

    def priced(st) -> tuple[Footprint, int]:
        fp = price(st, cfg, compute=compute, host=host).footprint
        return fp, process_overhead(st, cfg)["bytes"]

    fp, over = priced(s)
    if fp.bytes_on(HOST) + over != m8["needed_bytes"]:
        raise SystemExit(f"scaling check: {fp.bytes_on(HOST) + over} B != the front door's {m8['needed_bytes']} B")
    off, tensors = s.data_offset, []
    for t in s.tensors:
        typ, nb = (Q.Q8_0, t.nbytes // 18 * 34) if t.ggml_type == Q.Q4_0 else (t.ggml_type, t.nbytes)
        tensors.append(replace(t, ggml_type=typ, nbytes=nb, offset=off))
        off += -(-nb // 32) * 32
    q8 = replace(s, tensors=tuple(tensors), file_bytes=off, path=s.path + " (retyped Q8_0)")
    fp, over = priced(q8)
    d = fp.device(HOST)
    assert d is not None
    terms = {t: getattr(d, t) for t in ("model", "context", "compute", "output")}
    return {"file_bytes": off, "config": m8["config"], "needed_bytes": fp.bytes_on(HOST) + over,
            "host_mapped_bytes": fp.host_mapped_bytes, "host_committed_bytes": fp.host_committed_bytes + over,
            "footprint": {"devices": [{**{f"{k}_bytes": v.bytes for k, v in terms.items()},
                                       "sources": {k: v.source for k, v in terms.items()}}]},
            "load_seconds": round(float(m8["load_seconds"]) * off / m8["file_bytes"], 2),
            "exit_seconds": m8["exit_seconds"], "release_seconds": m8["release_seconds"], "scaled": True}


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    machine_bytes: int
    case: Case


def specs(data: Mapping) -> dict[str, ModelSpec]:
    meas = data["measured"]
    src = f"measured: one load and unload each through fitevict serve, {meas['when']}"
    out = {k: spec_of(k, m, src) for k, m in meas["models"].items()}
    out[Q8] = spec_of(Q8, data["scaled"][Q8], "scaled: llama-3.1-8b's measured load x the file-size ratio")
    return out


def budget_of(machine: int, others: int) -> int:
    return machine - RESERVE - others


def scenarios(all_specs: Mapping[str, ModelSpec], quick: bool = False) -> list[Scenario]:
    k = 5 if quick else 1
    ws = {x: all_specs[x] for x in WORKSTATION}
    lap = {x: all_specs[x] for x in LAPTOP}
    wb, lb = budget_of(24 * GiB, OTHERS["workstation"]), budget_of(16 * GiB, OTHERS["laptop"])
    why_w = (f"{wb / GiB:.0f} GiB = 24 GiB less the 1 GiB ram_reserve and 4 GiB declared for the OS and desktop: "
             f"any two of the three fit, all three need {total_bytes(ws) / GiB:.2f} GiB")
    why_l = (f"{lb / GiB:.0f} GiB = 16 GiB less the 1 GiB ram_reserve and 3 GiB declared for the OS and a browser; "
             f"all six need {total_bytes(lap) / GiB:.2f} GiB, the 8B and the MoE together "
             f"{total_bytes(lap, WORKSTATION) / GiB:.2f} GiB")
    return [
        Scenario("24 GiB workstation", 24 * GiB, Case(replace(adversarial_trace(
            WORKSTATION, clients=6, per_client=12 // k, service=3.0), name="workstation: 6 clients x 3 models"),
            ws, wb, why_w)),
        Scenario("24 GiB workstation", 24 * GiB, Case(replace(zipf_trace(
            WORKSTATION, n=400 // k, rate=0.05, service=3.0, s=1.0, seed=11), name="workstation: zipf"),
            ws, wb, why_w)),
        Scenario("24 GiB workstation", 24 * GiB, Case(replace(bursty_trace(
            WORKSTATION, bursts=60 // k, size=(3, 12), gap=60.0, spacing=2.0, service=3.0, seed=12),
            name="workstation: bursty"), ws, wb, why_w)),
        Scenario("16 GiB laptop", 16 * GiB, Case(replace(zipf_trace(
            LAPTOP, n=600 // k, rate=0.1, service=2.0, s=1.0, seed=13), name="laptop: zipf"), lap, lb, why_l)),
        Scenario("16 GiB laptop", 16 * GiB, Case(replace(adversarial_trace(
            LAPTOP, clients=6, per_client=12 // k, service=2.0), name="laptop: 6 clients x 6 models"),
            lap, lb, why_l)),
    ]


def simulate(data: Mapping, quick: bool = False) -> list[tuple[float, list[tuple[Scenario, list[Result]]]]]:
    """Every scenario under the configuration's defaults, then again with ``queue_timeout_seconds`` raised to
    ``LONG_TIMEOUT`` (for every policy): per queue timeout, the rows."""
    config = load_config(None, env={}, overrides={})
    out = []
    for timeout in (config.policy.queue_timeout_seconds, LONG_TIMEOUT):
        c = replace(config, policy=replace(config.policy, queue_timeout_seconds=timeout))
        out.append((timeout, [(sc, run_case(c, sc.case)) for sc in scenarios(specs(data), quick)]))
    return out


def load_data() -> dict:
    return json.loads(DATA.read_text()) if DATA.exists() else {}


def save_data(data: Mapping) -> None:
    DATA.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def real_limit(data: Mapping) -> int:
    """Between the largest pair's price and the three's (the midpoint, to a MiB): two fit, three do not."""
    p = [data["measured"]["models"][k]["needed_bytes"] for k in REAL]
    pair, three = sum(p) - min(p), sum(p)
    return (pair + three) // 2 // 2**20 * 2**20


def code_of() -> str:
    """The fitevict the real run's front door ran: the package's folder and the checkout's commit."""
    import subprocess

    import fitevict

    root = Path(fitevict.__file__).resolve().parent
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent).stdout.strip()
    return f"{root} (this checkout at {head})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true", help="price and time each model through fitevict serve")
    ap.add_argument("--real", action="store_true", help="the real contention run (two fit, three do not)")
    ap.add_argument("--seconds", type=float, default=120.0, help="the real run's length")
    ap.add_argument("--label", default="working tree", help="the real run's name in the doc (one run kept per name)")
    ap.add_argument("--quick", action="store_true", help="a fifth of the simulated requests (no doc written)")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    from _lifesize import life_size_models

    models_dir = Path(life_size_models(MEASURED)[0].path).parent
    data = load_data()
    with tempfile.TemporaryDirectory() as tmp:
        if a.measure:
            from lifesize_planning_real import measure

            data["measured"] = measure(models_dir, MEASURED, Path(tmp))
            data["scaled"] = {Q8: scaled_q8(data["measured"]["models"]["llama-3.1-8b"], models_dir)}
            save_data(data)
        if a.real:
            from lifesize_planning_real import contend

            run = contend(models_dir, REAL, real_limit(data), a.seconds, Path(tmp))
            data.setdefault("real", {})[a.label] = {**run, "code": code_of()}
            save_data(data)
    t0 = time.perf_counter()
    rows = simulate(data, a.quick)
    took = time.perf_counter() - t0
    for timeout, part in rows:
        print(f"queue_timeout_seconds {timeout:g}")
        print(sim_table(part))
    if not (a.no_write or a.quick):
        write_section("lifesize-planning", doc_body(data, rows, took))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
