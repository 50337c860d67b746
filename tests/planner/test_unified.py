"""Unified memory counted once: a device whose memory is host memory spends the host budget too.

The rule (``fitevict.budget.charged``): every byte on a unified device counts against the host budget as well, and the
device's own budget is a limit inside the host's. Checked by re-adding the bytes, never from the plan's arithmetic.
"""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from fitevict.budget import Budget, charged
from fitevict.planner import LOADING_ACTIONS, Policy, Resident, plan
from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig

from .tables import TableModel, footprint_fn
from .test_planner_properties import NOW, SETTINGS, U, models

MiB = 1024**2
GiB = 1024**3
VK = "Vulkan0"


def test_a_model_that_fits_each_budget_alone_but_not_both_is_not_loaded_whole_on_the_unified_device() -> None:
    # 4 blocks of 256 MiB + 256 MiB output = 1.25 GiB on the device when whole; 64 MiB embeddings on the host.
    m = TableModel("m", dense=(256 * MiB,) * 4, output=256 * MiB, embd=64 * MiB)
    whole_vk = 1280 * MiB
    # The device has 2 GiB and the host 1.5 GiB: each alone holds the whole model (1.25 GiB + 64 MiB host).
    separate = Budget.declared({HOST: "1536MiB", VK: "2GiB"})
    p = plan(m.request(), [], separate, footprint_fn(m), Policy(), NOW)
    assert p.action == "load" and p.needed_bytes[VK] == whole_vk
    # Unified, the device's 1.25 GiB are host bytes too: 1.25 GiB + 64 MiB of host fit 1.5 GiB ...
    unified = Budget.declared({HOST: "1536MiB", VK: {"total": "2GiB", "unified": True}})
    p = plan(m.request(), [], unified, footprint_fn(m), Policy(), NOW)
    assert p.action == "load" and p.needed_bytes[HOST] == whole_vk + 64 * MiB
    # ... but not beside a resident of 512 MiB on the host: counted once, the two budgets cannot both spend it.
    r = Resident("other", LoadConfig(), {HOST: 512 * MiB}, last_used=1.0, pinned=True)
    p_sep = plan(m.request(), [r], separate, footprint_fn(m), Policy(), NOW)
    p_uni = plan(m.request(), [r], unified, footprint_fn(m), Policy(), NOW)
    assert p_sep.action == "load"  # separate memories: 512 MiB + 64 MiB host, 1.25 GiB device
    assert p_uni.action != "load", p_uni.reason
    if p_uni.action in LOADING_ACTIONS:
        assert p_uni.needed_bytes[HOST] <= 1024 * MiB


def test_a_resident_on_a_unified_device_is_counted_on_the_host_too() -> None:
    m = TableModel("m", dense=(128 * MiB,) * 2, output=0, embd=0)
    # the resident holds 1 GiB on Vulkan0 and 100 MiB of its own on the host: 1.1 GiB of RAM in all
    r = Resident("vk-seat", LoadConfig(devices=(VK,), n_gpu_layers=99), {HOST: 100 * MiB, VK: 1 * GiB},
                 last_used=1.0)
    budget = Budget.declared({HOST: "1200MiB", VK: {"total": "2GiB", "unified": True}})
    p = plan(m.request(mode="ram-only"), [r], budget, footprint_fn(m), Policy(), NOW)
    # 256 MiB in RAM does not fit beside 1.1 GiB in 1200 MiB: the unified resident is evicted for it
    assert p.action == "ram" and p.evict_keys == ("vk-seat",)
    assert p.evict[0].bytes[HOST] == 100 * MiB + 1 * GiB


@SETTINGS
@given(models(), st.data())
def test_loads_never_spend_the_same_bytes_twice(m: TableModel, data: st.DataObject) -> None:
    residents = []
    for i in range(data.draw(st.integers(0, 5))):
        b = {HOST: data.draw(st.integers(0, 8)) * U, VK: data.draw(st.integers(0, 8)) * U}
        residents.append(Resident(f"r{i}", LoadConfig(devices=(VK,)), b, last_used=float(i),
                                  pinned=data.draw(st.integers(0, 4)) == 0))
    host_total = sum(charged(r.bytes, (VK,))[HOST] for r in residents) + data.draw(st.integers(1, 40)) * U
    vk_total = sum(r.bytes[VK] for r in residents) + data.draw(st.integers(1, 40)) * U
    budget = Budget.declared({HOST: host_total, VK: {"total": vk_total, "unified": True}})
    mode = data.draw(st.sampled_from(("max-gpu", "max-ram", "gpu-only")))
    p = plan(m.request(mode=mode), residents, budget, footprint_fn(m), Policy(), NOW)
    if p.action not in LOADING_ACTIONS:
        return
    assert p.config is not None
    fp = m.footprint(p.config)
    need = {HOST: fp.bytes_on(HOST), **{g: fp.bytes_on(g) for g in fp.gpu_names}}
    kept = [r for r in residents if r.key not in set(p.evict_keys)]
    host_used = sum(r.bytes[HOST] + r.bytes[VK] for r in kept) + need[HOST] + need.get(VK, 0)
    vk_used = sum(r.bytes[VK] for r in kept) + need.get(VK, 0)
    assert host_used <= budget.budget_bytes(HOST), "the unified device's bytes were not counted in RAM"
    assert vk_used <= budget.budget_bytes(VK)


def test_eviction_happens_only_on_the_device_that_is_short() -> None:
    m = TableModel("m", dense=(64 * MiB,) * 3, output=64 * MiB, embd=0)  # 256 MiB whole on one device
    on_rpc = Resident("on-rpc", LoadConfig(devices=("RPC0",), n_gpu_layers=99), {HOST: 10 * MiB, "RPC0": 200 * MiB},
                      last_used=1.0)
    on_vk = Resident("on-vk", LoadConfig(devices=("Vulkan0",), n_gpu_layers=99),
                     {HOST: 10 * MiB, "Vulkan0": 300 * MiB}, last_used=0.0)  # least recently used, but not short
    budget = dataclasses.replace(
        Budget.declared({HOST: "4GiB", "RPC0": "400MiB", "Vulkan0": {"total": "1GiB", "unified": True}}),
        rpc=("127.0.0.1:50052",))
    req = m.request(mode="explicit", config=LoadConfig(devices=("RPC0",), n_gpu_layers=99))
    p = plan(req, [on_rpc, on_vk], budget, footprint_fn(m), Policy(eviction="lru"), NOW)
    assert p.action == "load" and p.evict_keys == ("on-rpc",), p.reason
    assert p.config is not None and p.config.rpc == ("127.0.0.1:50052",)  # a placement on RPC0 carries --rpc
    ram = plan(m.request(mode="ram-only"), [], budget, footprint_fn(m), Policy(), NOW)
    assert ram.config is not None and ram.config.rpc == ()  # and one on the host alone does not
