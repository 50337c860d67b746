"""How engine processes are started and awaited (``fitevict.engines.process``): real processes, real signals."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from fitevict.engines.process import alive, group_alive, start_child, stop_process_group


def test_a_child_runs_in_its_own_session_with_its_output_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "out.log"

    async def run() -> tuple[int, int | None, int]:
        with log.open("wb") as f:
            child = start_child([sys.executable, "-c", "import os, sys; print('sid', os.getsid(0)); "
                                 "print('to stderr', file=sys.stderr); sys.exit(7)"], stdout=f)
        running = child.returncode  # may already be done; never raises
        code = await asyncio.wait_for(child.wait(), 30)
        assert child.returncode == code  # reaped once, remembered
        return child.pid, running, code

    pid, running, code = asyncio.run(run())
    assert running in (None, 7) and code == 7
    text = log.read_text()
    assert f"sid {pid}" in text  # start_new_session: the child leads its own session and group
    assert "to stderr" in text  # stderr joins stdout in the seat's log
    assert not alive(pid)


def test_many_waiters_see_one_exit_and_a_group_stop_ends_it(tmp_path: Path) -> None:
    async def run() -> list[int]:
        child = start_child([sys.executable, "-c", "import time; time.sleep(60)"], stdout=open(os.devnull, "wb"))
        assert child.returncode is None
        waiters = [asyncio.ensure_future(child.wait()) for _ in range(3)]
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiters)
        await stop_process_group(child.pid, 5.0, proc=child)
        assert not group_alive(child.pid)
        return list(await asyncio.gather(*waiters))

    codes = asyncio.run(run())
    assert codes == [-signal.SIGTERM] * 3  # SIGTERM ended it, within the grace period (not the SIGKILL after it)
