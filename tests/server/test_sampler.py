"""The memory sampler's reading and folding: real processes read through /proc; NVML faked at the hardware edge."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from fitevict.server.sampler import SeatReading, Window, _read, close, fold
from fitevict.units import MiB
from tests.host.fake_nvml import FakeGpu, FakeNvml

HOLD = 64 * MiB


@pytest.fixture()
def holder():
    """A real process in its own group that holds HOLD bytes of touched anonymous memory."""
    code = f"b = bytearray({HOLD}); b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); input()"
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         start_new_session=True, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    yield p
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_a_real_seat_is_read_with_pss_and_rss(holder) -> None:
    available, why, readings = _read([("s1", holder.pid)], FakeNvml(init_error="NVML Shared Library Not Found"))
    r = readings["s1"]
    assert available is not None and why == ""
    assert r.pss_source == "smaps_rollup" and r.pss_bytes >= HOLD and r.rss_bytes >= HOLD
    assert r.gpu_bytes is None and "no NVIDIA GPU" in r.gpu_reason and "Shared Library" in r.gpu_reason


def test_gpu_bytes_are_the_seats_own_processes(holder) -> None:
    nvml = FakeNvml([FakeGpu(used=3 * 1024**3, processes=[(holder.pid, 2 * 1024**3), (1, 1024**3)])])
    _available, _why, readings = _read([("s1", holder.pid)], nvml)
    assert readings["s1"].gpu_bytes == 2 * 1024**3


def test_a_gone_seat_is_unavailable_with_its_reason(holder) -> None:
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    _available, _why, readings = _read([("s1", holder.pid)], FakeNvml(init_error="no driver"))
    r = readings["s1"]
    assert r.pss_bytes is None and r.rss_bytes is None and r.pss_reason.startswith("unavailable, because")


def test_peaks_only_grow_and_the_drop_is_from_the_baseline() -> None:
    w = Window("s1", "m", "llama-server", {"n_ctx": 4096}, 10.0, 1000 * MiB, "the host reading before")
    w = fold(w, SeatReading(100 * MiB, 110 * MiB, 60 * MiB, "smaps_rollup", "", None, "unavailable, because no GPU"),
             900 * MiB, "", 0)
    w = fold(w, SeatReading(None, None, None, "unavailable", "unavailable, because it exited", None, "no GPU"),
             700 * MiB, "", 1)
    w = fold(w, SeatReading(90 * MiB, 95 * MiB, 50 * MiB, "smaps_rollup", "", None, "no GPU"), 950 * MiB, "", 0)
    p = close(w, 20.0)
    assert p.samples == 3 and p.peak_pss_bytes == 100 * MiB and p.peak_rss_bytes == 110 * MiB
    assert p.peak_available_drop_bytes == 300 * MiB  # 1000 before the seat, 700 at the lowest
    assert p.peak_gpu_bytes is None and p.reason("peak_gpu_bytes") == "unavailable, because no GPU"
    assert p.details["other_seats"] == 1 and p.ended_at == 20.0
    assert p.details["sources"]["pss"] == "smaps_rollup"  # only readings that gave a figure
