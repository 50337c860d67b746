"""Reading a seat right after its load (``seat.measure.Meter``), on a real child process that holds 64 MiB and wrote
a llama-server load log, with the real llama-server engine parsing that log and /proc read for real: the engine's
buffers become the seat's engine-reported figure; the process's PSS and, on a GPU seat, NVML's bytes for that
process alone (a fake NVML stands in for the driver) become the reading its load record keeps and its growth
starts from, at the meter's clock; a log that cannot be read says why and the reading is still taken; a seat
without a process is not read."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from fitevict.engines import engine_class
from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.seat.measure import Meter
from fitevict.units import MiB
from host.fake_nvml import FakeGpu, FakeNvml

from . import fakeparts

HELD = 64 * MiB
LOG = """\
0.00.011.955 I load_tensors:   CPU_Mapped model buffer size =     0.84 MiB
0.00.012.286 I llama_context:        CPU  output buffer size =     0.01 MiB
0.00.012.333 I llama_kv_cache:        CPU KV buffer size =     0.38 MiB
0.00.015.026 I sched_reserve:        CPU compute buffer size =     0.67 MiB
"""
# holds HELD bytes it wrote, then says so and waits for its stdin to close
CHILD = f"import sys\nheld = b'x' * {HELD}\nprint('held', flush=True)\nsys.stdin.read()\n"


@pytest.fixture
def child() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"  # its memory is touched by now
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _meter(tmp_path: Path, nvml: FakeNvml) -> Meter:
    binary = fakeparts.engine_binary(tmp_path)
    processes = SimpleNamespace(engine_for=lambda entry: engine_class("llama-server").for_binary(binary))
    return Meter(nvml, lambda: 77.0, processes)  # type: ignore[arg-type]


def test_a_seat_is_read_right_after_its_load(tmp_path: Path, child: subprocess.Popen) -> None:
    nvml = FakeNvml([FakeGpu(processes=[(child.pid, 500 * MiB)])])
    seat = fakeparts.seat(tmp_path)
    seat.log_path.write_text(LOG)
    seat.pid = child.pid
    _meter(tmp_path, nvml).read(seat)
    assert seat.measured is not None and seat.measured.device(HOST).model.source == "engine-reported"
    assert seat.measured.total_bytes == pytest.approx((0.84 + 0.01 + 0.38 + 0.67) * MiB, abs=0.01 * MiB)
    mem = seat.load_mem
    assert mem is not None and mem.pids[0] == child.pid and mem.source == "smaps_rollup"
    assert mem.committed_bytes >= HELD  # what it wrote is resident, and counted
    assert seat.load_bytes == {HOST: mem.host_bytes} and seat.host_mem is mem  # the live figure starts there
    assert seat.load_read_at == seat.read_at == 77.0 and seat.readings == 1
    assert nvml.inits == 0  # a seat on no GPU: NVML is not asked


def test_a_gpu_seat_counts_nvmls_bytes_of_its_own_process_only(tmp_path: Path, child: subprocess.Popen) -> None:
    nvml = FakeNvml([FakeGpu(processes=[(child.pid, 500 * MiB), (1, 900 * MiB)])])
    seat = fakeparts.seat(tmp_path, config=LoadConfig(n_ctx=2048, n_parallel=1, devices=("CUDA0",),
                                                      n_gpu_layers=-1))
    seat.log_path.write_text(LOG)
    seat.pid = child.pid
    _meter(tmp_path, nvml).read(seat)
    assert seat.load_bytes["CUDA0"] == seat.gpu_bytes["CUDA0"] == 500 * MiB
    assert seat.peak_bytes["CUDA0"] == 500 * MiB


def test_a_log_that_cannot_be_read_says_why_and_the_process_is_still_read(tmp_path: Path,
                                                                        child: subprocess.Popen) -> None:
    seat = fakeparts.seat(tmp_path)
    seat.log_path.unlink()
    seat.pid = child.pid
    _meter(tmp_path, FakeNvml()).read(seat)
    assert seat.measured is None
    assert seat.measured_note.startswith("unavailable, because the load log could not be parsed:")
    assert seat.load_mem is not None and seat.load_mem.committed_bytes >= HELD


def test_a_seat_without_a_process_has_its_log_read_and_no_reading(tmp_path: Path) -> None:
    seat = fakeparts.seat(tmp_path)
    seat.log_path.write_text(LOG)
    _meter(tmp_path, FakeNvml()).read(seat)
    assert seat.measured is not None and seat.load_mem is None and seat.readings == 0


def test_a_device_whose_buffers_are_in_the_seat_s_pss_is_seen_unified() -> None:
    from types import SimpleNamespace

    from fitevict.pricing.footprint import DeviceFootprint, Footprint, Term
    from fitevict.seat.measure import memory_kind_seen

    t = lambda n: Term(n, "engine-reported")  # noqa: E731
    fp = Footprint((DeviceFootprint("CPU", t(10 * MiB), t(0), t(5 * MiB), t(0)),
                    DeviceFootprint("Vulkan0", t(100 * MiB), t(20 * MiB), t(8 * MiB), t(0))), 2 * MiB, 13 * MiB,
                   "engine-reported")
    seat = lambda committed: SimpleNamespace(  # noqa: E731
        measured=fp, overhead=20 * MiB, config=SimpleNamespace(devices=("Vulkan0",)),
        load_mem=SimpleNamespace(committed_bytes=committed))
    # 13 MiB of host buffers + 20 MiB overhead; the PSS holds 120 MiB more: Vulkan0's weights and KV are in it
    uni, how = memory_kind_seen(seat(153 * MiB))["Vulkan0"]
    assert uni and how.startswith("measured:") and "host memory" in how
    # a discrete device's buffers are not in the process: its PSS is its host buffers and overhead
    assert memory_kind_seen(seat(34 * MiB))["Vulkan0"][0] is False
