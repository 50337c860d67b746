"""The loader alone (``seat.loading.Loader``), over a real history in a real SQLite store, with a launcher that
starts a real process and then waits (or fails as told): a load cancelled while its engine loads ends that process
and records an ``unload``; a load that fails for good records a ``fail`` with the engine's own account of why; a bug
in a load ends as a failed load. Each tells the scheduler exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from fitevict.pricing.loadconfig import LoadConfig
from fitevict.schedule.errors import LoadFailed
from fitevict.schedule.seats import SeatStatus
from fitevict.store import Store
from fitevict.supervisor.history import History
from fitevict.seat.launching import Failed
from fitevict.seat.loading import Loader

from . import fakeparts


class Launcher:
    """Starts the seat's process (a real one that never answers) and waits for ever, or fails as ``outcome`` says: an
    engine that logged why and exited, or a bug."""

    def __init__(self, tmp: Path, outcome: str) -> None:
        self.tmp, self.outcome = tmp, outcome
        self.started = asyncio.Event()

    async def prune_logs(self) -> None:
        pass

    async def launch(self, attempt, entry, cfg, path, predicted, plan):
        seat = attempt.seat = fakeparts.seat(self.tmp, status=SeatStatus.LOADING)
        attempt.spec, attempt.config = SimpleNamespace(argv=("engine", "-m", str(path)), notes=()), cfg
        if self.outcome == "fail":  # the engine says why in its log, and exits
            await fakeparts.run(seat, "print('engine: no such tensor: blk.0.attn_q', flush=True); exit(1)")
            await seat.proc.wait()
            self.started.set()
            res = await fakeparts.Ending().end(seat)
            return Failed(res, LoadFailed("m: llama-server exited with code 1 while loading m.gguf"))
        await fakeparts.run(seat, "import time; time.sleep(600)")
        self.started.set()
        if self.outcome == "bug":
            raise KeyError("blk.0")
        await asyncio.Event().wait()


class Scheduler:
    """What the loader tells the scheduler, in order; the seat record it reads (placing until told otherwise)."""

    def __init__(self) -> None:
        self.told: list[tuple] = []
        self.seats = {"m": SimpleNamespace(status=SeatStatus.LOADING)}

    def stopped(self, key: str) -> None:
        self.told.append(("stopped", key))

    def load_failed(self, key: str, error: Exception) -> None:
        self.told.append(("load_failed", key, str(error)))


def _load(tmp_path: Path, outcome: str):
    store = Store.open(f"sqlite:///{tmp_path / 'fitevict.db'}")
    scheduler, ending = Scheduler(), fakeparts.Ending()
    done: list[Path] = []
    engine = SimpleNamespace(failure=lambda text: "no such tensor: blk.0.attn_q" if "no such tensor" in text else None,
                             exit_meaning=lambda code: None)
    processes = SimpleNamespace(done_with_log=done.append, engine_for=lambda entry: engine,
                                engine_name=lambda key: "llama-server")
    prices = SimpleNamespace(asked=lambda w: (fakeparts.entry(), tmp_path / "m.gguf"))

    async def predicted(waiter, entry, cfg, path):
        return fakeparts.PRICE

    prices.predicted = predicted

    async def scenario():
        launcher = Launcher(tmp_path, outcome)
        loader = Loader(asyncio.get_running_loop().time, History(store), processes, scheduler,  # type: ignore
                        prices=prices, launcher=launcher, ending=ending, readiness=None, meter=None,  # type: ignore
                        recorder=None, watch=None, spawn=lambda coro, name: asyncio.create_task(coro, name=name),
                        closed=lambda: False, handed=lambda: 0, recording=set())  # type: ignore[arg-type]
        waiter = SimpleNamespace(key="m", request_id="req-1", origin=None)
        plan = SimpleNamespace(key="m", action="load", config=LoadConfig(n_ctx=512), split="")
        loader.start(waiter, plan)  # type: ignore[arg-type]
        task = loader.loads["m"]
        await launcher.started.wait()
        cancelled = outcome == "wait" and loader.cancel("m", "unload: no one waiting")
        await task
        return cancelled, loader

    try:
        cancelled, loader = asyncio.run(scenario())
        return SimpleNamespace(cancelled=cancelled, loader=loader, events=store.events(), told=scheduler.told,
                               ending=ending, done=done)
    finally:
        store.close()


def test_a_load_cancelled_while_it_loads_ends_its_process_and_records_an_unload(tmp_path: Path) -> None:
    got = _load(tmp_path, "wait")
    assert got.cancelled and got.loader.loads == {}
    (ev,) = got.events
    assert ev.event == "unload" and "no one waiting" in ev.reason and ev.request_id == "req-1"
    assert ev.freed_bytes == fakeparts.FREED and ev.details["note"] == "unload: no one waiting"
    assert len(got.ending.calls) == 1 and len(got.done) == 1
    assert got.told == [("stopped", "m")]  # exactly once


def test_a_load_that_fails_for_good_records_the_engines_own_account(tmp_path: Path) -> None:
    got = _load(tmp_path, "fail")
    (ev,) = got.events
    assert ev.event == "fail" and ev.reason == "m: no such tensor: blk.0.attn_q"  # the engine's words, not the code
    assert ev.freed_bytes == fakeparts.FREED and ev.details["argv"] == ["engine", "-m", str(tmp_path / "m.gguf")]
    assert ev.strategy == "load" and ev.predicted_bytes == fakeparts.PRICE.whole_bytes
    assert got.told == [("load_failed", "m", "m: no such tensor: blk.0.attn_q")] and len(got.done) == 1


def test_a_bug_in_a_load_ends_as_a_failed_load_with_no_process_left(tmp_path: Path) -> None:
    got = _load(tmp_path, "bug")
    (ev,) = got.events
    assert ev.event == "fail" and "the load failed inside fitevict: KeyError" in ev.reason
    assert len(got.ending.calls) == 1  # its process ended
    assert len(got.told) == 1 and got.told[0][:2] == ("load_failed", "m") and "see the server log" in got.told[0][2]


def test_quiet_returns_only_once_no_load_is_under_way() -> None:
    """What waits for the loads to end (the prices read ahead) is held while one runs, and let go when it ends."""
    from fitevict.seat.loading import Loader

    async def scenario() -> list[str]:
        seen: list[str] = []
        loader = Loader(None, None, None, None, prices=None, launcher=None, ending=None,  # type: ignore[arg-type]
                        readiness=None, meter=None, recorder=None, watch=None, spawn=None, closed=None,
                        handed=None, recording=set())
        await loader.quiet()  # no load: at once
        seen.append("quiet with no load")
        gate = asyncio.Event()
        loader.loads["b"] = asyncio.ensure_future(gate.wait())
        quiet = asyncio.ensure_future(loader.quiet())
        for _ in range(5):  # let both run their steps: the wait stays held while the load runs
            await asyncio.sleep(0)
        seen.append(f"held while loading: {not quiet.done()}")
        gate.set()
        await quiet
        seen.append("quiet once it ended")
        return seen

    assert asyncio.run(scenario()) == ["quiet with no load", "held while loading: True", "quiet once it ended"]


def test_prices_are_not_read_ahead_while_a_load_is_under_way(tmp_path: Path) -> None:
    """The supervisor's read-ahead waits for the loads under way before each model's dry run (``Loader.quiet``)."""
    from fitevict.config import load_config
    from fitevict.request.catalog import Catalog
    from fitevict.supervisor import Supervisor

    (tmp_path / "models").mkdir()
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path / "data"),
                                               "models_dirs": [str(tmp_path / "models")]})
    store = Store.open(cfg.store_url)

    async def scenario() -> list[str]:
        sup = Supervisor(config=cfg, catalog=Catalog.from_config(cfg), store=store,
                         engine_binary=fakeparts.engine_binary(tmp_path))
        seen: list[str] = []

        async def read_price(key: str, contract=None) -> None:
            seen.append(f"priced {key}")

        sup.read_price = read_price  # type: ignore[method-assign]
        gate = asyncio.Event()

        async def loading() -> None:
            await gate.wait()
            seen.append("load ended")

        sup.fx.loader.loads["b"] = asyncio.ensure_future(loading())
        ahead = asyncio.ensure_future(sup.read_prices_ahead(["a", "c"]))
        for _ in range(5):
            await asyncio.sleep(0)
        seen.append("still loading")
        gate.set()
        await ahead
        return seen

    try:
        assert asyncio.run(scenario()) == ["still loading", "load ended", "priced a", "priced c"]
    finally:
        store.close()
