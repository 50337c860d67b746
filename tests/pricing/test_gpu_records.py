"""CUDA placements recorded on a real GPU (bench/gpu_records.jsonl.gz, made by bench/gpu_placement_check.py on an
NVIDIA H200) priced again by today's code: every model buffer by name, the KV cache per device and the output buffer
must equal what the engine allocated, at the precision the record holds (the load log's 0.01 MiB where the
allocator trace was unavailable there)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fitevict.pricing.buftrace import parse_exact_log
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.hostbufs import HostBuffers
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.price import price
from fitevict.units import MiB

RECORDS = Path(__file__).resolve().parents[2] / "bench" / "gpu_records.jsonl.gz"


def _lines() -> list[dict]:
    with gzip.open(RECORDS, "rt") as f:
        return [json.loads(x) for x in f if x.strip()]


def _same(a: int, b: int, precision: int) -> bool:
    return a == b if precision == 0 else f"{a / MiB:.2f}" == f"{b / MiB:.2f}"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[HostBuffers, list[tuple[dict, object]]]:
    from fitevict.zoo import write_zoo

    lines = _lines()
    facts = next(x for x in lines if x["kind"] == "facts")
    loads = [x for x in lines if x["kind"] == "load" and x["ok"]]
    zoo = write_zoo(tmp_path_factory.mktemp("gpu-zoo"), only=sorted({r["model"] for r in loads}))
    structures = {m.name: load_structure(m.path) for m in zoo}
    return HostBuffers.from_json(facts["host_buffers"]), [(r, structures[r["model"]]) for r in loads]


def test_the_records_hold_real_gpu_placements(recorded) -> None:
    _, loads = recorded
    on_gpu = [r for r, _ in loads if any(n == "CUDA0" and b > 0 for n, b in parse_exact_log(r["log"]).model_buffers)]
    assert len(loads) >= 40 and len(on_gpu) >= 30
    assert {r["label"].split(" -fa")[0] for r, _ in loads} >= {"-ngl 0", "-ngl 99", "-ngl 99 -nkvo", "-ngl 2 -lm none",
                                                               "-ngl 99 --n-cpu-moe 1"}


def test_every_recorded_cuda_load_prices_to_the_engines_buffers(recorded) -> None:
    host, loads = recorded
    misses = []
    for rec, s in loads:
        p = price(s, LoadConfig.from_json(rec["config"]), compute=rec["dry_compute"], host=host)
        log = parse_exact_log(rec["log"])
        prec = log.precision_bytes
        got, want = dict(log.model_buffers), {b.name: b.bytes for b in p.buffers}
        meas = log.to_footprint()
        ok = got.keys() == want.keys() and all(_same(got[k], want[k], prec) for k in got)
        ok = ok and _same(sum(n for _, n in log.output_buffers), p.output_at_load, prec)
        for d in p.footprint.devices:
            md = meas.device(d.name)
            ok = ok and _same(d.context.bytes or 0, md.context.bytes if md else 0, prec)
        if not ok:
            misses.append(f"{rec['model']} {rec['label']}: engine {got}, priced {want}")
    assert not misses, "\n".join(misses)
