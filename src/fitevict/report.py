"""The memory report: each model's peaks over its serving windows beside thresholds declared before the run.

Stored windows (``SeatPeaks``) and a thresholds declaration in, rows out; no I/O beyond reading the
thresholds file in :func:`load_thresholds`.

Every figure is judged PASS (peak <= threshold) or FAIL; a figure this host could not measure is BLOCKED with the
reason, never a number; a figure without a declared threshold is UNDECLARED. Windows that started before the
thresholds file was last written are not judged (BLOCKED: the numbers existed before the thresholds did).

The A/B mode (:func:`compare`) takes the swapped legs of one model under two configurations (for example
``cache_type_k=q8_0`` against ``f16``, loaded A B B A) and calls a difference only above the noise floor: the
largest leg-to-leg spread within either configuration.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fitevict.store.peaks import PEAK_FIELDS, SeatPeaks
from fitevict.units import SizeError, format_size, parse_size

FIGURES: dict[str, str] = {  # the name in a thresholds file and in the report -> the SeatPeaks field
    "peak_pss": "peak_pss_bytes",
    "peak_rss": "peak_rss_bytes",
    "peak_gpu": "peak_gpu_bytes",
    "peak_available_drop": "peak_available_drop_bytes",
}
LABELS: dict[str, str] = {"peak_pss": "peak PSS", "peak_rss": "peak RSS", "peak_gpu": "peak GPU",
                          "peak_available_drop": "peak MemAvailable drop"}
assert set(FIGURES.values()) == set(PEAK_FIELDS)


class ThresholdsError(ValueError):
    """A thresholds file that cannot be used: names the file, the key and what is allowed."""


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Declared limits: ``default[figure]`` and ``models[model][figure]`` in bytes; declared at ``declared_at``."""

    path: str
    sha256: str
    declared_at: float  # the file's modification time: the thresholds exist from then on
    default: Mapping[str, int]
    models: Mapping[str, Mapping[str, int]]

    def limit(self, model: str, figure: str) -> int | None:
        return self.models.get(model, {}).get(figure, self.default.get(figure))


def _limits(table: Any, where: str) -> dict[str, int]:
    if not isinstance(table, dict):
        raise ThresholdsError(f"{where} must be a table of {', '.join(FIGURES)} = SIZE")
    out: dict[str, int] = {}
    for k, v in table.items():
        if k not in FIGURES:
            raise ThresholdsError(f"{where}.{k}: unknown figure; allowed: {', '.join(FIGURES)}")
        try:
            out[k] = parse_size(v, name=f"{where}.{k}")
        except SizeError as e:
            raise ThresholdsError(str(e)) from None
    return out


def load_thresholds(path: Path) -> Thresholds:
    """Read a thresholds file (TOML: ``[default]`` and ``[models.NAME]`` tables of figure = size)."""
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ThresholdsError(f"thresholds file {path}: {e}") from None
    unknown = set(data) - {"default", "models"}
    if unknown:
        raise ThresholdsError(f"thresholds file {path}: unknown table(s) {sorted(unknown)}; allowed: default, models")
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise ThresholdsError(f"thresholds file {path}: [models] must hold one table per model")
    return Thresholds(str(path), hashlib.sha256(raw).hexdigest(), path.stat().st_mtime,
                      _limits(data.get("default", {}), f"{path} [default]"),
                      {m: _limits(t, f"{path} [models.{m}]") for m, t in models.items()})


@dataclass(frozen=True, slots=True)
class Row:
    """One figure of one model and engine."""

    model: str
    engine: str
    figure: str  # a key of FIGURES
    peak_bytes: int | None  # None: BLOCKED, see ``why``
    threshold_bytes: int | None
    result: str  # PASS, FAIL, BLOCKED, UNDECLARED
    why: str  # the reason for BLOCKED, the sources and window count otherwise
    windows: int

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "engine": self.engine, "figure": self.figure, "peak_bytes": self.peak_bytes,
                "threshold_bytes": self.threshold_bytes, "result": self.result, "why": self.why,
                "windows": self.windows}


def judge(peak: int | None, limit: int | None) -> str:
    """The one rule: BLOCKED without a measurement, UNDECLARED without a threshold, PASS at or below it."""
    if peak is None:
        return "BLOCKED"
    if limit is None:
        return "UNDECLARED"
    return "PASS" if peak <= limit else "FAIL"


def _figure_row(model: str, engine: str, figure: str, ws: Sequence[SeatPeaks], limit: int | None) -> Row:
    field = FIGURES[figure]
    values = [getattr(w, field) for w in ws]
    known = [v for v in values if v is not None]
    if not known:
        return Row(model, engine, figure, None, limit, "BLOCKED", ws[0].reason(field), len(ws))
    sources = sorted({str(w.details.get("sources", {}).get(_SOURCE_KEY[figure], "")) for w in ws} - {""})
    why = f"{len(known)} window(s); source: {', '.join(sources) or 'unknown'}"
    if len(known) < len(values):
        why += f"; {len(values) - len(known)} window(s) unmeasured: {next(w.reason(field) for w in ws if getattr(w, field) is None)}"
    others = max(int(w.details.get("other_seats", 0)) for w in ws)
    if figure == "peak_available_drop" and others:
        why += f"; up to {others} other seat(s) resident: the drop is the host's, not this model's alone"
    peak = max(known)
    return Row(model, engine, figure, peak, limit, judge(peak, limit), why, len(ws))


_SOURCE_KEY = {"peak_pss": "pss", "peak_rss": "rss", "peak_gpu": "gpu", "peak_available_drop": "available_drop"}


def report_rows(windows: Sequence[SeatPeaks], thresholds: Thresholds | None) -> list[Row]:
    """One row per model, engine and figure, over the windows that started after the thresholds were declared."""
    groups: dict[tuple[str, str], list[SeatPeaks]] = {}
    for w in windows:
        groups.setdefault((w.model, w.engine), []).append(w)
    rows: list[Row] = []
    for (model, engine), ws in sorted(groups.items()):
        judged = ws if thresholds is None else [w for w in ws if w.started_at >= thresholds.declared_at]
        for figure in FIGURES:
            limit = thresholds.limit(model, figure) if thresholds is not None else None
            if not judged:
                assert thresholds is not None
                why = (f"all {len(ws)} window(s) started before the thresholds were declared ({thresholds.path} "
                       f"written {_when(thresholds.declared_at)}, last window started {_when(ws[-1].started_at)})")
                rows.append(Row(model, engine, figure, None, limit, "BLOCKED", why, len(ws)))
            else:
                rows.append(_figure_row(model, engine, figure, judged, limit))
    return rows


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def markdown(rows: Sequence[Row], thresholds: Thresholds | None) -> str:
    head = ("# fitevict memory report\n\n"
            + (f"Thresholds: `{thresholds.path}` (sha256 `{thresholds.sha256[:12]}`), declared "
               f"{_when(thresholds.declared_at)}; only windows that started after that are judged.\n\n"
               if thresholds else "No thresholds declared: every figure is UNDECLARED "
               "(`fitevict report --thresholds FILE`).\n\n")
            + "| model | engine | figure | peak | threshold | result | why |\n|---|---|---|---|---|---|---|\n")
    lines = [f"| {r.model} | {r.engine} | {LABELS[r.figure]} | "
             f"{'BLOCKED' if r.peak_bytes is None else format_size(r.peak_bytes)} | "
             f"{format_size(r.threshold_bytes, unavailable='none declared')} | **{r.result}** | "
             f"{r.why.replace('|', '/')} |" for r in rows]
    return head + "\n".join(lines) + "\n"


# -- A/B: two configurations of one model, swapped legs -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Comparison:
    figure: str
    a_bytes: tuple[int, ...]
    b_bytes: tuple[int, ...]
    noise_floor_bytes: int | None
    difference_bytes: int | None  # mean(B) - mean(A)
    verdict: str  # "B higher", "B lower", "no difference above the noise floor", "BLOCKED"
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"figure": self.figure, "a_bytes": list(self.a_bytes), "b_bytes": list(self.b_bytes),
                "noise_floor_bytes": self.noise_floor_bytes, "difference_bytes": self.difference_bytes,
                "verdict": self.verdict, "why": self.why}


def matches(config: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    """Does a window's configuration have every ``field=value`` of the selector (values compared as text)?"""
    return all(k in config and _text(config[k]) == v for k, v in selector.items())


def _text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def legs(windows: Sequence[SeatPeaks], model: str, a: Mapping[str, str],
         b: Mapping[str, str]) -> list[tuple[str, SeatPeaks]]:
    """The windows of ``model`` that are leg A or leg B, in start order (a window matching both is left out)."""
    out = []
    for w in sorted(windows, key=lambda w: w.started_at):
        if w.model != model:
            continue
        in_a, in_b = matches(w.config, a), matches(w.config, b)
        if in_a != in_b:
            out.append(("A" if in_a else "B", w))
    return out


def compare(pairs: Sequence[tuple[str, SeatPeaks]], min_legs: int = 2) -> list[Comparison]:
    """Per figure: the legs' peaks, the noise floor (the larger within-configuration spread, max - min) and the
    call: a difference of means only when it exceeds the floor; otherwise none is called."""
    out = []
    for figure, field in FIGURES.items():
        a = [getattr(w, field) for leg, w in pairs if leg == "A"]
        b = [getattr(w, field) for leg, w in pairs if leg == "B"]
        missing = [w.reason(field) for _leg, w in pairs if getattr(w, field) is None]
        if missing:
            out.append(Comparison(figure, (), (), None, None, "BLOCKED", missing[0]))
            continue
        if len(a) < min_legs or len(b) < min_legs:
            out.append(Comparison(figure, tuple(a), tuple(b), None, None, "BLOCKED",
                                  f"needs at least {min_legs} legs of each configuration to know the noise floor; "
                                  f"got {len(a)} A and {len(b)} B"))
            continue
        floor = max(max(a) - min(a), max(b) - min(b))
        diff = statistics.fmean(b) - statistics.fmean(a)
        if abs(diff) > floor:
            verdict = "B higher" if diff > 0 else "B lower"
            why = f"|{format_size(round(diff))}| is above the noise floor {format_size(floor)}"
        else:
            verdict = "no difference above the noise floor"
            why = f"|{format_size(round(diff))}| is within the noise floor {format_size(floor)}"
        out.append(Comparison(figure, tuple(a), tuple(b), floor, round(diff) if math.isfinite(diff) else None,
                              verdict, why))
    return out


def ab_markdown(model: str, a: Mapping[str, str], b: Mapping[str, str], pairs: Sequence[tuple[str, SeatPeaks]],
                comps: Sequence[Comparison]) -> str:
    sel = lambda s: ", ".join(f"{k}={v}" for k, v in s.items())  # noqa: E731
    order = " ".join(leg for leg, _ in pairs) or "none"
    lines = [f"# A/B memory comparison: {model}\n", f"A: `{sel(a)}`; B: `{sel(b)}`; legs in order: {order}\n",
             "| figure | A legs | B legs | B - A | noise floor | call |", "|---|---|---|---|---|---|"]
    for c in comps:
        fmt = lambda xs: ", ".join(format_size(x) for x in xs) or "-"  # noqa: E731
        lines.append(f"| {LABELS[c.figure]} | {fmt(c.a_bytes)} | {fmt(c.b_bytes)} | "
                     f"{format_size(c.difference_bytes, unavailable='-')} | "
                     f"{format_size(c.noise_floor_bytes, unavailable='-')} | **{c.verdict}**: {c.why} |")
    return "\n".join(lines) + "\n"
