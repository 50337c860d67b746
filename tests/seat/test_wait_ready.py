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
