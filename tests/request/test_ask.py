"""What a request asks of a seat (request.ask): built once from the entry, the contract and what the price book
says of the file, and kept while those stand."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fitevict.config import ModelConfig
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.request.ask import Asks, ask
from fitevict.request.catalog import CatalogEntry
from fitevict.request.contract import Contract


@dataclass
class Shape:
    n_layer: int = 32
    is_moe: bool = False
    n_ctx_train: int = 8192


@dataclass
class Book:
    """The Shapes port as a recording fake: what was read, and a version the test moves."""

    default_alloc_mode: str = "max-gpu"
    version: int = 0
    no_repack: set[Path] = field(default_factory=set)
    reads: list[str] = field(default_factory=list)

    def shape(self, path: Path) -> Shape:
        self.reads.append("shape")
        return Shape()

    def context(self, path: Path, cfg: LoadConfig) -> int:
        self.reads.append("context")
        return 8192

    def repacks(self, path: Path) -> bool:
        return path not in self.no_repack


def entry(tmp_path: Path, **settings) -> CatalogEntry:
    (tmp_path / "m.gguf").touch()
    (tmp_path / "m-q8.gguf").touch()
    return CatalogEntry(key="m", path=tmp_path / "m.gguf", engine="llama-server", aliases=(), pinned=False,
                        file_bytes=0, settings=ModelConfig(key="m", **settings), mmproj=None,
                        gguf_files=("m.gguf", "m-q8.gguf"), model_dir=tmp_path)


def test_the_ask_carries_the_config_the_file_and_what_the_contract_fixes(tmp_path: Path) -> None:
    e, book = entry(tmp_path), Book()
    a = ask(e, Contract(ctx=2048, parallel=2), book)
    assert (a.key, a.path, a.request.config.n_ctx, a.request.config.n_parallel) == ("m", e.path, 2048, 2)
    assert a.request.n_layer == 33 and a.request.n_ctx_train == 8192  # the output pseudo-layer counted
    assert a.request.fixed == frozenset({"n_ctx", "n_parallel"}) and a.request.source == ""  # any file serves it
    named = ask(e, Contract(gguf_file="m-q8.gguf"), book)
    assert named.path == tmp_path / "m-q8.gguf" and named.request.source == str((tmp_path / "m-q8.gguf").resolve())


def test_a_zero_context_is_the_models_own_and_a_crashed_repack_is_off(tmp_path: Path) -> None:
    e, book = entry(tmp_path), Book()
    assert ask(e, None, book).request.config.n_ctx == 4096 and "context" not in book.reads
    assert ask(e, Contract(ctx=0), book).request.config.n_ctx == 8192 and "context" in book.reads
    assert ask(e, None, book).request.config.repack is True
    book.no_repack.add(e.path)
    assert ask(e, None, book).request.config.repack is False


def test_asks_are_kept_while_the_book_and_the_entry_stand(tmp_path: Path) -> None:
    e, book = entry(tmp_path), Book()
    asks = Asks(book)
    first = asks(e, Contract(ctx=2048))
    assert asks(e, Contract(ctx=2048)) is first and book.reads.count("shape") == 1
    assert asks(e, Contract(ctx=4096)) is not first  # another contract, another ask
    book.version += 1  # the book learned something (a rescan, a crash, a file read again)
    again = asks(e, Contract(ctx=2048))
    assert again is not first and again == first
    assert asks(e, None).request.config.repack is True
    book.no_repack.add(e.path)
    assert asks(e, None).request.config.repack is True  # the book did not say it changed: still the kept answer
    book.version += 1
    assert asks(e, None).request.config.repack is False
    rescanned = entry(tmp_path, ctx=1024)  # the same key, a new entry (its settings changed)
    assert asks(rescanned, None).request.config.n_ctx == 1024
