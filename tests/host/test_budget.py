"""Budgets: declared arithmetic, validation errors that name the key, and measurement of this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from fitevict.budget import Budget, BudgetError
from fitevict.host.budget import measure_budget
from fitevict.host.procmem import read_meminfo
from fitevict.pricing.footprint import HOST

from .fake_nvml import FakeGpu, FakeNvml

GiB = 1024**3
MiB = 1024**2


def test_declared_totals_are_all_free() -> None:
    b = Budget.declared({"CPU": "16GiB", "CUDA0": 8 * GiB})
    assert b.names == ("CPU", "CUDA0") and b.gpu_names == ("CUDA0",)
    assert b.budget_bytes("CPU") == 16 * GiB and b.budget_bytes("CUDA0") == 8 * GiB
    assert b.budget_bytes("CUDA1") == 0  # a device the budget does not have holds nothing
    assert b.device("CPU").total.source == "declared"  # type: ignore[union-attr]


def test_budget_arithmetic() -> None:
    # total 16, free 12, held by residents 2 -> others use 16 - 12 - 2 = 2 GiB
    # budget = min(limit, total - reserve - others) = min(none, 16 - 1 - 2) = 13 GiB
    b = Budget.declared({"CUDA0": {"total": "16GiB", "free": "12GiB", "held": "2GiB", "reserve": "1GiB"}})
    d = b.device("CUDA0")
    assert d is not None and d.others_bytes == 2 * GiB and d.budget_bytes == 13 * GiB
    # a limit of 10 GiB binds (10 < 13); one of 14 GiB does not
    assert Budget.declared({"CUDA0": {"total": "16GiB", "free": "12GiB", "held": "2GiB", "reserve": "1GiB",
                                      "limit": "10GiB"}}).budget_bytes("CUDA0") == 10 * GiB
    assert Budget.declared({"CUDA0": {"total": "16GiB", "free": "12GiB", "held": "2GiB", "reserve": "1GiB",
                                      "limit": "14GiB"}}).budget_bytes("CUDA0") == 13 * GiB
    # others so large that nothing is left: 0, never negative
    assert Budget.declared({"CPU": {"total": "4GiB", "free": "512MiB", "reserve": "1GiB"}}).budget_bytes("CPU") == 0


@pytest.mark.parametrize(
    ("spec", "key", "value"),
    [
        ({"CPU": {"total": "8GiB", "reserve": -1}}, "ram_reserve", "-1"),
        ({"CUDA0": {"total": "8GiB", "reserve": -5}}, "gpu_reserve", "-5"),
        ({"CPU": {"total": "8GiB", "limit": "9GiB"}}, "ram_limit", "9.00 GiB"),
        ({"CUDA0": {"total": "8GiB", "limit": "12GiB"}}, "gpu_limit", "12.0 GiB"),
        ({"CPU": {"total": "8GiB", "reserve": "8GiB"}}, "ram_reserve", "8.00 GiB"),
        ({"CUDA0": {"total": "8GiB", "reserve": "9GiB"}}, "gpu_reserve", "9.00 GiB"),
        ({"CPU": {"total": "8GiB", "limit": "lots"}}, "ram_limit", "lots"),
    ],
)
def test_invalid_settings_name_key_and_value(spec: dict, key: str, value: str) -> None:
    with pytest.raises(BudgetError) as e:
        Budget.declared(spec)
    assert key in str(e.value) and value in str(e.value)


def test_measure_with_fake_gpus() -> None:
    nvml = FakeNvml(
        [FakeGpu("NVIDIA A", "GPU-a", total=24 * GiB, used=6 * GiB), FakeGpu("NVIDIA B", "GPU-b", total=16 * GiB)]
    )
    b = measure_budget(gpu_limit="12GiB", gpu_reserve="1GiB", ram_reserve="1GiB", nvml=nvml,
                       held={"CUDA0": 4 * GiB}, environ={})
    assert b.names == (HOST, "CUDA0", "CUDA1") and b.notes == ()
    c0, c1 = b.device("CUDA0"), b.device("CUDA1")
    assert c0 is not None and c1 is not None
    # CUDA0: used 6 GiB of which residents hold 4 -> others 2; min(12, 24 - 1 - 2) = 12 (the limit binds)
    assert c0.others_bytes == 2 * GiB and c0.budget_bytes == 12 * GiB
    assert c0.total.source == "nvml NVIDIA A" and c0.limit is not None and "gpu_limit=12GiB" in c0.limit.source
    assert c0.held.source == "measured residents" and c1.held.source == "nothing held"
    # CUDA1: nothing used; min(12, 16 - 1 - 0) = 12
    assert c1.budget_bytes == 12 * GiB
    host = b.device(HOST)
    assert host is not None and host.total.source == "meminfo MemTotal" and host.free.source == "meminfo MemAvailable"
    assert host.total.bytes > 0 and host.budget_bytes > 0


def test_measure_without_gpu_is_host_only_and_says_why() -> None:
    b = measure_budget(nvml=FakeNvml(init_error="Driver Not Loaded"), ram_reserve="1GiB", environ={})
    assert b.names == (HOST,) and b.gpu_names == ()
    assert len(b.notes) == 1 and b.notes[0].startswith("no NVIDIA GPU: ") and "Driver Not Loaded" in b.notes[0]


def test_measure_this_machine() -> None:
    mem = read_meminfo()
    b = measure_budget(ram_reserve="1GiB")
    host = b.device(HOST)
    assert host is not None and host.total.bytes == mem.total_bytes
    assert 0 < host.budget_bytes <= mem.total_bytes - GiB
    assert all(d.total.bytes > 0 for d in b.devices)
    if not b.gpu_names:
        assert any(n.startswith("no NVIDIA GPU: ") for n in b.notes)


def test_measure_validates_config() -> None:
    mem = read_meminfo()
    with pytest.raises(BudgetError, match="ram_limit"):
        measure_budget(ram_limit=mem.total_bytes + GiB, nvml=FakeNvml([]))
    with pytest.raises(BudgetError, match="gpu_limit"):
        measure_budget(gpu_limit="32GiB", nvml=FakeNvml([FakeGpu(total=24 * GiB)]), environ={})
    with pytest.raises(BudgetError, match="ram_reserve"):
        measure_budget(ram_reserve=mem.total_bytes, nvml=FakeNvml([]))


def test_meminfo_override(tmp_path: Path) -> None:
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       8388608 kB\nMemFree:        1 kB\nMemAvailable:   6291456 kB\n")
    b = measure_budget(ram_reserve="1GiB", nvml=FakeNvml([]), meminfo=f)
    # total 8 GiB, available 6 GiB -> others 2 GiB; 8 - 1 - 2 = 5 GiB
    assert b.budget_bytes(HOST) == 5 * GiB


def test_the_engine_s_devices_join_nvml_s_under_their_own_names_with_limits_per_device() -> None:
    from fitevict.engines.llama_cpp.census import census_of

    listing = ("ggml_vulkan: 0 = llvmpipe (LLVM 15.0.6, 256 bits) (llvmpipe) | uma: 0 | fp16: 1\n"
               "ggml_vulkan: Warning: Device type is CPU. This is probably not the device you want.\n"
               "Available devices:\n"
               "  CUDA0: NVIDIA Fake 24GB (24576 MiB, 24000 MiB free)\n"
               "  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)\n"
               "  RPC0: 127.0.0.1:50052 (4096 MiB, 3072 MiB free)\n")
    census = census_of(listing, ("127.0.0.1:50052",), {})
    nvml = FakeNvml([FakeGpu(total=24 * GiB, used=2 * GiB)])
    b = measure_budget(gpu_limit={"Vulkan0": "100MiB", "RPC0": "200MiB"}, gpu_reserve={"RPC0": 0}, nvml=nvml,
                       environ={}, census=census, held={"RPC0": 512 * MiB})
    assert b.names == (HOST, "CUDA0", "Vulkan0", "RPC0")
    cuda, vk, rpc = b.device("CUDA0"), b.device("Vulkan0"), b.device("RPC0")
    assert cuda.free.source == "nvml" and cuda.limit is None  # NVML's device, matched by its CUDA ordinal
    assert vk.unified and vk.unified_source.startswith("engine-reported") and b.unified_names == {"Vulkan0"}
    assert vk.total.bytes == 2048 * MiB and vk.total.source.startswith("engine-reported")
    assert vk.budget_bytes == 100 * MiB and vk.reserve.bytes == 512 * MiB  # a device not named keeps 512 MiB
    # RPC0: the listing saw 1 GiB used by others; residents hold 512 MiB now, so free reads 2.5 GiB and others 1 GiB
    assert rpc.free.bytes == 2560 * MiB and rpc.others_bytes == 1 * GiB and rpc.budget_bytes == 200 * MiB
    assert not rpc.unified


def test_a_census_the_engine_could_not_give_leaves_nvml_s_devices_and_says_why() -> None:
    from fitevict.engines.llama_cpp.census import Census

    b = measure_budget(nvml=FakeNvml([FakeGpu()]), environ={}, census=Census((), (), "unavailable, because no"))
    assert b.gpu_names == ("CUDA0",) and any("unavailable, because no" in n for n in b.notes)
