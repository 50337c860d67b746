"""Saved prompts on disk: the slot file's tokens, the choice of the longest shared prefix, the disk budget, and a
newer prompt replacing one it extends. The files are written in the pinned llama-server's layout."""

from __future__ import annotations

import json
import struct
from dataclasses import asdict
from pathlib import Path

import pytest

from fitevict.engines.llama_cpp.slotfile import SlotFileError, read_tokens
from fitevict.supervisor.kvkeep import (PromptKeep, Restored, SavedPrompt, common_prefix, engine_seconds,
                                        restore_effect, timing_source)


def slot_file(path: Path, tokens: list[int], *, packed: bool = True, state: bytes = b"\0" * 64) -> Path:
    words = [-1, 1, len(tokens), *tokens, 0] if packed else tokens
    path.write_bytes(struct.pack("<III", 0x67677371, 3, len(words)) + struct.pack(f"<{len(words)}i", *words) + state)
    return path


def saved(keep: PromptKeep, name: str, tokens: list[int], *, sig: str = "sig", at: float = 0.0,
          size: int = 100) -> SavedPrompt:
    slot_file(keep.root / name, tokens)
    s = SavedPrompt(file=name, model="m", signature=sig, engine="build@cpu", tokens=len(tokens), bytes=size,
                    saved_at=at, save_seconds=0.01, prompt_per_second=500.0)
    (keep.root / f"{name}.json").write_text(json.dumps(asdict(s)))
    return s


def test_tokens_are_read_from_both_layouts(tmp_path: Path) -> None:
    assert read_tokens(slot_file(tmp_path / "a", [1, 5, 9])) == [1, 5, 9]
    assert read_tokens(slot_file(tmp_path / "b", [1, 5, 9], packed=False)) == [1, 5, 9]
    (tmp_path / "c").write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(SlotFileError, match="not a llama-server slot file"):
        read_tokens(tmp_path / "c")
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2 and common_prefix([1], []) == 0


def test_the_longest_shared_prefix_wins_and_short_ones_do_not_count(tmp_path: Path) -> None:
    keep = PromptKeep(tmp_path, min_tokens=8, disk_budget=10_000)
    system = list(range(100, 120))
    a = saved(keep, "a.bin", [*system[:6], 1, 2])  # shares 6
    b = saved(keep, "b.bin", [*system, 7, 7])  # shares 20
    c = saved(keep, "c.bin", [9, 9, 9, 9, 9])  # shares nothing
    request = [*system, 3, 3, 3]
    assert keep.best([a, b, c], request) == (b, 20)
    assert keep.best([a], request) == (a, 6)  # 6 >= half of min_tokens
    assert keep.best([a], [*system[:3], 0]) is None  # 3 < 4


def test_an_unreadable_saved_prompt_is_dropped_not_used(tmp_path: Path) -> None:
    keep = PromptKeep(tmp_path, min_tokens=2, disk_budget=10_000)
    bad = saved(keep, "bad.bin", [1, 2, 3])
    (tmp_path / "bad.bin").write_bytes(b"junk")
    assert keep.best([bad], [1, 2, 3]) is None
    assert keep.index() == []


def test_matching_is_by_signature_and_a_record_without_its_file_goes(tmp_path: Path) -> None:
    keep = PromptKeep(tmp_path, min_tokens=2, disk_budget=10_000)
    saved(keep, "a.bin", [1, 2], sig="one")
    saved(keep, "b.bin", [1, 2], sig="two")
    assert [s.file for s in keep.matching("one")] == ["a.bin"]
    (tmp_path / "b.bin").unlink()
    assert [s.file for s in keep.index()] == ["a.bin"] and not (tmp_path / "b.bin.json").exists()


def test_the_disk_budget_drops_the_oldest_and_a_newer_prompt_replaces_one_it_extends(tmp_path: Path) -> None:
    keep = PromptKeep(tmp_path, min_tokens=2, disk_budget=250)
    saved(keep, "old.bin", [5, 5], sig="x", at=1.0)
    saved(keep, "mid.bin", [6, 6], sig="y", at=2.0)
    new = saved(keep, "new.bin", [7, 7], sig="z", at=3.0)
    assert keep._fit(new)
    assert sorted(s.file for s in keep.index()) == ["mid.bin", "new.bin"]
    longer = saved(keep, "longer.bin", [6, 6, 8], sig="y", at=4.0)
    keep._file(longer)  # extends mid.bin's prompt under the same signature: mid goes
    assert sorted(s.file for s in keep.index()) == ["longer.bin", "new.bin"]
    huge = saved(keep, "huge.bin", [1, 1], sig="w", at=5.0, size=1000)
    assert not keep._fit(huge)  # larger than the whole budget: dropped, and nothing else for it
    assert sorted(s.file for s in keep.index()) == ["longer.bin", "new.bin"]


def test_a_timing_the_engine_did_not_send_is_none_with_its_reason_never_zero() -> None:
    assert engine_seconds({"n_saved": 10, "timings": {"save_ms": 6.7}}, "save_ms") == pytest.approx(0.0067)
    assert engine_seconds({"n_restored": 10, "timings": {"restore_ms": 0}}, "restore_ms") == 0.0  # sent: 0 ms
    for doc in ({"n_restored": 10}, {"n_restored": 10, "timings": {}}, {"timings": None}):
        assert engine_seconds(doc, "restore_ms") is None
    r = Restored(file="f", slot=0, shared_tokens=100, prompt_tokens=120, kv_restored_tokens=100,
                 kv_restore_seconds=None,
                 prefill_seconds_saved=None)
    assert r.to_json()["kv_restore_seconds"] is None
    assert r.to_json()["sources"]["kv_restore_seconds"] == ("unavailable, because the engine's answer had no "
                                                            "timings.restore_ms")
    assert timing_source(0.005, "save_ms") == "measured by the engine: timings.save_ms"


def test_a_restore_without_cache_n_is_judged_by_prompt_n_and_without_either_is_unknown() -> None:
    """An engine that sends ``prompt_n`` alone: the prompt's tokens beyond the shared prefix may be processed, any more
    were restored tokens processed again; with no timings the effect is unknown, never assumed."""
    r = Restored(file="f", slot=0, shared_tokens=500, prompt_tokens=520, kv_restored_tokens=510,
                 kv_restore_seconds=0.001, prefill_seconds_saved=None)
    kept, lost = restore_effect(r, {"prompt_n": 21}), restore_effect(r, {"prompt_n": 520})
    assert kept["effective"] is True and kept["reprocessed_tokens"] == 1
    assert lost["effective"] is False and lost["reprocessed_tokens"] == 500 and "not effective" in lost["effect"]
    assert "prompt_n" in lost["reprocessed_source"]
    unknown = restore_effect(r, {})
    assert unknown["effective"] is None and unknown["effect"].startswith("unavailable, because")


def test_a_failed_save_before_a_stop_names_its_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A seat that breaks the connection mid-save: the log and the stop's notes name the error's type, since its
    text may say nothing (the soak's log read "saving its prompts before the stop failed: " and no more). A real
    prompt keep against a loopback socket that accepts and closes without an answer."""
    import asyncio
    import socket
    import threading
    from types import SimpleNamespace

    from fitevict.supervisor.kvkeep import keep_before_stop

    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def hang_up() -> None:
        with srv:
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    keep = PromptKeep(tmp_path / "kv", min_tokens=1, disk_budget=2**20)
    seat = SimpleNamespace(engine="llama-server", port=port, key="m", signature="sig",
                           timings=SimpleNamespace(bulk_prefill_rate=lambda: None))
    try:
        with caplog.at_level("WARNING", logger="fitevict.kvkeep"):
            details = asyncio.run(keep_before_stop(keep, seat, "evict", enabled=True, machine="x", clock=lambda: 0.0))
    finally:
        srv.close()
    import httpx

    note = details["kv_save_notes"][0]
    assert details["kv_saved"] == [] and note.startswith("saving failed: "), note
    named = note.removeprefix("saving failed: ").split(":")[0]  # ReadError or RemoteProtocolError, as the close races
    assert issubclass(getattr(httpx, named, type(None)), httpx.TransportError), note
    assert f"m: saving its prompts before the stop failed: {named}" in caplog.text
