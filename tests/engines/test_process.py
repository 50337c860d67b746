"""How engine processes are started and awaited (``fitevict.engines.process``): real processes, real signals."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
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


def test_a_leader_whose_exit_has_begun_counts_as_exited_before_the_stop(monkeypatch) -> None:
    """A killed process's sockets close while its exit runs, before it can be reaped: a stop begun then (its request's
    broken connection seen first) finds it exiting (``procmem.exiting``), and says it had exited before the stop."""
    from fitevict.engines import process

    async def stop(is_exiting: bool) -> bool:
        child = start_child([sys.executable, "-c", "import time; time.sleep(60)"], stdout=open(os.devnull, "wb"))
        monkeypatch.setattr(process, "exiting", lambda pid: is_exiting and pid == child.pid)
        return (await stop_process_group(child.pid, 5.0, proc=child)).exited_before

    assert asyncio.run(stop(True)) is True
    assert asyncio.run(stop(False)) is False


def test_a_group_whose_members_are_zombies_runs_nothing() -> None:
    """A seat killed with its door is reparented and may stay a zombie until its new parent reaps it: the kernel
    still knows its group, but nothing of it runs. A live member keeps its group alive."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert group_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        os.killpg(child.pid, 0)  # the kernel still has the group
        assert not group_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not group_alive(child.pid)
