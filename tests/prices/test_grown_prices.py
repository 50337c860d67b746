"""What a seat outgrew to joins the next price of its file and configuration, on the machine that saw it only: two
price books of two machines share one store (a real SQLite file) holding one machine's ``outgrew`` event, each prices
the same real GGUF file."""

from __future__ import annotations

import shutil
from pathlib import Path

from fitevict.host.cpu import Cpu
from fitevict.pricing.footprint import HOST
from fitevict.pricing.grown import grown
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.store import Store
from fitevict.store.records import Event
from fitevict.prices.learned import prime_price_book
from fitevict.prices.book import PriceBook
from fitevict.units import MiB

from .test_machine_keys import CPU_A, CPU_B, engine_dir  # noqa: F401 - engine_dir is a fixture

CFG = LoadConfig(n_ctx=2048, n_parallel=1)
AT = 1_796_000_000.0  # 2026-11-30 UTC


def outgrew_record(machine: str, model: Path, price: int, peak: int) -> Event:
    """An outgrew event as ``supervisor.outgrowth`` writes it: its config, machine and what the price book learns."""
    st = model.stat()
    g = grown({HOST: peak}, {HOST: price}, AT)
    assert g is not None
    learned = {**g.to_json(), "file": {"path": str(model), "size": st.st_size, "mtime_ns": st.st_mtime_ns}}
    return Event(time=AT, event="outgrew", model=model.stem, engine="llama-server",
                 details={"machine": machine, "config": CFG.to_json(), "price_learned": learned})


def primed(store: Store, engine_dir: Path, cpu: Cpu) -> PriceBook:
    b = PriceBook(store, engine_dir, "max-gpu", cpu=cpu)
    prime_price_book(b, store, engine_dir / "llama-server", calibrate=False)
    return b


def test_an_outgrowth_prices_its_file_and_configuration_on_its_own_machine_only(zoo: dict, tmp_path: Path,
                                                                                  engine_dir: Path) -> None:
    model = tmp_path / "m.gguf"
    shutil.copyfile(zoo["llama-gqa"].path, model)
    with Store.open(f"sqlite:///{tmp_path / 'shared.db'}") as store:
        a, b = primed(store, engine_dir, CPU_A), primed(store, engine_dir, CPU_B)
        price_a, price_b = a.footprint(model, CFG), b.footprint(model, CFG)
        assert not price_a.grown and not price_b.grown
        store.record_event(outgrew_record(a.machine, model, price_a.bytes_on(HOST), price_a.bytes_on(HOST) + 40 * MiB))

        a, b = primed(store, engine_dir, CPU_A), primed(store, engine_dir, CPU_B)  # as after a restart
        got = a.footprint(model, CFG)
        assert got.bytes_on(HOST) == price_a.bytes_on(HOST) + 40 * MiB  # the peak over the price, in the next price
        assert got.host_committed_bytes == price_a.host_committed_bytes + 40 * MiB  # grown memory is committed
        assert got.grown == ((HOST, 40 * MiB),)
        assert got.grown_from.startswith("learned from the outgrowth at 2026-11-30 ") and got.grown_from in got.notes
        assert got.host_source.endswith("+outgrowth")
        assert b.footprint(model, CFG).bytes_on(HOST) == price_b.bytes_on(HOST)  # another machine's: never
        assert not b.footprint(model, CFG).grown
        other = LoadConfig(n_ctx=1024, n_parallel=1)
        assert not a.footprint(model, other).grown  # another configuration: never


def test_a_changed_file_is_not_priced_with_what_its_old_version_outgrew(zoo: dict, tmp_path: Path,
                                                                         engine_dir: Path) -> None:
    model = tmp_path / "m.gguf"
    shutil.copyfile(zoo["llama-gqa"].path, model)
    with Store.open(f"sqlite:///{tmp_path / 'shared.db'}") as store:
        a = primed(store, engine_dir, CPU_A)
        price = a.footprint(model, CFG).bytes_on(HOST)
        store.record_event(outgrew_record(a.machine, model, price, price + 40 * MiB))
        shutil.copyfile(zoo["llama-tied"].path, model)  # another file in its place
        assert not primed(store, engine_dir, CPU_A).footprint(model, CFG).grown
