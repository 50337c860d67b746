"""Known answers, with the arithmetic that derives each one in the comments.

Models come from explicit byte tables (tables.py); budgets are declared, never probed.
"""

from __future__ import annotations

import pytest

from fitevict.budget import Budget
from fitevict.planner import (
    Plan,
    PlanInvariantError,
    PlanRequest,
    Policy,
    Resident,
    plan,
)
from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.pricing.loadconfig import LoadConfig

from .tables import TableModel, footprint_fn

GiB = 1024**3
MiB = 1024**2
NOW = 1000.0
POLICY = Policy(exclusive_fraction=1.0, eviction="lru")  # exclusivity off unless a test is about it; LRU order


def gpu_model(key: str, gib: int) -> TableModel:
    """``gib`` GiB on the GPU when fully offloaded: gib-1 blocks of 1 GiB + a 1 GiB output layer; 0 on the host."""
    return TableModel(key, dense=(GiB,) * (gib - 1), output=GiB)


def res(key: str, cuda0: int = 0, cpu: int = 0, t: float = 0.0, **kw) -> Resident:
    b = {"CUDA0": cuda0 * GiB, HOST: cpu * GiB}
    return Resident(key, LoadConfig(devices=("CUDA0",), n_gpu_layers=-1), b, last_used=t, **kw)


def run(m: TableModel, req: PlanRequest, residents: list[Resident], budget: Budget, policy: Policy = POLICY) -> Plan:
    return plan(req, residents, budget, footprint_fn(m), policy, NOW)


B10 = Budget.declared({HOST: "64GiB", "CUDA0": "10GiB"})


def test_fits_without_evicting() -> None:
    m = gpu_model("m", 3)
    p = run(m, m.request(mode="gpu-only"), [res("a", 5)], B10)
    # free 10 - 5 = 5 >= 3
    assert p.action == "load" and p.evict == ()
    assert p.config == LoadConfig(n_ctx=1024, devices=("CUDA0",), n_gpu_layers=3)
    assert p.needed_bytes["CUDA0"] == 3 * GiB
    assert p.free_bytes_before["CUDA0"] == 5 * GiB and p.free_bytes_after["CUDA0"] == 2 * GiB
    assert p.budget_bytes["CUDA0"] == 10 * GiB


def test_lru_ties_broken_by_largest_bytes() -> None:
    m = gpu_model("m", 3)
    residents = [res("a", 2, t=10), res("b", 4, t=10), res("c", 3, t=20)]
    p = run(m, m.request(mode="gpu-only"), residents, B10)
    # free 10 - (2+4+3) = 1, need 3 -> short 2. a and b are equally old; b (4 GiB) is larger and goes
    # first, and covers the 2 alone, so a stays.
    assert p.action == "load" and p.evict_keys == ("b",)
    assert "least recently used (idle 990 s)" in p.evict[0].reason
    assert p.free_bytes_after["CUDA0"] == 1 * GiB + 4 * GiB - 3 * GiB


def test_only_as_many_as_needed_and_minimal() -> None:
    m = gpu_model("m", 6)
    residents = [res("a", 1, t=1), res("b", 5, t=2), res("c", 1, t=3)]
    p = run(m, m.request(mode="gpu-only"), residents, Budget.declared({HOST: "64GiB", "CUDA0": "8GiB"}))
    # free 8 - 7 = 1, need 6 -> short 5. LRU takes a (1, still short 4) then b (5, covered). a's
    # removal turned out unnecessary (b alone frees 5), so it is dropped again: evict only b.
    assert p.evict_keys == ("b",)


def test_pinned_protected_and_busy_are_never_evicted() -> None:
    m = gpu_model("m", 4)
    residents = [
        res("pinned", 2, t=1, pinned=True),
        res("protected", 2, t=2, protected=True),
        res("busy", 2, t=3, in_flight=1),
        res("x", 2, t=4),
        res("y", 2, t=5),
    ]
    p = run(m, m.request(mode="gpu-only"), residents, B10)
    # free 0, need 4; the three oldest cannot go, so x then y (2 + 2 = 4)
    assert p.action == "load" and p.evict_keys == ("x", "y")


def test_exclusive_model_evicts_everything_evictable() -> None:
    m = gpu_model("m", 6)
    residents = [res("a", 1, t=1), res("b", 1, t=2), res("pin", 1, t=3, pinned=True)]
    p = run(m, m.request(mode="gpu-only"), residents, B10, Policy(exclusive_fraction=0.5, eviction="lru"))
    # free 10 - 3 = 7 >= 6 would fit, but 6 > 0.5 * 10: exclusive -> a and b go, the pinned one stays
    assert p.exclusive and p.evict_keys == ("a", "b")
    assert all(e.reason.startswith("exclusive on CUDA0: m needs 6.00 GiB of 10.0 GiB there") for e in p.evict)
    small = gpu_model("s", 5)
    q = run(small, small.request(mode="gpu-only"), residents, B10, Policy(exclusive_fraction=0.5, eviction="lru"))
    # 5 is not > 0.5 * 10: not exclusive, and it fits in the 7 free
    assert not q.exclusive and q.evict == ()


def test_exclusive_on_one_device_leaves_the_others_alone() -> None:
    # m takes 6 of the 10 GiB GPU (exclusive there) and 1 GiB of the 64 GiB host: the GPU residents go, a
    # host-only resident (nothing on CUDA0) stays, because the host has room
    m = gpu_model("m", 6)
    ram_only = Resident("ram", LoadConfig(), {HOST: 8 * GiB, "CUDA0": 0}, last_used=0.5)
    residents = [res("a", 1, t=1), ram_only]
    p = run(m, m.request(mode="gpu-only"), residents, B10, Policy(exclusive_fraction=0.5, eviction="lru"))
    assert p.exclusive and p.evict_keys == ("a",)


B2 = Budget.declared({HOST: "64GiB", "CUDA0": "10GiB", "CUDA1": "10GiB"})


def on(key: str, t: float, **gib: int) -> Resident:
    devices = tuple(d for d in ("CUDA0", "CUDA1") if gib.get(d))
    return Resident(key, LoadConfig(devices=devices, n_gpu_layers=-1), {d: n * GiB for d, n in gib.items()},
                    last_used=t)


@pytest.mark.parametrize("eviction", ["lru", "cost"])
def test_exclusive_on_one_gpu_never_empties_the_other(eviction: str) -> None:
    # m is placed on CUDA0 alone and takes 6 of its 10 GiB (> 0.5): exclusive there. Everything evictable that holds
    # bytes on CUDA0 goes (a, and the split seat c); b, on CUDA1 only, stays: CUDA1 is not short and m is not
    # exclusive there. Free on CUDA0 before: 10 - 1 - 1 = 8, so m would fit without the rule.
    m = gpu_model("m", 6)
    req = m.request(mode="explicit", config=LoadConfig(devices=("CUDA0",), n_gpu_layers=-1))
    residents = [on("a", 1, CUDA0=1), on("b", 2, CUDA1=2), on("c", 3, CUDA0=1, CUDA1=1)]
    p = run(m, req, residents, B2, Policy(exclusive_fraction=0.5, eviction=eviction))  # type: ignore[arg-type]
    assert p.action == "load" and p.exclusive
    assert p.evict_keys == ("a", "c")
    assert p.free_bytes_after["CUDA1"] == 10 * GiB - 2 * GiB - GiB + GiB  # only c's CUDA1 GiB came back
    q = run(m, req, residents, B2, Policy(exclusive_fraction=1.0, eviction=eviction))  # type: ignore[arg-type]
    assert not q.exclusive and q.evict == ()  # the rule off (the default): m fits in CUDA0's 8 free GiB


def test_both_budgets_binding() -> None:
    # gpu-only model: 4 GiB on CUDA0 plus 4 GiB of token embeddings on the host (mapped)
    m = TableModel("m", dense=(GiB,) * 3, output=GiB, embd=4 * GiB)
    budget = Budget.declared({HOST: "8GiB", "CUDA0": "8GiB"})
    residents = [res("g", cuda0=6, cpu=1, t=2), res("r", cuda0=0, cpu=5, t=1)]
    p = run(m, m.request(mode="gpu-only"), residents, budget)
    # free: CUDA0 8 - 6 = 2 (short 4 - 2 = 2), CPU 8 - 6 = 2 (short 4 - 2 = 2).
    # LRU: r (CPU 5) covers the host, g (CUDA0 6, CPU 1) the GPU; without r the host would be short
    # 2 - 1 = 1, without g the GPU short 2: both go.
    assert p.evict_keys == ("r", "g")
    assert p.free_bytes_after == {HOST: 2 * GiB + 6 * GiB - 4 * GiB, "CUDA0": 2 * GiB + 6 * GiB - 4 * GiB}
    assert p.host_mapped_bytes == 4 * GiB and p.host_committed_bytes == 0


def test_host_pressure_evicts_a_ram_resident_for_a_ram_load() -> None:
    m = TableModel("m", dense=(GiB,) * 3, output=GiB)  # 4 GiB, all on the host when CPU only
    budget = Budget.declared({HOST: "8GiB", "CUDA0": "8GiB"})
    residents = [res("g", cuda0=4, cpu=1, t=1), res("r", cpu=5, t=2)]
    p = run(m, m.request(mode="ram-only"), residents, budget)
    # CPU free 8 - 6 = 2, need 4 -> short 2. LRU takes g (1, short 1) then r (5); g alone cannot
    # cover 2, r alone can: evict only r.
    assert p.action == "ram" and p.config.devices == () and p.evict_keys == ("r",)  # type: ignore[union-attr]


def test_mapped_weights_count_against_ram() -> None:
    # CPU only: 3 GiB of weights mapped from the file + 1 GiB committed compute buffer = 4 GiB
    m = TableModel("m", dense=(GiB,) * 2, output=GiB, cpu_compute=GiB)
    budget = Budget.declared({HOST: "3.5GiB"})
    p = run(m, m.request(mode="ram-only"), [], budget)
    # committed alone (1 GiB) would fit 3.5 GiB; mapped + committed (4 GiB) does not
    assert p.action == "refuse"
    assert p.host_mapped_bytes == 3 * GiB and p.host_committed_bytes == GiB
    assert p.needed_bytes[HOST] == 4 * GiB
    no_mmap = run(m, m.request(mode="ram-only", config=LoadConfig(mmap=False)), [], budget)
    assert no_mmap.action == "refuse" and no_mmap.host_mapped_bytes == 0 and no_mmap.host_committed_bytes == 4 * GiB


def test_moe_spills_experts_first() -> None:
    # 4 blocks of 1 GiB dense + 2 GiB experts, 1 GiB output, 1 GiB token embeddings.
    # All on the GPU: 4 * (1 + 2) + 1 = 13 GiB. With --n-cpu-moe k: 13 - 2k <= 8 -> k = 3 (7 GiB);
    # the host then holds embd 1 + experts 2 * 3 = 7 GiB.
    m = TableModel("moe", dense=(GiB,) * 4, experts=(2 * GiB,) * 4, output=GiB, embd=GiB)
    budget = Budget.declared({HOST: "32GiB", "CUDA0": "8GiB"})
    p = run(m, m.request(), [], budget)
    assert p.action == "partial"
    assert (p.config.n_gpu_layers, p.config.n_cpu_moe) == (5, 3)  # type: ignore[union-attr]
    assert p.needed_bytes == {HOST: 7 * GiB, "CUDA0": 7 * GiB}
    assert "all layers on the GPU would need 13.0 GiB on CUDA0" in p.reason


def test_dense_spills_layers() -> None:
    # 8 blocks + output, 1 GiB each; -ngl k puts the output and k-1 blocks on the GPU: k GiB <= 5.5 -> k = 5
    m = TableModel("d", dense=(GiB,) * 8, output=GiB)
    p = run(m, m.request(), [], Budget.declared({HOST: "32GiB", "CUDA0": "5.5GiB"}))
    assert p.action == "partial" and p.config.n_gpu_layers == 5 and p.config.n_cpu_moe == 0  # type: ignore[union-attr]
    assert p.needed_bytes == {HOST: 4 * GiB, "CUDA0": 5 * GiB}


def test_max_gpu_evicts_to_get_more_layers() -> None:
    m = TableModel("d", dense=(GiB,) * 8, output=GiB)  # 9 GiB all on the GPU
    p = run(m, m.request(), [res("a", 6, t=1)], B10)
    # without evicting only 4 layers fit; evicting a frees 6 -> all 9 layers fit in 10
    assert p.action == "load" and p.evict_keys == ("a",)
    with_pin = run(m, m.request(), [res("a", 6, t=1, pinned=True)], B10)
    assert with_pin.action == "partial" and with_pin.config.n_gpu_layers == 4 and with_pin.evict == ()  # type: ignore[union-attr]


def test_max_ram_prefers_the_host() -> None:
    # 8 blocks + output of 1 GiB each and 1 GiB embeddings: CPU only needs 10 GiB > 6.
    # With -ngl k the host holds 1 + (9 - k) <= 6 -> k >= 4: max-ram takes the fewest, 4.
    m = TableModel("d", dense=(GiB,) * 8, output=GiB, embd=GiB)
    budget = Budget.declared({HOST: "6GiB", "CUDA0": "16GiB"})
    p = run(m, m.request(mode="max-ram"), [], budget)
    assert p.action == "partial" and p.config.n_gpu_layers == 4  # type: ignore[union-attr]
    roomy = run(m, m.request(mode="max-ram"), [], Budget.declared({HOST: "16GiB", "CUDA0": "16GiB"}))
    assert roomy.action == "ram" and roomy.config.devices == ()  # type: ignore[union-attr]


def test_explicit_placement_is_kept() -> None:
    m = TableModel("d", dense=(GiB,) * 8, output=GiB)
    req = m.request(mode="explicit", config=LoadConfig(n_gpu_layers=3))
    p = run(m, req, [], B10)
    # explicit -ngl 3 with no -dev: every GPU of the budget; output + 2 blocks = 3 GiB there
    assert p.action == "partial" and p.config.n_gpu_layers == 3 and p.config.devices == ("CUDA0",)  # type: ignore[union-attr]
    assert p.needed_bytes["CUDA0"] == 3 * GiB


def test_no_gpu_degrades_to_ram_and_gpu_only_refuses() -> None:
    m = gpu_model("m", 3)
    host_only = Budget.declared({HOST: "16GiB"})
    p = run(m, m.request(), [], host_only)
    assert p.action == "ram" and p.config.devices == () and p.needed_bytes == {HOST: 3 * GiB}  # type: ignore[union-attr]
    q = run(m, m.request(mode="gpu-only"), [], host_only)
    assert q.action == "refuse" and "no GPU" in q.reason and "max-gpu" in q.remedy


def test_refusal_names_need_availability_largest_ctx_and_remedy() -> None:
    # 2 blocks of 1 GiB + 512 MiB output; KV 64 KiB per token per block = 128 KiB per token.
    # At ctx 16384: 2.5 GiB + 2 GiB KV = 4.5 GiB > 4. KV room 1.5 GiB / 128 KiB = 12288 tokens.
    m = TableModel("qwen", dense=(GiB, GiB), output=512 * MiB, kv_per_token=64 * 1024, n_ctx_train=32768)
    budget = Budget.declared({HOST: "64GiB", "CUDA0": "4GiB"})
    p = run(m, m.request(n_ctx=16384, mode="gpu-only"), [], budget)
    assert p.action == "refuse" and p.largest_ctx == 12288 and not p.fits
    assert p.reason == (
        "qwen needs 4.50 GiB on CUDA0 at ctx 16384; 4.00 GiB on CUDA0 free with nothing evictable; "
        "the largest ctx that fits is 12288 (training ctx 32768)"
    )
    # with 64 GiB of host RAM, a max-gpu load (some layers on the CPU) would fit at ctx 16384
    assert p.remedy == "lower ctx to 12288 or allow CPU offload (alloc mode max-gpu)"
    assert p.evict == () and p.free_bytes_after == p.free_bytes_before
    # a pinned 1 GiB resident and an evictable 1 GiB one: available 4 - 1 = 3 GiB after evicting a;
    # KV room 0.5 GiB / 128 KiB = 4096 tokens
    residents = [res("a", 1, t=5), res("b", 1, t=1, pinned=True)]
    q = run(m, m.request(n_ctx=16384, mode="gpu-only"), residents, budget)
    assert q.reason == (
        "qwen needs 4.50 GiB on CUDA0 at ctx 16384; 3.00 GiB on CUDA0 free after evicting [a]; "
        "the largest ctx that fits is 4096 (training ctx 32768)"
    )
    assert q.remedy == "lower ctx to 4096 or unpin b or allow CPU offload (alloc mode max-gpu)"
    assert q.available_bytes["CUDA0"] == 3 * GiB and q.evict == ()


def test_largest_ctx_is_capped_at_the_training_ctx() -> None:
    """A 4k model asked for 16384 tokens: 12288 would fit the memory, but the suggestion is the training ctx."""
    m = TableModel("qwen", dense=(GiB, GiB), output=512 * MiB, kv_per_token=64 * 1024, n_ctx_train=4096)
    p = run(m, m.request(n_ctx=16384, mode="gpu-only"), [], Budget.declared({HOST: "64GiB", "CUDA0": "4GiB"}))
    assert p.action == "refuse" and p.largest_ctx == 4096
    assert p.reason.endswith("the largest ctx that fits is 12288, above the training ctx 4096: suggesting 4096")
    assert p.remedy.startswith("lower ctx to 4096")


def test_refusal_without_a_fitting_ctx() -> None:
    m = gpu_model("m", 6)
    p = run(m, m.request(n_ctx=4096, mode="gpu-only"), [res("p", 6, protected=True)], B10)
    # weights alone (6) exceed the 4 left beside the protected resident: no ctx helps
    assert p.action == "refuse" and p.largest_ctx is None
    assert "no ctx from 512 up fits" in p.reason and "unprotect p" in p.remedy


def test_ctx_zero_means_training_ctx() -> None:
    m = TableModel("m", dense=(GiB,), output=0, kv_per_token=1024 * 1024, n_ctx_train=8192)
    # ctx 0 -> 8192 tokens * 1 MiB = 8 GiB KV + 1 GiB > 4; KV room 3 GiB -> 3072 tokens
    p = run(m, m.request(n_ctx=0, mode="gpu-only"), [], Budget.declared({HOST: "8GiB", "CUDA0": "4GiB"}))
    assert p.action == "refuse" and "training ctx 8192" in p.reason and p.largest_ctx == 3072


def test_wait_on_in_flight() -> None:
    m = gpu_model("m", 4)
    residents = [res("b", 1, t=0), res("a", 5, t=9, in_flight=2)]
    p = run(m, m.request(mode="gpu-only"), residents, Budget.declared({HOST: "64GiB", "CUDA0": "8GiB"}))
    # free 2, evictable b adds 1 -> 3 < 4; a (5) would make it fit once its 2 requests finish.
    # The minimal set over {b, a} is {a}: wait for a only.
    assert p.action == "wait" and p.wait_for == ("a",) and p.evict == ()
    assert "fits once a finishes" in p.reason


def test_hit_never_evicts_even_over_budget() -> None:
    m = gpu_model("m", 3)
    cfg = LoadConfig(n_ctx=1024, devices=("CUDA0",), n_gpu_layers=3)
    residents = [Resident("m", cfg, {"CUDA0": 3 * GiB}, last_used=1), res("x", 9, t=0)]
    # 12 GiB held on a 10 GiB budget: still a hit, nothing evicted
    p = run(m, m.request(), residents, B10)
    assert p.action == "hit" and p.evict == () and p.config == cfg and p.fits
    assert p.free_bytes_before["CUDA0"] == -2 * GiB and p.free_bytes_after == p.free_bytes_before


def test_other_configuration_is_replaced_and_loading_is_waited_for() -> None:
    m = gpu_model("m", 3)
    old = Resident("m", LoadConfig(n_ctx=4096, devices=("CUDA0",), n_gpu_layers=3), {"CUDA0": 3 * GiB})
    p = run(m, m.request(n_ctx=1024), [old, res("x", 6, t=0)], B10)
    # free 10 - 9 = 1; replacing m frees its 3 GiB -> 4 >= 3: x stays
    assert p.action == "load" and p.evict_keys == ("m",) and p.evict[0].reason.startswith("replace")
    loading = Resident("m", LoadConfig(n_ctx=1024), {"CUDA0": 3 * GiB}, loading=True)
    q = run(m, m.request(n_ctx=1024), [loading], B10)
    assert q.action == "wait" and q.wait_for == ("m",)


def test_unpriced_footprint_is_a_refusal_not_a_zero() -> None:
    def fn(key: str, c: LoadConfig) -> Footprint:
        cuda = DeviceFootprint("CUDA0", Term(GiB, "formula"), compute=Term.unavailable("no dry run yet"))
        return Footprint((cuda,), 0, 0)

    p = plan(PlanRequest("m", n_layer=2), [], B10, fn, POLICY, NOW)
    assert p.action == "refuse" and "no dry run yet" in p.reason


def test_broken_invariants_raise() -> None:
    with pytest.raises(PlanInvariantError, match="bytes on CUDA0"):
        Resident("a", LoadConfig(), {"CUDA0": -1})
    m = gpu_model("m", 2)
    with pytest.raises(PlanInvariantError, match="twice"):
        run(m, m.request(), [res("a", 1), res("a", 1)], B10)
    with pytest.raises(PlanInvariantError, match="n_moe_layers"):
        PlanRequest("m", n_layer=3, n_moe_layers=3)


def test_dry_run_is_the_same_call() -> None:
    m = gpu_model("m", 6)
    args = (m.request(mode="gpu-only"), [res("a", 5, t=1), res("b", 2, t=2)], B10, footprint_fn(m), POLICY, NOW)
    assert plan(*args) == plan(*args)


def test_a_binding_limit_is_named_in_the_remedy() -> None:
    m = gpu_model("m", 6)
    budget = Budget.declared({HOST: "64GiB", "CUDA0": {"total": "16GiB", "limit": "4GiB"}})
    p = run(m, m.request(n_ctx=1024, mode="gpu-only"), [], budget)
    # the limit (4) binds below total - reserve - others (16); the 6 GiB weights need more
    assert p.action == "refuse" and p.budget_bytes["CUDA0"] == 4 * GiB
    assert "raise gpu_limit (declared)" in p.remedy


def test_two_gpus_each_checked() -> None:
    # 8 blocks + output, 1 GiB each, split evenly over CUDA0 and CUDA1 in layer order.
    # -ngl 9: layers 0-4 on CUDA0 (5 GiB > 4.5), 5-8 on CUDA1. -ngl 8: layers 1-4 on CUDA0 (4 GiB),
    # 5-8 on CUDA1 (4 GiB), block 0 on the CPU: the first rung that fits both GPUs.
    m = TableModel("d", dense=(GiB,) * 8, output=GiB)
    budget = Budget.declared({HOST: "32GiB", "CUDA0": "4.5GiB", "CUDA1": "8GiB"})
    p = run(m, m.request(), [], budget)
    assert p.action == "partial" and p.config.n_gpu_layers == 8  # type: ignore[union-attr]
    assert p.config.devices == ("CUDA0", "CUDA1")  # type: ignore[union-attr]
    assert p.needed_bytes == {HOST: GiB, "CUDA0": 4 * GiB, "CUDA1": 4 * GiB}


@pytest.mark.parametrize("low,high,tie", [(1.0, 1.25, True), (1.0, 1.2501, False), (1.249, 1.251, True),
                                          (2.0, 2.5, True), (2.0, 2.5001, False)])
def test_greedy_dual_size_band_is_25_percent_from_its_lowest(low: float, high: float, tie: bool) -> None:
    # "low" was used more recently than "high": within one band recency decides (the older, "high", goes);
    # in two bands the lower priority goes whatever its recency
    m = gpu_model("m", 4)
    older = Resident("high", LoadConfig(devices=("CUDA0",), n_gpu_layers=-1), {"CUDA0": 4 * GiB, HOST: 0},
                     last_used=1.0, priority=high)
    newer = Resident("low", LoadConfig(devices=("CUDA0",), n_gpu_layers=-1), {"CUDA0": 4 * GiB, HOST: 0},
                     last_used=2.0, priority=low)
    filler = res("pin", 2, t=0.0, pinned=True)  # 4 + 4 + 2 of 10: one of the two must go for m's 4
    p = run(m, m.request(mode="gpu-only"), [older, newer, filler], B10, Policy(exclusive_fraction=1.0, eviction="cost"))
    assert p.evict_keys == (("high",) if tie else ("low",))
