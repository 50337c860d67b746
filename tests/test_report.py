"""The memory report's rules: thresholds declared in a file, PASS / FAIL / BLOCKED / UNDECLARED, windows measured
before the declaration not judged, and the A/B call only above the leg-to-leg noise floor."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fitevict.report import ThresholdsError, compare, judge, legs, load_thresholds, markdown, report_rows
from fitevict.store.peaks import SeatPeaks
from fitevict.units import MiB

NO_GPU = "unavailable, because no NVIDIA GPU: NVML Shared Library Not Found"


def window(model: str, start: float, pss: int, *, kv: str = "f16", drop: int = 10 * MiB,
           gpu: int | None = None) -> SeatPeaks:
    reasons = {} if gpu is not None else {"peak_gpu_bytes": NO_GPU}
    return SeatPeaks(seat_id=f"{model}{start}", model=model, engine="llama-server",
                     config={"cache_type_k": kv, "flash_attn": True}, started_at=start, ended_at=start + 1,
                     samples=5, peak_pss_bytes=pss, peak_rss_bytes=pss + MiB, peak_gpu_bytes=gpu,
                     peak_available_drop_bytes=drop, baseline_available_bytes=8000 * MiB,
                     details={"sources": {"pss": "smaps_rollup", "rss": "smaps_rollup", "gpu": "nvml",
                                          "available_drop": "meminfo"}, "reasons": reasons, "other_seats": 0})


@pytest.fixture()
def declared(tmp_path: Path):
    path = tmp_path / "thresholds.toml"
    path.write_text('[default]\npeak_pss = "300MiB"\npeak_rss = "1GiB"\npeak_gpu = "1GiB"\n'
                    '[models.big]\npeak_pss = "1GiB"\n')
    os.utime(path, (1000.0, 1000.0))  # declared at t = 1000
    return load_thresholds(path)


def test_judge_is_the_one_rule() -> None:
    assert judge(None, 5) == "BLOCKED" and judge(5, None) == "UNDECLARED"
    assert judge(5, 5) == "PASS" and judge(6, 5) == "FAIL"


def test_rows_beside_declared_thresholds(declared) -> None:
    ws = [window("small", 1001, 200 * MiB), window("small", 1005, 310 * MiB), window("big", 1002, 900 * MiB)]
    rows = {(r.model, r.figure): r for r in report_rows(ws, declared)}
    assert rows[("small", "peak_pss")].peak_bytes == 310 * MiB and rows[("small", "peak_pss")].result == "FAIL"
    assert rows[("small", "peak_pss")].windows == 2
    assert rows[("big", "peak_pss")].result == "PASS"  # its own threshold wins over the default
    gpu = rows[("big", "peak_gpu")]
    assert gpu.result == "BLOCKED" and gpu.peak_bytes is None and gpu.why == NO_GPU
    assert rows[("big", "peak_available_drop")].result == "UNDECLARED"
    md = markdown(list(rows.values()), declared)
    assert "| small | llama-server | peak PSS | 310 MiB | 300 MiB | **FAIL** |" in md
    assert "| big | llama-server | peak GPU | BLOCKED | 1.00 GiB | **BLOCKED** | unavailable, because no NVIDIA" in md


def test_windows_before_the_declaration_are_not_judged(declared) -> None:
    rows = report_rows([window("small", 999, 10 * MiB), window("late", 1500, 10 * MiB)], declared)
    early = [r for r in rows if r.model == "small"]
    assert {r.result for r in early} == {"BLOCKED"} and all("before the thresholds" in r.why for r in early)
    assert next(r for r in rows if r.model == "late" and r.figure == "peak_pss").result == "PASS"


def test_a_bad_thresholds_file_names_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "t.toml"
    bad.write_text('[default]\npeak_vram = "1GiB"\n')
    with pytest.raises(ThresholdsError, match="peak_vram: unknown figure; allowed: peak_pss"):
        load_thresholds(bad)


def test_ab_calls_a_difference_only_above_the_noise_floor() -> None:
    ws = [window("m", 1, 100 * MiB, kv="q8_0"), window("m", 2, 140 * MiB, kv="f16"),
          window("m", 3, 141 * MiB, kv="f16"), window("m", 4, 102 * MiB, kv="q8_0", drop=50 * MiB),
          window("other", 5, 1, kv="f16")]
    pairs = legs(ws, "m", {"cache_type_k": "q8_0"}, {"cache_type_k": "f16"})
    assert "".join(leg for leg, _ in pairs) == "ABBA"
    comps = {c.figure: c for c in compare(pairs)}
    pss = comps["peak_pss"]
    assert pss.noise_floor_bytes == 2 * MiB and pss.difference_bytes == round(39.5 * MiB)
    assert pss.verdict == "B higher"
    drop = comps["peak_available_drop"]  # A legs 10 and 50 MiB apart, B legs the same: nothing to call
    assert drop.noise_floor_bytes == 40 * MiB and drop.verdict == "no difference above the noise floor"
    assert comps["peak_gpu"].verdict == "BLOCKED" and comps["peak_gpu"].why == NO_GPU
    few = compare(pairs[:3])
    assert few[0].verdict == "BLOCKED" and "at least 2 legs" in few[0].why
