"""The host buffer probe: the engine's own choice of buffer per weight kind, learned on this machine.

Machine-independent: the trace reader on a real log from an Intel AMX machine, and ``learn`` on the answers an engine
following the AMX machine's rules gives. On this machine: the real engine probed, and its table checked against the
engine's own allocator trace for demo models of every weight type the zoo has, whatever this CPU is.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT

from fitevict.engines.llama_cpp.buftrace import buftrace_library
from fitevict.engines.llama_cpp.probe import Case, Seen, cases, learn, probe, read_trace, run_engine
from fitevict.engines.llama_cpp.machine import Cpu
from fitevict.pricing import price as pricing
from fitevict.pricing.buftrace import parse_exact_log
from fitevict.pricing.ggml_types import CPU_TENSOR_ALIGNMENT, block_size, nbytes, pad
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.hostbufs import HostBuffers, TypeRule, rule_table
from fitevict.pricing.loadconfig import LoadConfig

AMX_DATA = Path(__file__).parent.parent / "data" / "hardware" / "intel-xeon-amx"
AMX_FLAGS = ("avx2", "avx512f", "avx512_vnni", "amx_int8")


def test_the_trace_shows_the_order_the_engine_tries_buffer_types_in() -> None:
    # a real load on an Intel Xeon with AMX: every weight tried AMX, then CPU_REPACK, then CPU
    lines = gzip.open(AMX_DATA / "llama-medium__c4096_np1.log.gz", "rt").read().splitlines()
    seen = read_trace(lines)
    assert seen.order == ("AMX", "CPU_REPACK", "CPU")
    assert seen.extra_bytes == {"AMX": 39_321_600}


def _as_the_amx_engine(case: Case, table: HostBuffers) -> Seen:
    """What the pinned engine on the AMX machine does with one probe model (its rules, as the known answers show)."""
    name = "blk.0.ffn_up_exps.weight" if case.expert else "blk.0.ffn_up.weight"
    shape = (case.k, case.n, 4) if case.expert else (case.k, case.n)
    got = table.place(name, case.ggml_type, shape, case.weight_bytes())
    order = (*table.names, "CPU")
    if got is None:
        return Seen(order, {}, order)
    return Seen(order[:order.index(got[0]) + 1], {got[0]: pad(got[1], CPU_TENSOR_ALIGNMENT)}, order)


def test_learn_recovers_the_amx_rules_from_the_engines_answers() -> None:
    truth = rule_table(AMX_FLAGS)
    seen = {c: _as_the_amx_engine(c, truth) for c in cases()}
    order = (*truth.names, "CPU")
    learned = learn(seen, Seen(order, {}, order), Cpu("test", "x86_64", frozenset(AMX_FLAGS)), "test")
    assert learned.source == "probe" and learned.names == ("AMX", "CPU_REPACK") and not learned.notes
    for extra in truth.extras:
        mine = dict(next(e for e in learned.extras if e.name == extra.name).types)
        for t, rule in extra.types:
            _same_rule(QT[t], mine[t], rule)
    # and where the rules would say nothing (no AMX), nothing is learned for it
    plain = learn({c: Seen(("CPU",), {}, ("CPU",)) for c in cases((QT.Q8_0,))}, Seen(("CPU",), {}, ("CPU",)),
                  Cpu("test", "x86_64", frozenset()), "test")
    assert plain.extras == ()


def _same_rule(t: QT, a: TypeRule, b: TypeRule) -> None:
    """Two rules that take the same weights and allocate the same bytes for them, over many valid shapes."""
    blk = block_size(t)
    for k in range(blk * ((256 + blk - 1) // blk), 1100, blk if blk > 1 else 4):
        for n in range(256, 700, 4):
            for op, shape in (("mul_mat", (k, n)), ("mul_mat_id", (k, n, 4))):
                assert a.takes(op, shape) == b.takes(op, shape), (t.name, op, shape)
                if a.takes(op, shape):
                    nb = nbytes(t, shape)
                    assert a.alloc_bytes(t, shape, nb) == b.alloc_bytes(t, shape, nb), (t.name, shape)


@pytest.fixture(scope="module")
def probed(llama_server: Path) -> HostBuffers:
    got = probe(llama_server, types=(QT.F16, QT.Q4_0, QT.Q8_0, QT.Q4_K, QT.Q6_K), store=False)
    assert isinstance(got, HostBuffers), got
    return got


def test_the_probe_prices_this_machines_weights_as_the_engine_places_them(probed: HostBuffers, zoo: dict,
                                                                         llama_server: Path) -> None:
    # whatever this CPU is: the engine's own buffers (allocator trace, warm-up skipped) equal the probe's price
    lib = buftrace_library()
    assert not hasattr(lib, "reason"), lib
    for name in ("llama-q4_0", "llama-q8_0", "gemma3-q4_0", "llama-gqa"):
        model = zoo[name].path
        engine = parse_exact_log("\n".join(run_engine(llama_server, model, lib)))
        priced = pricing.price(load_structure(model), LoadConfig(n_ctx=256, n_parallel=1), host=probed)
        assert {b.name: b.bytes for b in priced.buffers} == dict(engine.model_buffers), name


def test_the_probe_stores_its_table_for_this_machine(llama_server: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from fitevict.engines.llama_cpp.machine import host_buffers, stored_probe

    monkeypatch.setenv("FITEVICT_CACHE_DIR", str(tmp_path))
    assert stored_probe(llama_server) is None
    assert host_buffers(llama_server).source == "rule-table"  # no probe yet: the labelled rules
    got = probe(llama_server, types=(QT.Q4_0,))
    assert isinstance(got, HostBuffers)
    assert stored_probe(llama_server) == got and host_buffers(llama_server).source == "probe"
    # stored with the CPU's flags and the engine build it came from
    import json

    from fitevict.engines.llama_cpp.machine import machine_key, probe_path, this_cpu

    doc = json.loads(probe_path(llama_server).read_text())
    assert doc["cpu_flags"] == sorted(this_cpu().flags) and doc["machine"] == machine_key(llama_server)
