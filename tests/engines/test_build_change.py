"""An installed engine build stays that build only while its binary is the file the install recorded: a file put in
its place, or rewritten, is another build (another machine key: nothing learned of the old one is trusted for it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fitevict.engines.llama_cpp.install import STAMP
from fitevict.engines.llama_cpp.machine import build_report, engine_build


def installed(tmp: Path, *, with_files: bool) -> Path:
    binary = tmp / "llama-server"
    binary.write_bytes(b"\x7fELF one build")
    st = binary.stat()
    stamp = {"llama_cpp_commit": "abc1234", "variant": "cpu", "installed_at": st.st_mtime + 5,
             "version_output": "version: 1 (build 1, commit abc1234)\nbuilt with cc"}
    if with_files:
        stamp["files"] = {"llama-server": {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}}
    (tmp / STAMP).write_text(json.dumps(stamp))
    return binary


def test_a_binary_modified_after_its_install_is_another_build(tmp_path: Path) -> None:
    binary = installed(tmp_path, with_files=False)
    assert engine_build(binary).startswith("llama.cpp-abc1234-cpu-")
    assert build_report(binary)["changed"] is None
    later = binary.stat().st_mtime + 60
    os.utime(binary, (later, later))  # rewritten after the install
    assert not engine_build(binary).startswith("llama.cpp-abc1234")
    report = build_report(binary)
    assert report["recorded"]["version"] == ["version: 1 (build 1, commit abc1234)"]
    assert f"{binary} was modified after its install" in report["changed"]


def test_a_binary_of_another_size_than_recorded_is_another_build(tmp_path: Path) -> None:
    binary = installed(tmp_path, with_files=True)
    assert engine_build(binary).startswith("llama.cpp-abc1234-cpu-")
    st = binary.stat()
    binary.write_bytes(b"\x7fELF another build, longer")
    os.utime(binary, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same time: only its size tells
    assert not engine_build(binary).startswith("llama.cpp-abc1234")
    assert "is not the installed file" in build_report(binary)["changed"]
