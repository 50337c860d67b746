"""Two machines sharing one store (a real SQLite file): nothing one of them learned prices the other. Per kind of
learned figure: a file's correction from an accepted load, the engine process overhead raised by loads, and the
transformers seats' own overheads (with and without peft)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fitevict.host.cpu import Cpu
from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.store import Store
from fitevict.store.records import Event
from fitevict.prices.learned import (learn_engine_overhead, learn_torch_overhead, prime_price_book,
                                      torch_overhead_key)
from fitevict.prices.book import PriceBook

CPU_A = Cpu("AMD EPYC 9B14", "x86_64", frozenset({"avx2", "avx512f"}))
CPU_B = Cpu("Intel(R) Xeon(R) Platinum 8481C", "x86_64", frozenset({"avx2", "avx512f", "amx_tile", "amx_int8"}))


@pytest.fixture
def engine_dir(tmp_path: Path) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    (d / "llama-server").write_bytes(b"#!/bin/sh\n")  # the build's identity is its path, size and mtime
    return d


def book(store: Store, engine_dir: Path, cpu: Cpu) -> PriceBook:
    return PriceBook(store, engine_dir, "max-gpu", cpu=cpu)


def load_record(machine: str, model: Path) -> Event:
    """An accepted load's history record as the supervisor writes it (effects: details with machine and file)."""
    st = model.stat()
    measured = {"devices": [{"name": "CPU", "model": {"bytes": 1000, "source": "engine-reported"},
                             "context": {"bytes": 200, "source": "engine-reported"},
                             "compute": {"bytes": 50, "source": "engine-reported"},
                             "output": {"bytes": 10, "source": "engine-reported"}}]}
    details = {"machine": machine, "file": {"path": str(model), "size": st.st_size, "mtime_ns": st.st_mtime_ns},
               "config": LoadConfig(n_ctx=2048).to_json(), "measured": measured, "guard": {"accepted": True}}
    return Event(time=1.0, event="load", model=model.stem, engine="llama-server", details=details)


def test_a_files_correction_prices_only_the_machine_that_learned_it(tmp_path: Path, engine_dir: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    with Store.open(f"sqlite:///{tmp_path / 'shared.db'}") as store:
        a, b = book(store, engine_dir, CPU_A), book(store, engine_dir, CPU_B)
        assert a.machine != b.machine
        store.record_event(load_record(a.machine, model))
        store.record_event(load_record("an-old-record-without-a-machine", model))
        details = [ev.details for ev in store.events(event="load")]
        assert a.learn_history(details) == 1
        assert b.learn_history(details) == 0


def test_overheads_learned_on_one_machine_never_reach_the_other(tmp_path: Path, engine_dir: Path) -> None:
    binary = engine_dir / "llama-server"
    with Store.open(f"sqlite:///{tmp_path / 'shared.db'}") as store:
        a = book(store, engine_dir, CPU_A)

        async def learn() -> None:
            await learn_engine_overhead(a, store, binary, {HOST: 77 << 20})
            await learn_torch_overhead(a, store, 300 << 20)
            await learn_torch_overhead(a, store, 440 << 20, adapters=True)

        asyncio.run(learn())
        again_a, b = book(store, engine_dir, CPU_A), book(store, engine_dir, CPU_B)
        prime_price_book(again_a, store, binary, calibrate=False)
        prime_price_book(b, store, binary, calibrate=False)
        assert (again_a.engine_overhead.get(HOST), again_a.torch_overhead, again_a.peft_overhead) == (
            77 << 20, 300 << 20, 440 << 20)
        assert (b.engine_overhead.get(HOST), b.torch_overhead, b.peft_overhead) == (None, None, None)


def test_a_transformers_overhead_is_keyed_by_torch_s_version_too(tmp_path: Path, engine_dir: Path) -> None:
    """Another torch imports other libraries and holds other sizes: a figure learned under one is not the other's."""
    binary = engine_dir / "llama-server"
    with Store.open(f"sqlite:///{tmp_path / 'shared.db'}") as store:
        a = PriceBook(store, engine_dir, "max-gpu", cpu=CPU_A, torch="2.5.1")

        async def learn() -> None:
            await learn_torch_overhead(a, store, 300 << 20)
            await learn_torch_overhead(a, store, 440 << 20, adapters=True)

        asyncio.run(learn())
        same = PriceBook(store, engine_dir, "max-gpu", cpu=CPU_A, torch="2.5.1")
        other = PriceBook(store, engine_dir, "max-gpu", cpu=CPU_A, torch="2.6.0")
        prime_price_book(same, store, binary, calibrate=False)
        prime_price_book(other, store, binary, calibrate=False)
        assert (same.torch_overhead, same.peft_overhead) == (300 << 20, 440 << 20)
        assert same.torch_origin == f"stored under {torch_overhead_key(cpu=CPU_A, torch='2.5.1')}"
        assert (other.torch_overhead, other.peft_overhead) == (None, None)
        assert "no seat was measured" in other.torch_origin


def test_a_row_stored_under_the_older_key_stays_readable_and_says_so(tmp_path: Path, engine_dir: Path) -> None:
    """A figure stored before torch's version keyed it (``engine-overhead:transformers@CPU``) is read, labelled
    with the older key; a seat measured since stores it under the new one, which wins from then on."""
    binary = engine_dir / "llama-server"
    with Store.open(f"sqlite:///{tmp_path / 'shared.db'}") as store:
        old = torch_overhead_key(cpu=CPU_A, torch="")
        assert "torch" not in old
        store.compute_put(old, {HOST: 250 << 20})
        b = PriceBook(store, engine_dir, "max-gpu", cpu=CPU_A, torch="2.5.1")
        prime_price_book(b, store, binary, calibrate=False)
        assert b.torch_overhead == 250 << 20
        assert b.torch_origin.startswith(f"stored under the older key {old}") and "2.5.1" in b.torch_origin
        asyncio.run(learn_torch_overhead(b, store, 320 << 20))
        again = PriceBook(store, engine_dir, "max-gpu", cpu=CPU_A, torch="2.5.1")
        prime_price_book(again, store, binary, calibrate=False)
        assert again.torch_overhead == 320 << 20 and again.torch_origin.startswith("stored under engine-overhead:")
        assert store.compute_get(old) == {HOST: 250 << 20}  # the older row is left as it was
