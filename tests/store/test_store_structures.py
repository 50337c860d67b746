"""GGUF structures kept in the store: a file parsed once per change, across processes, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fitevict.pricing import gguf
from fitevict.pricing.gguf import file_key, load_structure, parse_structure, use_shelf
from fitevict.store import Store
from fitevict.store.structures import StoredStructures, structure_from_json, structure_to_json

MODELS = ("llama-gqa", "llama-moe", "gemma2-swa", "mamba", "deci-kvarray", "llama-q4_0")


@pytest.fixture(scope="module")
def few(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from fitevict.zoo import write_zoo

    return {m.name: Path(m.path) for m in write_zoo(tmp_path_factory.mktemp("structures"), only=MODELS)}


def test_every_structure_survives_its_json(few: dict[str, Path]) -> None:
    for p in few.values():
        s = parse_structure(p)
        assert structure_from_json(structure_to_json(s)) == s


def settle(shelf: StoredStructures) -> None:
    for fut in list(shelf.pending):
        fut.result(timeout=30)


def test_a_file_parsed_in_one_process_is_read_from_the_store_in_the_next(store: Store, few: dict[str, Path],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    first = StoredStructures(store, host="host-a")
    stop = use_shelf(first)
    try:
        parsed = {name: load_structure(p) for name, p in few.items()}
        settle(first)
    finally:
        stop()
    # the next process: nothing in memory, the store read ahead; parsing is made impossible to prove it is not needed
    second = StoredStructures(store, host="host-a")
    assert second.preload() == len(few)
    monkeypatch.setattr(gguf, "parse_structure", lambda path: pytest.fail(f"{path} was parsed again"))
    stop = use_shelf(second)
    try:
        assert {name: load_structure(p) for name, p in few.items()} == parsed
    finally:
        stop()


def test_a_changed_file_another_host_or_another_parser_is_parsed_again(store: Store, few: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    src = few["llama-gqa"]
    p = tmp_path / "model.gguf"
    p.write_bytes(src.read_bytes())
    shelf = StoredStructures(store, host="host-a")
    shelf.put(file_key(p), parse_structure(p))
    settle(shelf)
    again = StoredStructures(store, host="host-a")
    again.preload()
    assert again.get(file_key(p)) == parse_structure(p)
    os.utime(p, ns=(1, 1))  # the same bytes, another mtime: another file as far as the key goes
    assert again.get(file_key(p)) is None
    other = StoredStructures(store, host="host-b")
    assert other.preload() == 0
    assert other.get(file_key(src)) is None


def test_a_closed_store_costs_a_parse_not_an_error(tmp_path: Path, few: dict[str, Path]) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'closed.db'}")
    shelf = StoredStructures(store, host="h")
    store.close()
    s = parse_structure(few["mamba"])
    shelf.put(file_key(few["mamba"]), s)  # logged, not raised: this process keeps its copy
    assert shelf.get(file_key(few["mamba"])) == s
