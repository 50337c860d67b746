"""A file's parse kept once per path (pricing.perfile): a changed file replaces its parse, not adds to it."""

from __future__ import annotations

import os
from pathlib import Path

from fitevict.pricing import gguf
from fitevict.pricing.perfile import PerFile


def test_a_file_changed_again_and_again_keeps_one_parse(tmp_path: Path) -> None:
    parsed: list[tuple] = []
    cache = PerFile(lambda path, size, mtime: parsed.append((path, size, mtime)) or (size, mtime))
    f = tmp_path / "m.gguf"
    for i in range(50):  # the file rewritten 50 times: each version parsed once, one kept
        st_key = (str(f), i, 1000 + i)
        assert cache(*st_key) == (i, 1000 + i) and cache(*st_key) == (i, 1000 + i)
    assert len(parsed) == 50 and len(cache) == 1
    cache(str(tmp_path / "other.gguf"), 1, 1)
    assert len(cache) == 2


def test_past_its_bound_the_longest_kept_goes_first() -> None:
    cache = PerFile(lambda path, v: (path, v), most=3)
    for name in "abcd":
        cache(name, 0)
    assert len(cache) == 3 and cache("b", 0) == ("b", 0)
    calls: list[str] = []
    probe = PerFile(lambda path, v: calls.append(path) or v, most=3)
    for name in "abcd":
        probe(name, 0)
    probe("a", 0)  # "a" went first: parsed again
    probe("d", 0)  # kept
    assert calls == ["a", "b", "c", "d", "a"]


def test_a_touched_gguf_is_parsed_again_and_held_once(small_zoo: dict[str, Path], tmp_path: Path) -> None:
    zoo_gguf = tmp_path / "m.gguf"
    zoo_gguf.write_bytes(next(iter(small_zoo.values())).read_bytes())
    gguf._cached.cache_clear()
    first = gguf.load_structure(zoo_gguf)
    for i in range(5):
        os.utime(zoo_gguf, ns=(10**18 + i, 10**18 + i))  # touched: a new version of the file
        again = gguf.load_structure(zoo_gguf)
        assert again is not first and again.n_layer == first.n_layer
    assert len(gguf._cached) == 1 and gguf.load_structure(zoo_gguf) is again
