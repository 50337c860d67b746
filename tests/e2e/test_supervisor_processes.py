"""The supervisor's seat processes, real ones: a seat killed under it, a load nobody waits for any more, a port
taken before the engine binds it, and a restart that finds the last run's seats still running (stopped, or
adopted when configured)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from _supervised import make, run, supervisor
from fitevict.supervisor import Supervisor

pytestmark = pytest.mark.e2e


def test_killed_seat_is_recorded_as_crash_and_reloaded(tmp_path: Path, models_dir: Path, llama_server: Path) -> None:
    cfg, cat, store = make(tmp_path, models_dir, llama_server, ram_limit=4 * 1024**3)

    async def scenario() -> None:
        sup = supervisor(cfg, cat, store, llama_server)
        await sup.start()
        try:
            seat = await sup.load("llama-gqa")
            os.kill(seat.pid, signal.SIGKILL)
            crash = await sup.wait_for_event(lambda e: e.event == "crash", timeout=30)
            assert crash.model == "llama-gqa" and "-9" in crash.reason
            assert "llama-gqa" not in sup.seats
            async with sup.acquire(sup.ask("llama-gqa")) as again:
                assert again.state == "ready" and again.pid != seat.pid
        finally:
            await sup.shutdown()

    run(scenario)
    assert [e.event for e in store.events(model="llama-gqa", order="asc")][:3] == ["load", "crash", "load"]


def test_a_load_nobody_waits_for_is_cancelled_and_its_release_verified(tmp_path: Path, models_dir: Path,
                                                                     llama_server: Path) -> None:
    # an engine that takes its time to start (the real one, 3 s late), so the client leaves while it loads
    slow = tmp_path / "engine" / "llama-server"
    slow.parent.mkdir()
    slow.write_text(f"#!/bin/sh\ncase \"$*\" in *--port*) sleep 3;; esac\nexec {llama_server} \"$@\"\n")
    slow.chmod(0o755)
    cfg, cat, store = make(tmp_path, models_dir, llama_server, ram_limit=4 * 1024**3)

    async def scenario() -> int:
        sup = supervisor(cfg, cat, store, slow)
        await sup.start()
        try:
            async def client() -> None:
                async with sup.acquire(sup.ask("med-a")):
                    raise AssertionError("the load should have been cancelled before it was ready")

            waiter = asyncio.create_task(client())
            await sup.wait_until(lambda: "med-a" in sup.seats and sup.seats["med-a"].pid is not None, 60)
            pid = sup.seats["med-a"].pid
            waiter.cancel()  # the only client leaves while its model loads
            ev = await sup.wait_for_event(lambda e: e.event == "unload", timeout=60)
            assert "no one waiting" in ev.reason and ev.model == "med-a"
            assert "med-a" not in sup.seats and not sup.scheduler.seats
            return pid
        finally:
            await sup.shutdown()

    pid = run(scenario)
    assert not Path(f"/proc/{pid}").exists()
    assert store.events(event="load") == []
    ev = store.events(event="unload")[0]
    assert ev.details["release_verified"] is True, ev.details


def test_restart_with_seats_alive_leaves_no_orphans(tmp_path: Path, models_dir: Path, llama_server: Path) -> None:
    cfg, cat, store = make(tmp_path, models_dir, llama_server, ram_limit=4 * 1024**3)

    async def scenario() -> None:
        first = supervisor(cfg, cat, store, llama_server)
        await first.start()
        seat = await first.load("llama-gqa")
        pid = seat.pid
        # The first supervisor is gone without stopping its seat (as after a SIGKILL of fitevict).
        first.desk.closed = True
        second = supervisor(cfg, cat, store, llama_server)
        orphans = await second.start()
        try:
            assert [o.event for o in orphans] == ["orphan"]
            assert orphans[0].details["was_alive"] is True and orphans[0].details["pid"] == pid
            assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
            assert store.seats() == []
        finally:
            await second.shutdown()
            await first.shutdown()

    run(scenario)


def test_restart_adopts_a_healthy_orphan_when_configured(tmp_path: Path, models_dir: Path, llama_server: Path) -> None:
    cfg, cat, store = make(tmp_path, models_dir, llama_server, ram_limit=4 * 1024**3, **{"engine.orphans": "adopt"})

    async def scenario() -> None:
        first = supervisor(cfg, cat, store, llama_server)
        await first.start()
        pid = (await first.load("llama-gqa")).pid
        first.desk.closed = True
        second = supervisor(cfg, cat, store, llama_server)
        orphans = await second.start()
        try:
            assert orphans[0].details["adopted"] is True and "adopted" in orphans[0].reason
            async with second.acquire(second.ask("llama-gqa")) as seat:  # served by the same process, no reload
                assert seat.pid == pid and seat.state == "ready"
            # what it counts for the adopted seat is what bytes_on counted (planned), never labelled measured
            adopted = second.table.get("llama-gqa")
            assert adopted is not None and adopted.loaded_source == "planned", adopted.loaded_source
            assert [s.pid for s in store.seats()] == [pid]
            os.kill(pid, signal.SIGKILL)  # an adopted seat is not our child; its death is still seen
            crash = await second.wait_for_event(lambda e: e.event == "crash", timeout=30)
            assert crash.model == "llama-gqa" and "llama-gqa" not in second.seats
        finally:
            await second.shutdown()
            for record in first.table.values():  # its process belongs to the second supervisor now
                first.table.detach(record, record.process)
            await first.shutdown()

    run(scenario)
    assert len(store.events(event="load")) == 1  # adopted, never loaded twice


def test_a_port_taken_between_choice_and_bind_is_retried(tmp_path: Path, models_dir: Path,
                                                         llama_server: Path) -> None:
    """Another process takes the chosen port before the engine binds it: the engine fails at once, and the
    seat is started again on a new port without a ``fail`` event."""
    import socket

    from fitevict.engines.process import free_port

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    handed = iter([taken])  # the first port handed out is already someone else's
    cfg, cat, store = make(tmp_path, models_dir, llama_server, ram_limit=4 * 1024**3)

    async def scenario() -> None:
        sup = Supervisor(config=cfg, catalog=cat, store=store, engine_binary=llama_server,
                         ports=lambda: next(handed, None) or free_port())
        await sup.start()
        try:
            seat = await sup.load("llama-gqa")
            assert seat.state == "ready" and seat.port != taken
        finally:
            await sup.shutdown()

    try:
        run(scenario)
    finally:
        squatter.close()
    assert store.events(event="fail") == [] and len(store.events(event="load")) == 1
