"""``learn`` against recorded probe output: what the probe's one-layer loads allocated on real machines.

Each file in ``tests/data/probe/`` (written by ``bench/probe_record.py`` on the machine it names) holds the raw
answers of the probe's loads: for every case (a ggml type and shape, dense or as experts) the allocator trace of the
engine loading it, and the trace of the all-F32 baseline, with the CPU and the engine build. Read back through
``read_trace`` and taught to ``learn``, the table must place every recorded weight as that machine's engine did, in
the buffer it chose, to the byte, and must state the engine source's own rule for the recorded CPU's features (never
compared with what ``learn`` wrote when the record was made). Runs on any machine: no engine is started.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

from fitevict.engines.llama_cpp.probe import N_EXPERT, Case, Seen, learn, read_trace
from fitevict.host.cpu import Cpu
from fitevict.pricing.ggml_types import CPU_TENSOR_ALIGNMENT, pad
from fitevict.pricing.hostbufs import HostBuffers

RECORDS = sorted((Path(__file__).parent.parent / "data" / "probe").glob("*.json"))


def _read(path: Path) -> tuple[dict, dict[Case, Seen], Seen, HostBuffers]:
    rec = json.loads(path.read_text())
    seen = {Case(QT[c["type"]], c["k"], c["n"], c["expert"]): read_trace(c["trace"]) for c in rec["cases"]}
    baseline = read_trace(rec["baseline"])
    table = learn(seen, baseline, Cpu(rec["cpu"], rec["arch"], frozenset(rec["cpu_flags"])), rec["engine"])
    return rec, seen, baseline, table


def _engine_placed(seen: Seen) -> tuple[str, int] | None:
    """Where the recorded engine put the probed weight: an extra buffer and its bytes, or None (plain CPU)."""
    last = seen.chain[-1] if seen.chain else "CPU"
    return None if last == "CPU" else (last, seen.extra_bytes[last])


def test_there_is_a_record() -> None:
    assert RECORDS, "no probe record in tests/data/probe: run bench/probe_record.py"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_learn_places_every_recorded_weight_as_the_engine_did(path: Path) -> None:
    rec, seen, baseline, table = _read(path)
    assert rec["format"] == 1 and len(seen) == len(rec["cases"])
    assert table.source == "probe" and table.names == tuple(b for b in baseline.order if b != "CPU")
    wrong = {}
    for case, answer in seen.items():
        name = "blk.0.ffn_up_exps.weight" if case.expert else "blk.0.ffn_up.weight"
        shape = (case.k, case.n, N_EXPERT) if case.expert else (case.k, case.n)
        got = table.place(name, case.ggml_type, shape, case.weight_bytes())
        priced = None if got is None else (got[0], pad(got[1], CPU_TENSOR_ALIGNMENT))
        if priced != _engine_placed(answer):
            wrong[case.name] = (priced, _engine_placed(answer))
    assert wrong == {}


# The engine's own rule for x86, read from its source (ggml/src/ggml-cpu/repack.cpp,
# ggml_repack_get_optimal_repack_type, pinned build): the type, the CPU feature its branch needs, and the row count
# (ne[1]) a weight must be a multiple of to get a CPU_REPACK copy
X86_REPACK = {"Q4_0": ("avx2", 8), "Q4_K": ("avx2", 8), "IQ4_NL": ("avx2", 8), "MXFP4": ("avx2", 8),
              "Q2_K": ("avx512f", 8)}


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_learn_gives_the_engines_own_rule(path: Path) -> None:
    """The learned table against what does not come from ``learn``: the engine source's rule for the recorded CPU's
    features, and the buffers the recorded loads put weights in."""
    rec, seen, _baseline, table = _read(path)
    if rec["arch"] != "x86_64":
        pytest.fail(f"{path.name}: a record of {rec['arch']} needs that architecture's rule from repack.cpp here")
    flags = set(rec["cpu_flags"])
    rule = {("CPU_REPACK", t, m) for t, (flag, m) in X86_REPACK.items() if flag in flags}
    assert {(e.name, t, r.row_multiple) for e in table.extras for t, r in e.types} == rule
    # an extra buffer took at least one recorded weight for every type it has a rule for
    taken = {(s.chain[-1], c.ggml_type.name) for c, s in seen.items() if s.chain and s.chain[-1] != "CPU"}
    assert {(e.name, t) for e in table.extras for t, _ in e.types} == taken
