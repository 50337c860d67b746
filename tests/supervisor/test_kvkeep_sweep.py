"""Saved prompts a killed front door left half done are removed at start (``PromptKeep.sweep``): a slot file without
its record, one whose size is not what its record says the engine wrote, a record that cannot be read, a record
half written; a whole save (file and record agreeing) is kept and still listed."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from fitevict.supervisor.kvkeep import PromptKeep, SavedPrompt


def save(root: Path, name: str, written: int, on_disk: int) -> None:
    (root / name).write_bytes(b"\x01" * on_disk)
    record = SavedPrompt(file=name, model="m", signature="sig", engine="e", tokens=10, bytes=written, saved_at=1.0,
                         save_seconds=None, prompt_per_second=None)
    (root / f"{name}.json").write_text(json.dumps(asdict(record)))


def test_sweep_keeps_whole_saves_and_removes_what_a_cut_save_left(tmp_path: Path) -> None:
    keep = PromptKeep(tmp_path, min_tokens=1, disk_budget=1 << 30)
    save(tmp_path, "whole.bin", 100, 100)
    save(tmp_path, "short.bin", 100, 4)  # the engine killed after 4 bytes, the record from an earlier save
    (tmp_path / "orphan.bin").write_bytes(b"\x01" * 4)  # the save cut before its record was written
    (tmp_path / "garbled.bin.json").write_text('{"file": "garb')
    (tmp_path / "half.bin.json.tmp").write_text("{")
    removed = dict(keep.sweep())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["whole.bin", "whole.bin.json"]
    assert set(removed) == {"short.bin", "short.bin.json", "orphan.bin", "garbled.bin.json", "half.bin.json.tmp"}
    assert "4 bytes, its record says 100" in removed["short.bin.json"]
    assert [s.file for s in keep.index()] == ["whole.bin"]
    assert keep.sweep() == []  # nothing left to remove

