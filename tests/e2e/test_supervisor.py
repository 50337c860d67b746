"""The supervisor against real llama-server processes, a real SQLite store and real /proc memory.

The RAM budget fits two copies of the ~200 MB medium model but not three, so a third load must evict.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from _models import medium_host_bytes
from _supervised import make, run, supervisor
from fitevict.config import load_config
from fitevict.pricing.footprint import HOST
from fitevict.request.catalog import Catalog
from fitevict.store import Store
from fitevict.supervisor import LoadFailed, Refused

pytestmark = pytest.mark.e2e


def test_lru_eviction_releases_memory_and_history_explains(tmp_path: Path, models_dir: Path, llama_server: Path) -> None:
    limit = int(2.5 * medium_host_bytes(models_dir))
    cfg, cat, store = make(tmp_path, models_dir, llama_server, ram_limit=limit, **{"policy.eviction": "lru"})

    async def scenario() -> None:
        sup = supervisor(cfg, cat, store, llama_server)
        await sup.start()
        try:
            for key in ("med-a", "med-b"):
                async with sup.acquire(sup.ask(key)):
                    pass
            a_pid = sup.seats["med-a"].pid
            async with sup.acquire(sup.ask("med-c")) as seat:
                assert seat.state == "ready"
            assert set(sup.seats) == {"med-b", "med-c"}  # least recently used went, and only it
            assert a_pid is not None and not Path(f"/proc/{a_pid}").exists()
        finally:
            await sup.shutdown()

    run(scenario)
    evicts = store.events(event="evict")
    assert [e.model for e in evicts] == ["med-a"]
    ev = evicts[0]
    assert "med-c" in ev.reason  # says for whom
    assert ev.details["release_verified"] is True, ev.details
    assert ev.freed_bytes is not None and ev.freed_bytes > 0
    held = ev.details["held_committed_bytes"]
    assert ev.freed_bytes >= 0.5 * held  # MemAvailable shows the memory back
    loads = store.events(event="load", order="asc")
    assert [e.model for e in loads] == ["med-a", "med-b", "med-c"]
    for e in loads:
        assert e.engine_reported_bytes is not None and e.buffers_predicted_bytes is not None
        assert abs(e.buffers_predicted_bytes - e.engine_reported_bytes) / e.engine_reported_bytes < 0.05
        assert e.predicted_bytes > e.buffers_predicted_bytes  # the whole price: the process's own memory too
        assert e.details["guard"]["accepted"] is True
        assert e.seconds is not None and e.seconds > 0


def test_pinned_model_survives_pressure(tmp_path: Path, models_dir: Path, llama_server: Path) -> None:
    limit = int(2.5 * medium_host_bytes(models_dir))
    cfg, cat, store = make(tmp_path, models_dir, llama_server, ram_limit=limit, toml="[models.med-a]\npin = true\n")

    async def scenario() -> None:
        sup = supervisor(cfg, cat, store, llama_server)
        await sup.start()
        try:
            await sup.load("med-a")  # oldest, but pinned
            await sup.load("med-b")
            await sup.load("med-c")
            assert set(sup.seats) == {"med-a", "med-c"}
        finally:
            await sup.shutdown()

    run(scenario)
    assert [e.model for e in store.events(event="evict")] == ["med-b"]


def test_model_larger_than_budget_is_refused_with_numbers(tmp_path: Path, models_dir: Path, llama_server: Path) -> None:
    limit = int(0.6 * medium_host_bytes(models_dir))
    cfg, cat, store = make(tmp_path, models_dir, llama_server, ram_limit=limit)

    async def scenario() -> None:
        sup = supervisor(cfg, cat, store, llama_server)
        await sup.start()
        try:
            await sup.load("llama-gqa")
            with pytest.raises(Refused) as e:
                await sup.load("med-a")
            assert "med-a" in str(e.value) and "MiB" in str(e.value)
            assert e.value.plan.action == "refuse"
            assert e.value.plan.needed_bytes[HOST] > e.value.plan.available_bytes[HOST]
            assert set(sup.seats) == {"llama-gqa"}  # nothing was evicted for it
        finally:
            await sup.shutdown()

    run(scenario)
    assert store.events(event="evict") == []
    refuse = store.events(event="refuse")
    assert len(refuse) == 1 and refuse[0].model == "med-a" and refuse[0].predicted_bytes


def test_failed_load_records_fail_and_keeps_the_measurement(tmp_path: Path, models_dir: Path, zoo: dict,
                                                            llama_server: Path) -> None:
    import gguf

    own = tmp_path / "own"
    own.mkdir()
    good = zoo["llama-gqa"].path
    shutil.copyfile(good, own / "flaky.gguf")
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path / "data"), "models_dirs": [str(own)]})
    store = Store.open(cfg.store_url)
    cat = Catalog.from_config(cfg)

    async def scenario() -> None:
        sup = supervisor(cfg, cat, store, llama_server)
        await sup.start()
        try:
            seat = await sup.load("flaky")
            good_sig = seat.signature
            await sup.unload("flaky")
            before = store.last_measurement(good_sig)
            assert before is not None
            # Replace the file with one whose header is valid but which lacks a tensor llama.cpp needs.
            r = gguf.GGUFReader(good)
            w = gguf.GGUFWriter(own / "flaky.tmp", arch="llama")
            for field in r.fields.values():
                if field.name.startswith("GGUF.") or field.name == "general.architecture":
                    continue
                w.add_key_value(field.name, field.contents(), field.types[0],
                                field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
            for t in r.tensors:
                if t.name != "blk.0.attn_q.weight":
                    w.add_tensor(t.name, t.data, raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            os.replace(own / "flaky.tmp", own / "flaky.gguf")
            with pytest.raises(LoadFailed) as e:
                await sup.load("flaky")
            assert "flaky" in str(e.value)
            assert "flaky" not in sup.seats
            assert store.last_measurement(good_sig) == before  # the good measurement is intact
        finally:
            await sup.shutdown()

    run(scenario)
    fails = store.events(event="fail")
    assert len(fails) == 1 and fails[0].model == "flaky" and fails[0].engine_reported_bytes is None
    assert "exited" in fails[0].reason


def test_guard_rejects_a_collapsed_measurement_of_the_same_signature(tmp_path: Path, models_dir: Path,
                                                                   llama_server: Path) -> None:
    """The same file and configuration loaded again, through an engine whose log reports almost nothing: the
    guard refuses to store it (its own ``reject`` event, naming the check), and the good measurement stays."""
    wrapped = tmp_path / "engine" / "llama-server"
    wrapped.parent.mkdir()
    wrapped.write_text(f"#!/bin/sh\n{llama_server} \"$@\" 2>&1 | sed -u 's/buffer size = *[0-9.]*/buffer size = 0.01/'\n")
    wrapped.chmod(0o755)
    # it claims to be the same engine build (its install record beside it, naming this very file as the one
    # installed), so its loads get the same signature
    stamp = json.loads((llama_server.parent / "INSTALLED.json").read_text())
    st = wrapped.stat()
    stamp["files"] = {**stamp.get("files", {}), wrapped.name: {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}}
    (wrapped.parent / "INSTALLED.json").write_text(json.dumps(stamp))
    cfg, cat, store = make(tmp_path, models_dir, llama_server, ram_limit=4 * 1024**3)

    async def scenario() -> tuple[str, object]:
        sup = supervisor(cfg, cat, store, llama_server)
        await sup.start()
        try:
            sig = (await sup.load("llama-gqa")).signature
        finally:
            await sup.shutdown()
        good = store.last_measurement(sig)
        liar = supervisor(cfg, cat, store, wrapped)
        await liar.start()
        try:
            seat = await liar.load("llama-gqa")
            assert seat.signature == sig  # the very same signature: only the guard stands between
        finally:
            await liar.shutdown()
        return sig, good

    sig, good = run(scenario)
    assert good is not None and store.last_measurement(sig) == good
    rejects = store.events(event="reject")
    assert len(rejects) == 1 and rejects[0].model == "llama-gqa"
    assert rejects[0].details["guard"]["accepted"] is False
    assert rejects[0].details["guard"]["check"] in ("implausible", "collapse")
    assert rejects[0].details["guard"]["check"] in rejects[0].reason
    assert [e.model for e in store.events(event="load")] == ["llama-gqa"]  # the first load only


def test_idle_unload_fires_only_after_use(tmp_path: Path, models_dir: Path, llama_server: Path) -> None:
    cfg, cat, store = make(tmp_path, models_dir, llama_server, ram_limit=4 * 1024**3,
                           toml="[models.med-a]\npin = true\n", **{"policy.idle_unload_seconds": 1.0})

    async def scenario() -> None:
        sup = supervisor(cfg, cat, store, llama_server)
        await sup.start()
        try:
            await sup.load("llama-q8_0")  # loaded, never used: left alone
            async with sup.acquire(sup.ask("med-a")):  # used but pinned: left alone
                pass
            async with sup.acquire(sup.ask("llama-gqa")):
                pass
            ev = await sup.wait_for_event(lambda e: e.event == "idle-unload", timeout=30)
            assert ev.model == "llama-gqa" and "idle" in ev.reason
            assert "llama-gqa" not in sup.seats
            assert {"llama-q8_0", "med-a"} <= set(sup.seats)
            assert sup.scheduler.seats["llama-q8_0"].last_used is None
        finally:
            await sup.shutdown()

    run(scenario)
    assert [e.model for e in store.events(event="idle-unload")] == ["llama-gqa"]


def test_queued_requests_get_the_seat_loaded_for_them(tmp_path: Path, models_dir: Path, llama_server: Path) -> None:
    """Budget fits one medium; requests for two models arrive together. Each request must be served by a
    live seat of its model: a seat loaded for queued requests is not evicted before they use it."""
    import httpx

    cfg, cat, store = make(tmp_path, models_dir, llama_server, ram_limit=int(1.5 * medium_host_bytes(models_dir)))

    async def scenario() -> list[tuple[str, int]]:
        sup = supervisor(cfg, cat, store, llama_server)
        await sup.start()
        served: list[tuple[str, int]] = []

        async def one(key: str) -> None:
            async with sup.acquire(sup.ask(key)) as seat, httpx.AsyncClient() as c:
                assert seat.key == key and seat.state == "ready"
                r = await c.get(seat.base_url + "/health")
                served.append((key, r.status_code))

        try:
            await asyncio.gather(*(one(k) for k in ["med-a", "med-b"] * 3))
        finally:
            await sup.shutdown()
        return served

    served = run(scenario)
    assert sorted(served) == sorted([("med-a", 200), ("med-b", 200)] * 3)
    loads = store.events(event="load")
    evicts = store.events(event="evict")
    assert len(loads) == len(evicts) + 1  # every load but the last was evicted: never two at once


def test_contended_swaps_under_a_budget_for_one_lose_nothing(tmp_path: Path, models_dir: Path,
                                                             llama_server: Path) -> None:
    """Six clients, three models, room for one: every request is served by its own model's live seat, no
    two mediums are ever resident together, and new requests for a model being drained queue behind the
    swap instead of starving it."""
    import httpx

    cfg, cat, store = make(tmp_path, models_dir, llama_server, ram_limit=int(1.5 * medium_host_bytes(models_dir)))

    async def scenario() -> list[str]:
        sup = supervisor(cfg, cat, store, llama_server)
        await sup.start()
        served: list[str] = []
        most_resident = 0

        async def client(i: int) -> None:
            nonlocal most_resident
            async with httpx.AsyncClient(timeout=60) as c:
                for j in range(2):
                    key = ["med-a", "med-b", "med-c"][(i + j) % 3]
                    async with sup.acquire(sup.ask(key)) as seat:
                        most_resident = max(most_resident, sum(s.state == "ready" for s in sup.seats.values()))
                        r = await c.post(seat.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
                        assert r.status_code == 200
                        served.append(key)

        try:
            await asyncio.gather(*(client(i) for i in range(6)))
        finally:
            await sup.shutdown()
        assert most_resident == 1
        return served

    served = run(scenario)
    assert sorted(served) == sorted(["med-a", "med-b", "med-c"] * 4)
    for e in store.events(event="evict"):
        assert e.details["release_verified"] is True


def test_an_architecture_without_rules_is_priced_by_the_dry_run_and_loads(tmp_path: Path, zoo: dict,
                                                                           llama_server: Path) -> None:
    """xverse is in llama.cpp but has no KV rules in fitevict: the supervisor prices its context from the
    engine's own dry run instead of refusing, and the price matches what the engine then allocates."""
    from fitevict.zoo import rewrite_arch

    own = tmp_path / "own"
    own.mkdir()
    rewrite_arch(zoo["llama-gqa"].path, own / "xv.gguf", "xverse")
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path / "data"), "models_dirs": [str(own)]})
    store = Store.open(cfg.store_url)

    async def scenario() -> None:
        sup = supervisor(cfg, Catalog.from_config(cfg), store, llama_server)
        await sup.start()
        try:
            seat = await sup.load("xv")
            cpu = seat.predicted.device(HOST)
            assert cpu.context.source == "dry-run" and cpu.compute.source == "dry-run"
            measured = seat.measured.device(HOST)
            assert abs(cpu.context.bytes - measured.context.bytes) <= 10 * 1024  # the log prints 2-decimal MiB
        finally:
            await sup.shutdown()

    run(scenario)


def test_concurrent_requests_for_a_loading_model_share_one_load(tmp_path: Path, models_dir: Path,
                                                                llama_server: Path) -> None:
    cfg, cat, store = make(tmp_path, models_dir, llama_server, ram_limit=4 * 1024**3)

    async def scenario() -> set[int | None]:
        sup = supervisor(cfg, cat, store, llama_server)
        await sup.start()
        pids: set[int | None] = set()

        async def one() -> None:
            async with sup.acquire(sup.ask("med-a")) as seat:
                pids.add(seat.pid)

        try:
            await asyncio.gather(*(one() for _ in range(5)))
        finally:
            await sup.shutdown()
        return pids

    assert len(run(scenario)) == 1
    assert len(store.events(event="load")) == 1
