"""Release verification: the pure check, and the GPU side read through a fake NVML at the driver edge."""

from __future__ import annotations

import pytest

from fitevict.pricing.footprint import HOST
from fitevict.supervisor import RELEASE_SLACK, release_check
from fitevict.units import MiB
from host.fake_nvml import FakeGpu, FakeNvml

HELD = 100 * MiB


@pytest.mark.parametrize(
    "held,before,now,timed_out,verified,final",
    [
        # held 100 MiB; the bar is 0.9*100 - 4 = 86 MiB of free memory coming back
        ({HOST: HELD}, {HOST: 1000 * MiB}, {HOST: 1086 * MiB}, False, True, True),
        ({HOST: HELD}, {HOST: 1000 * MiB}, {HOST: 1085 * MiB}, False, False, False),  # 85 < 86: keep polling
        ({HOST: HELD}, {HOST: 1000 * MiB}, {HOST: 1085 * MiB}, True, False, True),  # ... until the timeout
        # a GPU seat: both the host and CUDA0 must come back
        ({HOST: HELD, "CUDA0": 2000 * MiB}, {HOST: 0, "CUDA0": 1000 * MiB}, {HOST: 90 * MiB, "CUDA0": 2796 * MiB},
         False, True, True),  # CUDA0 bar: 0.9*2000 - 4 = 1796 MiB; freed 1796
        ({HOST: HELD, "CUDA0": 2000 * MiB}, {HOST: 0, "CUDA0": 1000 * MiB}, {HOST: 90 * MiB, "CUDA0": 2000 * MiB},
         False, False, False),  # CUDA0 freed only 1000 MiB
        # a figure that was never measured cannot be verified, and polling will not change that
        ({HOST: None}, {HOST: 0}, {HOST: 500 * MiB}, False, False, True),
        ({HOST: HELD, "CUDA0": None}, {HOST: 0, "CUDA0": 0}, {HOST: HELD, "CUDA0": HELD}, False, False, True),
        # a tiny seat: the slack makes the bar 0 (0.9*2 MiB - 4 MiB < 0)
        ({HOST: 2 * MiB}, {HOST: 1000 * MiB}, {HOST: 1000 * MiB}, False, True, True),
    ],
)
def test_release_check(held, before, now, timed_out, verified, final) -> None:
    r = release_check(held, before, now, elapsed=0.5, timed_out=timed_out)
    assert (r.verified, r.final) == (verified, final), r.note
    assert r.freed_bytes == now[HOST] - before[HOST]  # host freed is the measured MemAvailable delta
    assert r.freed_by_device == {d: now[d] - before[d] for d in before}
    if not verified and final and None in held.values():
        assert "never measured" in r.note
    assert (r.release_seconds is not None) == verified


def test_slack_is_what_the_docstring_says() -> None:
    assert RELEASE_SLACK == 4 * MiB


def test_gpu_free_is_read_through_nvml(tmp_path) -> None:
    """The supervisor's free-memory probe reads NVML for the seat's GPUs and meminfo for the host."""
    from fitevict.config import load_config
    from fitevict.catalog import Catalog
    from fitevict.store import Store
    from fitevict.supervisor import Supervisor

    nvml = FakeNvml([FakeGpu(total=24 * 1024**3, used=4 * 1024**3)])
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path)})
    store = Store.open(cfg.store_url)
    try:
        sup = Supervisor(config=cfg, catalog=Catalog([]), store=store, engine_binary=_fake_binary(tmp_path),
                         nvml=nvml)
        free = sup._free_now(("CUDA0",))
        assert free["CUDA0"] == 20 * 1024**3 and free[HOST] > 0
        nvml.gpus[0].used = 1 * 1024**3  # the seat's 3 GiB came back
        r = release_check({HOST: 0, "CUDA0": 3 * 1024**3}, free, sup._free_now(("CUDA0",)), elapsed=0.1,
                          timed_out=False)
        assert r.verified and r.freed_by_device["CUDA0"] == 3 * 1024**3
        # the GPU budget counts the seat's bytes as fitevict's own, not someone else's
        b = sup._measure_budget()
        assert b.device("CUDA0") is not None and b.device("CUDA0").total.source.startswith("nvml")
    finally:
        store.close()


def _fake_binary(tmp_path):
    p = tmp_path / "llama-server"
    p.write_text("#!/bin/sh\necho 'usage: llama-server --fit --cache-ram --no-webui --log-verbosity'\n")
    p.chmod(0o755)
    return p


def test_engine_overhead_is_added_to_host_only() -> None:
    from fitevict.pricing.footprint import DeviceFootprint, Footprint, Term
    from fitevict.supervisor import with_engine_overhead

    fp = Footprint((DeviceFootprint(HOST, Term(100, "formula"), Term(20, "formula")),), host_mapped_bytes=100,
                   host_committed_bytes=20)
    got = with_engine_overhead(fp, 7 * MiB)
    assert got.bytes_on(HOST) == 120 + 7 * MiB and got.host_committed_bytes == 20 + 7 * MiB
    assert got.device(HOST) == fp.device(HOST)  # the engine's buffers, term by term, are untouched
    assert got.host_source == "formula+measured" and "overhead" in got.notes[-1]
    assert with_engine_overhead(fp, 0) is fp


def test_a_fall_in_free_memory_is_not_reported_as_freed() -> None:
    # others took 3 MiB more than the seat gave back: the seat's share is unknown, not negative and not 0
    r = release_check({HOST: 50 * MiB}, {HOST: 1000 * MiB}, {HOST: 997 * MiB}, elapsed=1.0, timed_out=True)
    assert r.freed_bytes is None and not r.verified and r.final
    assert r.freed_by_device[HOST] == -3 * MiB
