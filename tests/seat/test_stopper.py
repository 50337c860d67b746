"""The stopper alone (``seat.stopping.Stopper``), over a real history in a real SQLite store: a stop is marked
in the seat's store record before anything else, the prompts are saved before the seat ends, the stop is recorded
with what came back, and the scheduler is told exactly once, as soon as the release is verified: the record and
the store's forgetting follow, off the path of whatever waited for the seat's bytes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from fitevict.store import Store
from fitevict.supervisor.history import History
from fitevict.seat.stopping import Stopper
from . import fakeparts

LEAKS = {"leaks": [{"path": "model.layers.0.weight", "bytes": 4096}]}


class Processes:
    """The seat's engine (its teardown report, from its log) and the logs it is done with."""

    def __init__(self, log: list, teardown: dict | None) -> None:
        self.log, self.done, self.read = log, [], []  # read: the log text each teardown was given
        self.engine = SimpleNamespace(teardown=lambda text: self.read.append(text) or teardown,
                                      shutting_down=lambda text: None,
                                      traits=SimpleNamespace(reports_teardown=teardown is not None))

    def engine_for(self, entry):
        return self.engine

    def done_with_log(self, path: Path) -> None:
        self.done.append(path)
        self.log.append("done_with_log")


def _stop(tmp_path: Path, event: str, *, teardown: dict | None = None, slot_freed_early: bool = False,
          died_draining: bool = False):
    store = Store.open(f"sqlite:///{tmp_path / 'fitevict.db'}")
    order: list[str] = []
    told: list[tuple] = []
    saved: list[str] = []
    under_way: list[tuple] = []
    stoppers: list[Stopper] = []
    records = fakeparts.Records()
    ending = fakeparts.Ending(order)
    processes = Processes(order, teardown)
    seat = fakeparts.seat(tmp_path)

    seat.log_path.write_text("what it wrote while it served\n")

    async def save_prompts(s, ev: str) -> dict:
        with s.log_path.open("a") as log:  # the stop has begun: what the engine says from now on is its teardown's
            log.write("what it wrote on its way out\n")
        saved.append(ev)
        order.append("save")
        under_way.append(stoppers[0].evicted_for("req-1"))  # its event not recorded yet: the stop names it
        return {"kv_saved": [], "kv_save_notes": ["test: nothing to save"]}

    def stopped(key, res, *, slot_freed=False, how=None) -> None:
        told.append((key, res.freed_bytes, slot_freed))
        order.append("stopped")

    def freed(key) -> None:  # the scheduler: the seat holds nothing any more
        told.append((key, "freed"))
        order.append("freed")

    async def scenario():
        history = History(store)
        history.on_event.append(lambda ev: order.append(f"event:{ev.event}"))
        if slot_freed_early:  # the ending freed the slot while it verified the release
            seat.slot_freed = True
        if died_draining:  # its process killed while it drained, before its stop began
            seat.seat.drained = True
            await fakeparts.run(seat, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
            assert seat.proc is not None
            await seat.proc.wait()
        stopper = Stopper(lambda: 5.0, history, processes, SimpleNamespace(gpu_figure=lambda s: None),
                          ending=ending, records=records, save_prompts=save_prompts, stopped=stopped,
                          freed=freed)
        stoppers.append(stopper)
        res = await stopper.stop(seat, event, "evicted for b", "req-1")
        under_way.append(stopper.evicted_for("req-1"))  # recorded: the history names it from now on
        return res

    try:
        res = asyncio.run(scenario())
        return SimpleNamespace(res=res, events=store.events(), order=order, told=told, saved=saved, under_way=under_way,
                               records=records, ending=ending, processes=processes, seat=seat)
    finally:
        store.close()


def test_a_stop_is_recorded_with_what_came_back_and_the_scheduler_told_once(tmp_path: Path) -> None:
    got = _stop(tmp_path, "evict")
    ev = next(e for e in got.events if e.event == "evict")
    assert ev.freed_bytes == fakeparts.FREED == got.res.freed_bytes
    assert ev.model == "m" and ev.reason == "evicted for b" and ev.request_id == "req-1" and ev.time == 5.0
    assert ev.details["release_note"] == "test: what the ending said" and ev.details["release_verified"] is True
    assert ev.details["kv_save_notes"] == ["test: nothing to save"]  # the prompts saved before the stop
    # the scheduler told exactly once, as the release was verified; whoever waits for the stop once it is recorded
    assert got.told == [("m", "freed"), ("m", fakeparts.FREED, True)]
    # the stop marked in the store first, what its release is verified against read beside the prompts' save (begun
    # before it, awaited before the seat ends), the seat ended with the slot freed early if need be, the scheduler
    # told at once, and whoever waits for the stop once it is recorded and its log let go
    assert got.records.kept == [(got.seat.id, "stopping:evict")] and got.saved == ["evict"]
    assert got.ending.calls == [(got.seat.id, True)]
    # its store record goes only once the stop is recorded: a door killed in between finds it at its restart
    assert got.order == ["read before", "save", "end after the reading", "freed", "event:evict", "forget",
                         "done_with_log", "stopped"]
    assert got.processes.done == [got.seat.log_path]
    assert not [e for e in got.events if e.event == "leak"]


def test_a_teardown_that_names_live_tensors_adds_a_leak_event(tmp_path: Path) -> None:
    got = _stop(tmp_path, "unload", teardown=LEAKS)
    assert got.order == ["read before", "save", "end after the reading", "freed", "event:unload", "forget", "event:leak",
                         "done_with_log", "stopped"]
    events = {e.event: e for e in got.events}
    assert sorted(events) == ["leak", "unload"]
    assert events["leak"].host_bytes == 4096 and "model.layers.0.weight" in events["leak"].reason
    assert "leak_check" in events["unload"].details
    assert got.told == [("m", "freed"), ("m", fakeparts.FREED, True)]


def test_the_teardown_is_read_from_what_the_log_got_since_the_stop_began(tmp_path: Path) -> None:
    got = _stop(tmp_path, "unload", teardown=LEAKS)
    assert got.processes.read == ["what it wrote on its way out\n"]  # not the whole log of its life


def test_an_engine_that_writes_no_teardown_report_has_its_log_left_unread(tmp_path: Path) -> None:
    got = _stop(tmp_path, "evict")
    assert got.processes.read == [] and got.events


def test_an_eviction_under_way_is_named_for_its_request_until_its_event_is_recorded(tmp_path: Path) -> None:
    assert _stop(tmp_path, "evict").under_way == [("m",), ()]
    assert _stop(tmp_path / "u", "unload").under_way == [(), ()]  # an unload is no eviction for a request


def test_a_slot_freed_while_the_release_was_verified_is_not_freed_twice(tmp_path: Path) -> None:
    got = _stop(tmp_path, "idle-unload", slot_freed_early=True)
    assert got.told == [("m", fakeparts.FREED, True)]  # neither the stopper nor the desk tells the scheduler again


def test_a_seat_that_died_while_it_drained_ends_as_its_stop_saying_how(tmp_path: Path) -> None:
    """Killed while it drained, before its stop began: the stop's own event (no crash) says it was draining and how
    the process ended, as a crash would; no prompts are saved from a dead process; the scheduler told once."""
    got = _stop(tmp_path, "evict", died_draining=True)
    (ev,) = got.events
    d = ev.details
    assert ev.event == "evict" and d["draining"] is True and d["pid"] == got.seat.pid
    assert d["stop_ended"] == "exited" and d["stop_exit_code"] == -9 and d["exit_code"] == -9
    assert d["cause"] == "killed" and d["oom"] is None and "log_tail" in d
    assert ev.reason.startswith("evicted for b; it ended on its own while it drained: llama-server was killed (SIGKILL")
    assert got.saved == [] and "kv_save_notes" not in d
    assert got.order == ["end", "freed", "event:evict", "forget", "done_with_log", "stopped"]
    assert got.told == [("m", "freed"), ("m", fakeparts.FREED, True)]


def test_a_stop_of_a_running_seat_says_it_was_not_draining_and_adds_no_cause(tmp_path: Path) -> None:
    ev = next(e for e in _stop(tmp_path, "unload").events if e.event == "unload")
    assert ev.details["draining"] is False and "cause" not in ev.details and ev.reason == "evicted for b"
