"""The ending alone (``seat.ending.Ending``), on a real process group and a real seat table: the group is
stopped, the seat taken off its table record, its store record forgotten, and whoever waits for a change woken once
the processes exited; the scheduler is not told (that is the caller's, unless the slot is freed early)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fitevict.config import EngineConfig
from fitevict.engines.process import group_alive
from fitevict.schedule.seats import SeatTable
from fitevict.seat.ending import Ending

from . import fakeparts


def test_an_ended_seat_is_stopped_detached_and_forgotten(tmp_path: Path) -> None:
    table = SeatTable()
    seat = fakeparts.seat(tmp_path)
    table.place(seat.seat)
    records = fakeparts.Records()
    gone: list[str] = []
    changed: list[bool] = []

    async def scenario():
        ending = Ending(table, EngineConfig(stop_grace_seconds=10, release_timeout_seconds=1), None,
                        asyncio.get_running_loop().time, records=records, gone=gone.append,  # type: ignore[arg-type]
                        changed=lambda: changed.append(seat.seat.process is None))
        await fakeparts.run(seat, "import time; time.sleep(600)")
        return await ending.end(seat)

    res = asyncio.run(scenario())
    assert seat.expected_exit and seat.proc.returncode == -15  # SIGTERM, within the grace period
    assert not group_alive(seat.pgid)
    assert table.get("m") is seat.seat and seat.seat.process is None  # the record stays: the scheduler ends it
    assert changed == [True]  # woken once the processes exited, with the seat detached by then
    assert records.forgotten == [seat.id] and gone == []
    # it exited on the SIGTERM, so within the grace: the stop's own account, and its time under that budget
    assert res.key == "m" and res.ended == "sigterm" and 0 < res.exit_seconds < 10, res


def test_the_reading_begun_before_the_stop_is_the_one_its_release_is_verified_against(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """``read_before`` begins the reading off the event loop (a stop saves the seat's prompts meanwhile); ``end``
    awaits that very reading before the SIGTERM and reads nothing again."""
    import fitevict.seat.ending as ending_mod
    import fitevict.seat.release as release_mod

    order: list[str] = []
    real_read, real_stop = release_mod.read_before_stop, release_mod.stop_process_group

    def read(*args, **kwargs):
        order.append("read")
        return real_read(*args, **kwargs)

    async def stop(*args, **kwargs):
        order.append("SIGTERM")
        return await real_stop(*args, **kwargs)

    monkeypatch.setattr(ending_mod, "read_before_stop", read)
    monkeypatch.setattr(release_mod, "read_before_stop", read)
    monkeypatch.setattr(release_mod, "stop_process_group", stop)
    table = SeatTable()
    seat = fakeparts.seat(tmp_path)
    table.place(seat.seat)

    async def scenario():
        ending = Ending(table, EngineConfig(stop_grace_seconds=10, release_timeout_seconds=5), None,
                        asyncio.get_running_loop().time, records=fakeparts.Records(), gone=lambda key: None,
                        changed=lambda: None)
        await fakeparts.run(seat, "import time; time.sleep(600)")
        before = ending.read_before(seat)
        return await ending.end(seat, before=before), await before

    res, reading = asyncio.run(scenario())
    assert order == ["read", "SIGTERM"]  # read once, before the SIGTERM, never again
    assert reading.tree is not None and seat.pid in reading.tree.pids
    assert res.held == reading.held and res.held["CPU"] and res.verified, res.note
