"""The crash watch alone (``seat.watching.CrashWatch``), on real child processes and a real history in a real
SQLite store: a serving seat whose process exits on its own is a crash, recorded with its cause; an exit that a stop
asked for is none."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from fitevict.config import EngineConfig
from fitevict.engines.base import EngineBase
from fitevict.schedule.seats import Exit
from fitevict.store import Store
from fitevict.supervisor.history import History
from fitevict.seat.watching import CrashWatch

from . import fakeparts


def _watch(tmp_path: Path, code: str, *, stopping: bool = False, frozen: str | None = None, draining: bool = False,
           told_by: str | None = None):
    store = Store.open(f"sqlite:///{tmp_path / 'fitevict.db'}")
    order: list[str] = []
    crashed: list[str] = []
    told: list[tuple] = []
    done: list[Path] = []
    ending = fakeparts.Ending(order)
    seat = fakeparts.seat(tmp_path)

    def stopped(key, res, *, slot_freed=False, how=Exit.STOPPED) -> None:
        told.append((key, res.freed_bytes, how))

    async def scenario() -> None:
        tasks: set[asyncio.Task] = set()

        def spawn(coro, name: str) -> asyncio.Task:
            task = asyncio.get_running_loop().create_task(coro, name=name)
            tasks.add(task)
            return task

        watch = CrashWatch(lambda: 7.0, History(store), SimpleNamespace(done_with_log=done.append,  # type: ignore
                                                                   engine_for=lambda entry: EngineBase()),
                           EngineConfig(stall_seconds=30), ending=ending, spawn=spawn,  # type: ignore[arg-type]
                           crashed=lambda key: bool(crashed.append(key) or order.append("crashed") or draining),
                           stopped=stopped,
                           silent_for=lambda port: None)
        await fakeparts.run(seat, code)
        seat.expected_exit = stopping  # a stop asked for this exit
        watch.watch(seat)
        if frozen is not None:  # the stuck-seat watch killed it
            seat.killed_for, seat.told_by = frozen, told_by
        assert seat.watcher is not None
        await seat.watcher
        await asyncio.gather(*tasks)  # the stuck-seat watch ends with the process

    try:
        asyncio.run(scenario())
        return SimpleNamespace(events=store.events(), order=order, crashed=crashed, told=told, done=done,
                               ending=ending, seat=seat)
    finally:
        store.close()


def test_an_exit_of_its_own_is_a_crash_with_its_code(tmp_path: Path) -> None:
    got = _watch(tmp_path, "import sys; print('bye', flush=True); sys.exit(3)")
    (crash,) = got.events
    assert crash.event == "crash" and crash.model == "m" and crash.time == 7.0
    assert crash.details["cause"] == "exit" and crash.details["exit_code"] == 3
    assert "exited unexpectedly with code 3" in crash.reason and "bye" in crash.details["log_tail"]
    assert crash.freed_bytes == fakeparts.FREED and crash.details["release_verified"] is True
    # the scheduler hears first that it serves nothing more, then, once the crash is recorded, that it is gone
    assert got.order == ["crashed", "end", "forget"] and got.crashed == ["m"]  # the record goes after the crash event
    assert got.told == [("m", fakeparts.FREED, Exit.CRASHED)] and got.done == [got.seat.log_path]


def test_a_crash_by_a_signal_names_it(tmp_path: Path) -> None:
    got = _watch(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    (crash,) = got.events
    assert crash.details["cause"] == "signal" and crash.details["exit_code"] == -11
    assert "died by SIGSEGV" in crash.reason
    assert got.told == [("m", fakeparts.FREED, Exit.CRASHED)]


def test_an_exit_a_stop_asked_for_is_no_crash(tmp_path: Path) -> None:
    got = _watch(tmp_path, "import sys; sys.exit(0)", stopping=True)
    assert got.events == [] and got.crashed == [] and got.told == [] and got.ending.calls == []


def test_a_frozen_seat_whose_exit_a_stop_asked_for_is_no_crash(tmp_path: Path) -> None:
    """Killed by the stuck-seat watch while a stop was under way: no crash (the stop records its end)."""
    got = _watch(tmp_path, "import sys; sys.exit(0)", stopping=True, frozen="stopped for 30 s")
    assert got.events == [] and got.crashed == [] and got.ending.calls == []


def test_a_draining_seat_that_dies_is_left_to_the_stop_it_drained_for(tmp_path: Path) -> None:
    """The scheduler says the seat was draining (its ``ending`` began the stop it drained for): no crash and no
    ending here, nobody told that it crashed; the stop records its end."""
    got = _watch(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", draining=True)
    assert got.crashed == ["m"] and got.events == [] and got.ending.calls == [] and got.told == []


def test_a_frozen_seat_is_a_crash_named_so(tmp_path: Path) -> None:
    got = _watch(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", frozen="stuck: no byte for 30 s")
    (crash,) = got.events
    assert crash.details["cause"] == "frozen"
    assert crash.reason == "stuck: no byte for 30 s; the next request reloads it"
    assert crash.details["exit_code"] == -9 and crash.details["oom"] is None


def test_a_frozen_seat_caught_in_its_shutdown_handler_was_told_to_stop(tmp_path: Path) -> None:
    """The stuck-seat watch found a thread inside the seat's SIGTERM handler (llama-server's can hang before it logs
    its shutdown): its end says it was told to stop by another program, then how it ended."""
    seen = "its main thread was inside its own SIGTERM handler"
    got = _watch(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", frozen="stuck: no byte for 30 s",
                 told_by=seen)
    (crash,) = got.events
    assert crash.details["cause"] == "told-to-stop" and crash.details["exit_code"] == -9
    assert crash.reason == f"llama-server was told to stop by another program, not by fitevict ({seen}), then: " \
                           "stuck: no byte for 30 s; the next request reloads it"
