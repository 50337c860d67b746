"""This machine as the memory rules see it: CPU fingerprints, machine keys, and figures that stay on their machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitevict.engines.llama_cpp.machine import Cpu, machine_key
from fitevict.host.cpu import read_cpu
from fitevict.pricing.footprint import HOST
from fitevict.pricing.hostbufs import is_host_buffer
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.logparse import device_of
from fitevict.store import Store
from fitevict.prices.book import PriceBook

AMX_LSCPU = Path(__file__).parent.parent / "data" / "hardware" / "intel-xeon-amx" / "lscpu.txt"


def _cpuinfo(tmp_path: Path, model: str, flags: str) -> Path:
    p = tmp_path / f"cpuinfo-{len(flags)}"
    p.write_text(f"processor\t: 0\nvendor_id\t: x\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"
                 f"processor\t: 1\nmodel name\t: {model}\nflags\t\t: {flags}\n")
    return p


def test_the_fingerprint_tells_cpus_apart_by_any_flag(tmp_path: Path) -> None:
    amx_flags = next(line.split(":", 1)[1] for line in AMX_LSCPU.read_text().splitlines() if line.startswith("Flags"))
    amx = read_cpu(_cpuinfo(tmp_path, "Intel(R) Xeon(R) Processor", amx_flags))
    assert {"amx_int8", "avx512_vnni"} <= amx.flags and amx.model == "Intel(R) Xeon(R) Processor"
    no_amx = read_cpu(_cpuinfo(tmp_path, "Intel(R) Xeon(R) Processor", amx_flags.replace("amx_int8", "")))
    assert amx.fingerprint != no_amx.fingerprint  # same name, one flag apart: another machine
    again = read_cpu(_cpuinfo(tmp_path, "Intel(R) Xeon(R) Processor", " ".join(sorted(amx_flags.split()))))
    assert again.fingerprint == amx.fingerprint  # the flags' order does not matter
    assert machine_key(None, amx) != machine_key(None, no_amx)


def test_a_buffer_type_is_a_device_only_when_it_names_one() -> None:
    for host in ("CPU", "CPU_Mapped", "CPU_REPACK", "AMX", "CUDA_Host", "KLEIDIAI", "CPU_AARCH64", "SOMETHING_NEW"):
        assert is_host_buffer(host) and device_of(host) == HOST, host
    for dev in ("CUDA0", "CUDA1", "ROCm0", "Vulkan0", "MTL0", "SYCL0"):
        assert not is_host_buffer(dev) and device_of(dev) == dev, dev
    assert not is_host_buffer("AMX", devices=("AMX",))  # only when the engine itself lists it as a device


def test_a_measurement_from_another_machine_is_not_this_ones(tmp_path: Path, zoo: dict) -> None:
    path = zoo["llama-gqa"].path
    store = Store.open(f"sqlite:///{tmp_path / 'fitevict.db'}")
    book = PriceBook(store, tmp_path / "no-engine", "max-ram")
    cfg = LoadConfig(n_ctx=512, n_parallel=1)
    priced = book.footprint(path, cfg)
    assert priced.device(HOST).model.source == "formula"
    measured = json.loads(json.dumps(priced.to_json()).replace('"formula"', '"measured"'))
    # the same file and configuration, measured on another CPU: its key differs, so it is not used here
    other = PriceBook(store, tmp_path / "no-engine", "max-ram")
    other.machine = machine_key(None, Cpu("another CPU", "x86_64", frozenset({"avx2"})))
    store.put_measurement(other.signature(path, cfg), "llama-gqa", "llama-server", measured,
                          total=priced.total_bytes)
    assert other.signature(path, cfg) != book.signature(path, cfg)
    book.forget()
    assert book.footprint(path, cfg).device(HOST).model.source == "formula"
    # measured here, it is used here
    store.put_measurement(book.signature(path, cfg), "llama-gqa", "llama-server", measured, total=priced.total_bytes)
    book.forget()
    assert book.footprint(path, cfg).device(HOST).model.source == "stored-measurement"


@pytest.mark.parametrize("flags,names", [({"avx2", "avx512f", "avx512_vnni", "amx_int8"}, ("AMX", "CPU_REPACK")),
                                          ({"avx2"}, ("CPU_REPACK",)), (set(), ())])
def test_the_rule_table_follows_the_cpu_flags(flags: set, names: tuple) -> None:
    from fitevict.pricing.hostbufs import rule_table

    table = rule_table(flags)
    assert table.names == names and table.source == "rule-table"
    assert "rule-table" in table.label()


def test_a_build_without_amx_has_no_amx_buffer_in_its_rule_table() -> None:
    from fitevict.engines.llama_cpp.install import native_flags
    from fitevict.pricing.hostbufs import rule_table

    amx_cpu = {"avx2", "avx512f", "avx512_vnni", "amx_int8", "amx_tile"}
    table = rule_table(amx_cpu, amx_built=not native_flags(frozenset(amx_cpu)))
    assert table.names == ("CPU_REPACK",) and any("AMX left out" in n for n in table.notes)
