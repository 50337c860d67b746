"""Release verification: the pure check, and the GPU side read through a fake NVML at the driver edge."""

from __future__ import annotations

import pytest

from fitevict.engines.process import GroupStop
from fitevict.pricing.footprint import HOST
from fitevict.seat.release import RELEASE_SLACK, release_check, stop_account
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
    assert r.freed_bytes == now[HOST] - before[HOST]  # host freed: the measured fall in AnonPages+Shmem
    assert r.freed_by_device == {d: now[d] - before[d] for d in before}
    if not verified and final and None in held.values():
        assert "never measured" in r.note
    assert (r.release_seconds is not None) == verified


@pytest.mark.parametrize("held", [5 * MiB, 40 * MiB + 123, 100 * MiB, 7 * 1024 * MiB + 1])
def test_slack_is_what_the_docstring_says(held: int) -> None:
    """A device counts as released when free memory rose by at least 90% of what the seat held, less 4 MiB:
    exactly at that bar it is verified, one byte under it is not."""
    bar = int(held * 0.9) - 4 * MiB
    assert RELEASE_SLACK == 4 * MiB
    at = release_check({HOST: held}, {HOST: 0}, {HOST: max(bar, 0)}, elapsed=0.1, timed_out=True)
    assert at.verified, at.note
    if bar > 0:
        under = release_check({HOST: held}, {HOST: 0}, {HOST: bar - 1}, elapsed=0.1, timed_out=True)
        assert not under.verified and "not released" in under.note


def test_gpu_free_is_read_through_nvml(tmp_path) -> None:
    """The supervisor's free-memory probe reads NVML for the seat's GPUs and meminfo for the host."""
    from fitevict.config import load_config
    from fitevict.request.catalog import Catalog
    from fitevict.store import Store
    from fitevict.supervisor import Supervisor
    from fitevict.seat.release import free_now

    nvml = FakeNvml([FakeGpu(total=24 * 1024**3, used=4 * 1024**3)])
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path)})
    store = Store.open(cfg.store_url)
    try:
        sup = Supervisor(config=cfg, catalog=Catalog([]), store=store, engine_binary=_fake_binary(tmp_path),
                         nvml=nvml)
        free = free_now(("CUDA0",), nvml)
        assert free["CUDA0"] == 20 * 1024**3 and free[HOST] > 0
        nvml.gpus[0].used = 1 * 1024**3  # the seat's 3 GiB came back
        now = free_now(("CUDA0",), nvml)
        now[HOST] = free[HOST] - 148 * 1024  # another program took 148 KiB of the host meanwhile
        r = release_check({HOST: 0, "CUDA0": 3 * 1024**3}, free, now, elapsed=0.1, timed_out=False)
        assert r.verified and r.freed_by_device["CUDA0"] == 3 * 1024**3, r.note
        assert "CPU: held nothing, not judged" in r.note  # a seat that held 0 B there is never judged there
        # the GPU budget counts the seat's bytes as fitevict's own, not someone else's
        b = sup._measure_budget()
        assert b.device("CUDA0") is not None and b.device("CUDA0").total.source.startswith("nvml")
    finally:
        store.close()


def test_what_other_programs_took_is_named_not_read_as_the_seats() -> None:
    # the seat gave back 100 MiB while another program took 60 MiB: the counter rose only 40 MiB
    r = release_check({HOST: HELD}, {HOST: 0}, {HOST: 40 * MiB}, elapsed=0.1, timed_out=True,
                      others={HOST: 60 * MiB})
    assert r.verified and r.freed_bytes == HELD and r.freed_by_device == {HOST: 40 * MiB}, r.note
    assert "other programs took 60.0 MiB meanwhile, not counted as the seat's" in r.note
    # others gave 60 MiB back while the seat kept most of its own: the counter's rise is not the seat's
    kept = release_check({HOST: HELD}, {HOST: 0}, {HOST: HELD}, elapsed=0.1, timed_out=True,
                         others={HOST: -60 * MiB})
    assert not kept.verified and kept.freed_bytes == 40 * MiB and "gave back 60.0 MiB" in kept.note
    # without a reading of the others, a counter that fell leaves the seat's share unknown
    unread = release_check({HOST: HELD}, {HOST: 0}, {HOST: -MiB}, elapsed=0.1, timed_out=True)
    assert not unread.verified and unread.freed_bytes is None


def test_other_programs_on_a_gpu_are_read_through_nvml_apart_from_the_seats() -> None:
    from fitevict.seat.release import others_now

    gpu = FakeGpu(used=7 * 1024**3, processes=[(101, 3 * 1024**3), (202, 4 * 1024**3)])
    seat = frozenset({101})  # the seat's own process is not another program
    assert others_now(("CUDA0",), seat, FakeNvml([gpu]))["CUDA0"] == 4 * 1024**3
    gpu.processes.append((303, None))  # one NVML cannot attribute: the drift there is not read, never taken as 0
    assert "CUDA0" not in others_now(("CUDA0",), seat, FakeNvml([gpu]))


_SEAT = """
import os, signal, sys
held = bytearray(b"\x01") * (64 * 1024 * 1024)  # 64 MiB, touched: committed anonymous memory
def bye(*_):
    with open(sys.argv[1], "w") as go:
        go.write("go")
    with open(sys.argv[2]) as done:  # the hog has taken its memory: only now give ours back
        done.read()
    os._exit(0)
signal.signal(signal.SIGTERM, bye)
print("ready", flush=True)
signal.pause()
"""
_HOG = """
import sys, time
with open(sys.argv[1]) as go:
    go.read()
taken = bytearray(b"\x01") * (160 * 1024 * 1024)  # 160 MiB while the seat stops
with open(sys.argv[2], "w") as done:
    done.write("done")
sys.stdin.read()  # held until the test closes our stdin
"""


def test_a_real_release_while_another_program_grows_is_verified_with_the_drift_named(tmp_path) -> None:
    """A real seat holding 64 MiB stops while another real process takes 160 MiB: the machine's counter falls, yet
    the seat's release is verified, with what the other program took read and named."""
    import asyncio
    import os
    import subprocess
    import sys
    import time

    from fitevict.engines.process import Child
    from fitevict.seat.release import stop_and_verify

    go, done = tmp_path / "go", tmp_path / "done"
    os.mkfifo(go)
    os.mkfifo(done)
    hog = subprocess.Popen([sys.executable, "-c", _HOG, str(go), str(done)], stdin=subprocess.PIPE)
    seat = subprocess.Popen([sys.executable, "-c", _SEAT, str(go), str(done)], stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert seat.stdout is not None and seat.stdout.readline() == b"ready\n"
        res = asyncio.run(stop_and_verify("seat", seat.pid, (), proc=Child(seat), grace=30.0, release_timeout=10.0,
                                          nvml=None, clock=time.monotonic))
    finally:
        hog.communicate(timeout=30)
        seat.wait(timeout=30)
    assert res.verified, res.note
    # the counter's rise alone is under the bar (the hog took more than the seat gave back): what verified it is
    # the seat's own return, the rise plus what the other programs took, read beside it
    held = res.held[HOST]
    assert held is not None and res.freed_by_device[HOST] < int(held * 0.9) - RELEASE_SLACK, res.details()
    assert res.others_by_device is not None and res.others_by_device[HOST] > 0, res.others_by_device
    assert res.freed_bytes == res.freed_by_device[HOST] + res.others_by_device[HOST]
    assert "other programs took" in res.note and res.details()["others_source"].startswith("measured")


def _fake_binary(tmp_path):
    p = tmp_path / "llama-server"
    p.write_text("#!/bin/sh\necho 'usage: llama-server --fit --cache-ram --no-webui --log-verbosity'\n")
    p.chmod(0o755)
    return p


def test_engine_overhead_joins_host_committed_and_each_gpu_with_buffers() -> None:
    from fitevict.pricing.footprint import DeviceFootprint, Footprint, Term
    from fitevict.prices.overhead import with_engine_overhead
    from fitevict.pricing.footprint import footprint_from_json

    fp = Footprint((DeviceFootprint(HOST, Term(100, "formula"), Term(20, "formula")),
                    DeviceFootprint("CUDA0", Term(1000, "formula"), Term(50, "formula"))),
                   host_mapped_bytes=100, host_committed_bytes=20)
    got = with_engine_overhead(fp, {HOST: 7 * MiB, "CUDA0": 300 * MiB, "CUDA1": 300 * MiB})
    assert got.bytes_on(HOST) == 120 + 7 * MiB and got.host_committed_bytes == 20 + 7 * MiB
    assert got.bytes_on("CUDA0") == 1050 + 300 * MiB  # the CUDA context on top of the engine's buffers
    assert got.bytes_on("CUDA1") == 0  # no buffers there: no process there either
    assert got.device(HOST) == fp.device(HOST) and got.device("CUDA0") == fp.device("CUDA0")  # rows untouched
    assert got.host_source == "formula+measured" and any("CUDA0" in n for n in got.notes)
    assert footprint_from_json(got.to_json()).bytes_on("CUDA0") == got.bytes_on("CUDA0")
    assert with_engine_overhead(fp, {}) is fp


def test_overhead_is_learned_per_device_as_a_lower_bound(tmp_path) -> None:
    """PSS / NVML minus the logged buffers, per device; only a larger reading replaces a stored one."""
    import asyncio
    from pathlib import Path

    from fitevict.config import load_config
    from fitevict.host.procmem import ProcessMemory
    from fitevict.pricing.footprint import DeviceFootprint, Footprint, Term
    from fitevict.pricing.loadconfig import LoadConfig
    from fitevict.request.catalog import Catalog
    from fitevict.store import Store
    from fitevict.supervisor import SeatState, Supervisor
    from fitevict.schedule.seats import Seat
    from fitevict.seat.measure import overhead_seen
    from fitevict.prices.learned import learn_engine_overhead
    from fitevict.prices.overhead import grown_overhead

    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path)})
    store = Store.open(cfg.store_url)
    logged = Footprint((DeviceFootprint(HOST, Term(100 * MiB, "measured"), Term(20 * MiB, "measured")),
                        DeviceFootprint("CUDA0", Term(900 * MiB, "measured"), Term(100 * MiB, "measured"))),
                       host_mapped_bytes=100 * MiB, host_committed_bytes=20 * MiB, host_source="measured")

    def seat(pss: int, nvml: int) -> SeatState:
        record = Seat("m", LoadConfig(devices=("CUDA0",), n_gpu_layers=-1), "m", 0.0)
        s = SeatState(id="s", seat=record, entry=None, engine="llama-server",  # type: ignore[arg-type]
                      model_path=Path("."), port=1,
                      log_path=Path("."), started_at=0.0, predicted=logged, signature="sig", strategy="load")
        s.measured = logged
        s.load_reading(0.0, ProcessMemory((1,), pss - 100 * MiB, 100 * MiB, pss, "smaps_rollup"), {"CUDA0": nvml})
        return s

    engine = _fake_binary(tmp_path)  # the learned overhead is kept per engine binary (path, size, mtime)

    async def scenario() -> dict:
        sup = Supervisor(config=cfg, catalog=Catalog([]), store=store, engine_binary=engine)
        for s in (seat(pss=128 * MiB, nvml=1300 * MiB),  # 8 MiB host, 300 MiB on CUDA0
                  seat(pss=125 * MiB, nvml=1350 * MiB)):  # smaller host, larger GPU reading
            grown = grown_overhead(sup.engine_overhead, overhead_seen(s))
            if grown:
                await learn_engine_overhead(sup.prices, sup.store, sup.engine_binary, grown)
        again = Supervisor(config=cfg, catalog=Catalog([]), store=store, engine_binary=engine)
        await again.start()  # a restart finds what was learned
        learned = dict(again.engine_overhead)
        await again.shutdown()
        return learned

    try:
        assert asyncio.run(scenario()) == {HOST: 8 * MiB, "CUDA0": 350 * MiB}
    finally:
        store.close()


def test_a_stop_with_nothing_measured_is_unverified_with_its_reason() -> None:
    # a seat that died before it could be read (a crash): its group is gone, but what it held was never measured,
    # so its release is not "verified" and has no release time (the histogram never gets a 0 for it)
    import asyncio
    import subprocess
    import time

    from fitevict.seat.release import stop_and_verify

    p = subprocess.Popen(["true"], start_new_session=True)
    p.wait()
    res = asyncio.run(stop_and_verify("crashed", p.pid, (), proc=None, grace=1.0, release_timeout=1.0, nvml=None,
                                      clock=time.monotonic))
    assert res.verified is False and res.release_seconds is None and res.freed_bytes is None
    assert res.note.startswith("unverified: the process tree could not be read") and "never measured" in res.note
    assert res.details()["release_verified"] is False and res.details()["release_seconds"] is None


def test_the_shutdown_summary_counts_what_happened() -> None:
    from fitevict.supervisor.core import _summary
    from fitevict.seat.release import StopResult

    ok = StopResult("a", {HOST: HELD}, HELD, {HOST: HELD}, 0.1, 0.02, True, "verified")
    unread = StopResult("b", {HOST: None}, None, {}, 0.1, None, False, "unverified: never measured")
    s = _summary(0, 0, 1.5, ["a", "b", "c"], [ok, unread, RuntimeError("stop raised")])
    assert (s.stopped, s.verified, s.unverified, s.failed) == (2, 1, ("b: unverified: never measured",),
                                                               ("c: RuntimeError: stop raised",))
    line = s.line()
    assert "2 seat(s) stopped, 1 release(s) verified, 1 not verified, 1 failed" in line
    assert "not verified: b: unverified" in line and "failed: c: RuntimeError" in line


def test_a_missing_teardown_report_is_not_a_clean_one() -> None:
    from fitevict.seat.accounts import leak_check
    from fitevict.seat.release import StopResult

    res = StopResult("hf", {HOST: HELD}, HELD, {HOST: HELD}, 10.2, 0.1, True, "verified")
    assert leak_check({"verdict": "clean", "leaks": []}, res) == "clean"
    assert leak_check({"leaks": [{"path": "w", "bytes": 4}]}, res).startswith("1 tensor(s) still alive")
    missing = leak_check(None, res)
    assert missing.startswith("did not run:") and "10.20 s" in missing


@pytest.mark.parametrize(
    "code,stop,ended,words",
    [
        (0, GroupStop(0.02), "sigterm", "exited on the stop's SIGTERM (exit code 0)"),
        (-15, GroupStop(0.02), "sigterm", "exited on the stop's SIGTERM (exit code -15)"),
        (-9, GroupStop(10.0, killed=True, state_at_kill="S"), "sigkill",
         "did not exit within the stop's grace of 10 s"),
        (-9, GroupStop(10.0, killed=True, state_at_kill="T"), "frozen", "stopped by a signal (state T)"),
        (-9, GroupStop(0.05), "killed", "ended by signal 9 (SIGKILL) during the stop, within its grace"),
        (-11, GroupStop(0.05), "signal", "ended by signal 11 (SIGSEGV) during the stop"),
        (-9, GroupStop(0.0, exited_before=True), "exited", "had already exited (exit code -9) before the stop"),
        (None, GroupStop(0.1), "unknown", "not a child of this fitevict"),
    ])
def test_a_stop_says_how_the_process_ended_during_it(code, stop, ended, words) -> None:
    got, note = stop_account(code, stop, 10.0)
    assert got == ended and words in note
