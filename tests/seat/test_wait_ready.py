"""A load that stalls (``seat.running.wait_ready``), on a real child process: one stopped by a signal during its
load says so, one merely silent does not."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from fitevict.schedule.errors import LoadFailed
from fitevict.seat.running import wait_ready

from . import fakeparts


def _stall(tmp_path: Path, *, stop: bool) -> str:
    seat = fakeparts.seat(tmp_path, port=9)  # nothing answers health there

    async def scenario() -> str:
        await fakeparts.run(seat, "import time; time.sleep(120)")
        assert seat.pid is not None
        if stop:
            os.kill(seat.pid, signal.SIGSTOP)
        try:
            with pytest.raises(LoadFailed) as failed:
                await wait_ready(seat, clock=time.monotonic, health_timeout=60, stall_seconds=0.5)
            return str(failed.value)
        finally:
            os.killpg(seat.pid, signal.SIGKILL)
            assert seat.proc is not None
            await seat.proc.wait()

    return asyncio.run(scenario())


def test_a_load_stopped_by_a_signal_says_so(tmp_path: Path) -> None:
    why = _stall(tmp_path, stop=True)
    assert "load stalled" in why and "was stopped by a signal (state T), not loading" in why


def test_a_silent_load_is_a_stall_without_a_stop(tmp_path: Path) -> None:
    why = _stall(tmp_path, stop=False)
    assert "load stalled" in why and "stopped by a signal" not in why


def test_a_stopped_load_is_seen_while_other_processes_map_its_files(tmp_path: Path) -> None:
    """Every seat maps the engine's libraries, and a process's PSS moves whenever another maps or unmaps a file it
    maps: a soak's seat stopped during its load (SIGSTOP) went unseen for over a minute while other seats came and
    went. Here the test process maps the stopped child's file for 150 ms, then not for 150 ms, over and over (the
    child's PSS halving and coming back) and the load still fails as stalled, not at its health timeout."""
    import mmap
    import threading

    data = tmp_path / "weights.bin"
    data.write_bytes(b"\x05" * (8 * 2**20))
    seat = fakeparts.seat(tmp_path, port=9)
    churn = threading.Event()

    def map_and_unmap() -> None:
        with data.open("rb") as f:
            while not churn.is_set():
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                sum(m[i] for i in range(0, len(m), 4096))  # its pages now in this process too
                churn.wait(0.15)
                m.close()
                churn.wait(0.15)

    async def scenario() -> str:
        await fakeparts.run(seat, "import mmap, sys, time\n"
                                  f"f = open({str(data)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
                                  "sum(m[i] for i in range(0, len(m), 4096)); time.sleep(120)")
        assert seat.pid is not None
        from fitevict.host.procmem import read_process
        while (read_process(seat.pid).mapped_bytes or 0) < 8 * 2**20:  # the child has paged its file in
            await asyncio.sleep(0.02)
        os.kill(seat.pid, signal.SIGSTOP)
        mover = threading.Thread(target=map_and_unmap, daemon=True)
        mover.start()
        try:
            with pytest.raises(LoadFailed) as failed:
                await wait_ready(seat, clock=time.monotonic, health_timeout=15, stall_seconds=0.5)
            return str(failed.value)
        finally:
            churn.set()
            mover.join()
            os.killpg(seat.pid, signal.SIGKILL)
            assert seat.proc is not None
            await seat.proc.wait()

    why = asyncio.run(scenario())
    assert "load stalled" in why and "was stopped by a signal (state T)" in why, why
