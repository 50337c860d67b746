"""An engine that crashes while loading with repacking on is loaded again with -nr, once, and remembered.

The engine is the real llama-server behind a wrapper that crashes the way the pinned build does on an Intel Xeon
with AMX and a quantized model: by SIGSEGV, whenever it is started as a seat (``--fit off``: the dry run, which
computes nothing, does not crash there) with repacking on (its flags lack ``-nr``). Every start is counted in a file beside it.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from fitevict.config import load_config
from fitevict.pricing.logparse import PRECISION_BYTES
from fitevict.request.catalog import Catalog
from fitevict.store import Store
from fitevict.supervisor import LoadFailed, Supervisor

pytestmark = pytest.mark.e2e


def _engine(tmp_path: Path, real: Path, crash: str) -> tuple[Path, Path]:
    """A llama-server that dies by ``crash`` (a shell condition on its flags) as a seat; returns it and the log of
    its starts as the model under test (its own overhead calibration at start is not counted)."""
    starts = tmp_path / "starts.log"
    wrapper = tmp_path / "engine" / "llama-server"
    wrapper.parent.mkdir()
    wrapper.write_text(
        "#!/bin/sh\n"
        "case \" $* \" in *\" --fit off \"*)\n"
        f"  case \"$*\" in *quant.gguf*) echo \"$*\" >> {starts} ;; esac\n"
        f"  {crash}\n"
        "esac\n"
        f"exec {real} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper, starts


def _setup(tmp_path: Path, zoo: dict, **over):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-q4_0"].path, models / "quant.gguf")
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path / "data"), "models_dirs": [str(models)],
                                               "budget.ram_limit": 4 * 1024**3, "budget.ram_reserve": 0, **over})
    return cfg, Catalog.from_config(cfg), Store.open(cfg.store_url)


def _failed_load(cfg, cat, store, engine: Path) -> str:
    """Ask for the model once; the load must fail: returns why."""
    async def scenario() -> str:
        sup = Supervisor(config=cfg, catalog=cat, store=store, engine_binary=engine)
        await sup.start()
        try:
            with pytest.raises(LoadFailed) as e:
                async with sup.acquire(sup.ask("quant")):
                    pass
            return str(e.value)
        finally:
            await sup.shutdown()

    return asyncio.run(scenario())


CRASH_WITH_REPACK = 'case " $* " in *" -nr "*) ;; *) kill -SEGV $$ ;; esac'


def test_a_repack_crash_is_served_on_the_first_request_and_remembered(tmp_path: Path, zoo: dict,
                                                                     llama_server: Path) -> None:
    engine, starts = _engine(tmp_path, llama_server, CRASH_WITH_REPACK)
    cfg, cat, store = _setup(tmp_path, zoo)

    async def once() -> tuple[bool, str]:
        sup = Supervisor(config=cfg, catalog=cat, store=store, engine_binary=engine)
        await sup.start()
        try:
            async with sup.acquire(sup.ask("quant")) as seat:
                cmdline = Path(f"/proc/{seat.pid}/cmdline").read_bytes().split(b"\0")
                return seat.config.repack, b"-nr" in cmdline
        finally:
            await sup.shutdown()

    assert asyncio.run(once()) == (False, True)  # the first request is served, by a seat started with -nr
    runs = starts.read_text().splitlines()
    assert len(runs) == 2 and "-nr" not in runs[0].split() and "-nr" in runs[1].split()
    load = store.events(event="load")[0]
    crash = load.details["repack_crash"]
    assert crash["signal"] == "SIGSEGV" and crash["seconds"] > 0 and crash["predicted_bytes"] > 0
    assert crash["file"]["path"].endswith("quant.gguf") and crash["machine"]
    assert "without repacking (-nr)" in load.reason and "SIGSEGV" in load.reason
    assert load.details["config"]["repack"] is False
    # priced for what it ran: no extra host buffer in the prediction of the -nr seat
    # (a seat's measurement is its log's, to 0.01 MiB)
    assert abs(_model_bytes(load.details["predicted"]) - _model_bytes(load.details["measured"])) <= PRECISION_BYTES
    assert not store.events(event="fail")

    # a new fitevict on the same store and machine goes straight to -nr: no crash, no second start
    assert asyncio.run(once()) == (False, True)
    runs = starts.read_text().splitlines()
    assert len(runs) == 3 and "-nr" in runs[2].split()
    assert "repack_crash" not in store.events(event="load")[0].details


def test_a_second_crash_fails_the_load_naming_both_attempts(tmp_path: Path, zoo: dict, llama_server: Path) -> None:
    engine, starts = _engine(tmp_path, llama_server, "kill -SEGV $$")
    cfg, cat, store = _setup(tmp_path, zoo)

    why = _failed_load(cfg, cat, store, engine)
    assert "SIGSEGV with repacking on" in why and "-nr failed too" in why
    assert len(starts.read_text().splitlines()) == 2
    fail = store.events(event="fail")[0]
    assert fail.details["repack_crash"]["signal"] == "SIGSEGV" and "-nr failed too" in fail.reason


def test_a_kill_is_not_retried(tmp_path: Path, zoo: dict, llama_server: Path) -> None:
    # SIGKILL is the OOM killer's (or fitevict's own): never a reason to load again
    engine, starts = _engine(tmp_path, llama_server, "kill -KILL $$")
    cfg, cat, store = _setup(tmp_path, zoo)

    _failed_load(cfg, cat, store, engine)
    assert len(starts.read_text().splitlines()) == 1
    assert "repack_crash" not in store.events(event="fail")[0].details


def test_engine_extra_args_reach_every_seat_and_are_priced(tmp_path: Path, zoo: dict, llama_server: Path) -> None:
    # engine.extra_args = ["-nr"]: on the seat's command line, and the price has no extra host buffer
    engine, starts = _engine(tmp_path, llama_server, ":")
    cfg, cat, store = _setup(tmp_path, zoo, **{"engine.extra_args": ["-nr"]})

    async def scenario() -> tuple[bool, int, int, str]:
        sup = Supervisor(config=cfg, catalog=cat, store=store, engine_binary=engine)
        await sup.start()
        try:
            seat = await sup.load("quant")  # an admin load answers with the seat measured
            assert seat.measured is not None
            return (seat.config.repack, seat.predicted.device("CPU").model.bytes,
                    seat.measured.device("CPU").model.bytes, seat.log_path.read_text())
        finally:
            await sup.shutdown()

    repack, predicted, measured, log = asyncio.run(scenario())
    assert repack is False
    assert starts.read_text().split().count("-nr") == 1  # spelt once, by the argv builder
    assert "CPU_REPACK model buffer" not in log and "AMX model buffer" not in log
    assert abs(predicted - measured) <= PRECISION_BYTES  # priced as it ran: the mapped file alone (log precision)


def _model_bytes(footprint: dict) -> int:
    return next(d["model_bytes"] for d in footprint["devices"] if d["name"] == "CPU")
