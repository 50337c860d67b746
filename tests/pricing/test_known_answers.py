"""Known answers from another machine: what the pinned llama-server allocated on an Intel Xeon with AMX.

``tests/data/hardware/intel-xeon-amx/runs.json`` holds, for every model of the demo zoo (zoo v1) and several
configurations, every ggml buffer alive at /health to the byte (the allocator trace) and the load log's buffer lines.
Pricing with the rule table for that CPU's flags must give the engine's model buffers exactly, on any machine: which
weights the AMX buffer takes, its packed bytes, and the mapped span left around them. The models are written here
by the zoo v1 recipes, and their sha256 must be the ones the runs were made with.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fitevict.pricing import price as pricing
from fitevict.pricing.buftrace import parse_exact_log
from fitevict.pricing.cmdline import parse_server_argv
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.hostbufs import rule_table
from fitevict.pricing.logparse import device_of

DATA = Path(__file__).parent.parent / "data" / "hardware" / "intel-xeon-amx"
RUNS = json.loads((DATA / "runs.json").read_text())
MANIFEST = json.loads((DATA / "zoo-manifest.json").read_text())


@pytest.fixture(scope="module")
def zoo_v1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fitevict.zoo import write_zoo

    dest = tmp_path_factory.mktemp("zoo-v1")
    written = {m.name: m.path for m in write_zoo(dest, only=tuple(MANIFEST), version=1)}
    for name, entry in MANIFEST.items():
        digest = hashlib.sha256(written[name].read_bytes()).hexdigest()
        assert digest == entry["sha256"], f"zoo v1's {name} is not the file the known answers were measured on"
    return dest


def _engine_log(run: dict) -> str:
    """The run's buffer lines and its allocator trace, as one load log with the trace beside it."""
    bufs = run["buffers_at_health"] or run["buffers_before_death"] or []
    trace = [f"fitevict-buftrace: alloc {b['buft']} {b['bytes']}" for b in bufs]
    return "\n".join([*run["log_buffer_lines"], "fitevict-buftrace: ready", *trace])


def _runs(configs: tuple[str, ...]) -> list[dict]:
    return [r for r in RUNS["runs"] if r["config"] in configs]


AMX = rule_table(RUNS["cpu_flags"])


def test_the_rule_table_for_that_cpu_offers_amx_before_repack() -> None:
    assert AMX.names == ("AMX", "CPU_REPACK")
    assert rule_table(["avx2", "avx512f"]).names == ("CPU_REPACK",)  # an AMD EPYC: no AMX


RUN_CONFIGS = ("c4096_np1", "c4096_np1_norepack")  # the configurations the record has runs of


def test_every_configuration_checked_has_runs() -> None:
    assert {c: len(_runs((c,))) for c in RUN_CONFIGS} == {c: len(MANIFEST) for c in RUN_CONFIGS}


@pytest.mark.parametrize("run", _runs(RUN_CONFIGS),
                         ids=lambda r: f"{r['model'].removesuffix('.gguf')}-{r['config']}")
def test_model_buffers_match_the_engine_to_the_byte(zoo_v1: Path, run: dict) -> None:
    cmd = parse_server_argv([a.replace("<demo-zoo>", str(zoo_v1)) for a in run["argv"][1:]])
    priced = pricing.price(load_structure(cmd.model), cmd.config, host=AMX)
    engine = parse_exact_log(_engine_log(run))
    assert engine.precision_bytes == 0, engine.notes
    assert {b.name: b.bytes for b in priced.buffers} == dict(engine.model_buffers)
    # every one of them is host memory: the budget has no "AMX" device
    assert {device_of(name) for name, _ in engine.model_buffers} == {"CPU"}
    assert priced.footprint.gpu_names == ()
    if run["buffers_at_health"]:
        measured = engine.to_footprint()
        assert priced.footprint.device("CPU").model.bytes == measured.device("CPU").model.bytes
        assert priced.footprint.device("CPU").context.bytes == measured.device("CPU").context.bytes


def test_the_f16_weights_amx_takes_are_the_ones_with_32_row_multiples(zoo_v1: Path) -> None:
    s = load_structure(zoo_v1 / "llama-medium.gguf")
    priced = pricing.price(s, parse_server_argv(["-m", "x", "-c", "4096", "-np", "1"]).config, host=AMX)
    placed = dict(_placement(s))
    # n_embd 960, 320-wide K/V, n_ff 2600: q, k, v, o (rows 960 / 320) go to AMX; ffn (2600 rows, or 2600 columns
    # for ffn_down, not a multiple of 16) and the 12007-row output stay mapped
    assert placed["blk.0.attn_q.weight"] == placed["blk.0.attn_v.weight"] == "AMX"
    assert placed["blk.0.ffn_up.weight"] == placed["blk.0.ffn_down.weight"] == "CPU_Mapped"
    assert placed["output.weight"] == "CPU_Mapped"
    assert {b.name: b.bytes for b in priced.buffers}["AMX"] == 39_321_600


def test_quantized_amx_copies_are_packed_larger_than_the_file(zoo_v1: Path) -> None:
    s = load_structure(zoo_v1 / "llama-q8_0.gguf")
    cfg = parse_server_argv(["-m", "x", "-c", "4096", "-np", "1"]).config
    amx = {b.name: b.bytes for b in pricing.price(s, cfg, host=AMX).buffers}.get("AMX", 0)
    amx_weights = [t for t in s.tensors if _placement_of(s, t.name) == "AMX"]
    assert amx_weights and amx > sum(t.nbytes for t in amx_weights)  # Q8_0 packs 4 B of compensation per block
    assert {b.name for b in pricing.price(s, cfg.with_(repack=False), host=AMX).buffers} == {"CPU_Mapped"}


def _placement(s) -> tuple[tuple[str, str], ...]:
    from fitevict.pricing.placement import place

    return place(s, parse_server_argv(["-m", "x", "-c", "4096", "-np", "1"]).config, AMX).tensor_buffer


def _placement_of(s, name: str) -> str:
    return dict(_placement(s))[name]


def test_the_engines_dry_run_rows_check_the_table(zoo_v1: Path) -> None:
    # the AMX machine's fit step printed "- AMX | 37 = 37 + 0 + 0" for llama-medium: the table that prices 37.5 MiB
    # there agrees with it; a table without AMX is caught by it, with both figures named
    import gzip

    from fitevict.engines.llama_cpp.dryrun import parse_dry_model_rows
    from fitevict.pricing.hostbufs import dry_run_check

    log = gzip.open(DATA / "llama-medium__c4096_np1.log.gz", "rt").read()
    rows = parse_dry_model_rows(log)
    assert rows == {"Host": 158, "AMX": 37}
    s = load_structure(zoo_v1 / "llama-medium.gguf")
    cfg = parse_server_argv(["-m", "x", "-c", "4096", "-np", "1"]).config
    assert dry_run_check(((b.name, b.bytes) for b in pricing.price(s, cfg, host=AMX).buffers), rows) == ()
    wrong = dry_run_check(((b.name, b.bytes) for b in pricing.price(s, cfg, host=rule_table({"avx2"})).buffers), rows)
    assert len(wrong) == 1 and "37 MiB of weights in AMX" in wrong[0] and "0.00 MiB" in wrong[0]
