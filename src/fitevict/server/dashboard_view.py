"""The dashboard's live part, rendered on the server: memory bars, residents, catalog, timeline, memory report.

Pure: figures in (a budget reading, resident views, dry-run plans, history events, report rows), HTML out.
Every byte figure shows its source on hover (``title``); a figure that is unavailable says so, never 0.
Each bar segment carries ``data-bytes`` (the figure its width is drawn from) and the bar ``data-scale`` (the
bytes of its full width), so the widths can be checked against the figures.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from html import escape
from typing import Any

from fitevict.pricing.footprint import HOST
from fitevict.report import LABELS, Row
from fitevict.store.records import Event
from fitevict.server.labels import history_sources
from fitevict.units import format_size

TIMELINE_EVENTS = ("load", "evict", "unload", "idle-unload", "fail", "refuse", "crash", "orphan", "leak", "pressure",
                   "outgrew", "recycle")


_PALETTE: dict[str, str] = {}


def use_palette(keys: Sequence[str]) -> None:
    """Spread the catalog's models over the colour wheel (golden angle), in catalog order."""
    for i, key in enumerate(keys):
        _PALETTE[key] = f"hsl({(i * 137.508 + 210) % 360:.0f} 60% 50%)"


def colour(key: str) -> str:
    """A stable colour per model, so one model looks the same in every bar."""
    if key in _PALETTE:
        return _PALETTE[key]
    h = int(hashlib.sha1(key.encode()).hexdigest()[:6], 16)
    return f"hsl({h % 360} 60% 50%)"


def _size(n: int | None) -> str:
    return format_size(n, unavailable="unavailable")


def _segment(cls: str, n: int, scale: int, title: str, *, key: str | None = None, label: str = "") -> str:
    width = 100.0 * n / scale if scale else 0.0
    style = f"width:{width:.4f}%" + (f";background:{colour(key)}" if key else "")
    attrs = f' data-model="{escape(key)}"' if key else ""
    text = f"<span>{escape(label)}</span>" if label and width > 9 else ""
    return (f'<div class="seg {cls}"{attrs} data-bytes="{n}" style="{style}" title="{escape(title)}">'
            f"{text}</div>")


def _resident_title(v: dict, dev: str, which: str) -> str:
    d = v["devices"].get(dev, {})
    return (f"{v['key']} on {dev}: measured {_size(d.get('measured_bytes'))} ({d.get('measured_source')}); "
            f"predicted {_size(d.get('predicted_bytes'))} ({d.get('predicted_source')}); bar shows {which}")


def device_card(dev: Any, residents: Sequence[dict], admin: bool) -> str:
    """One device: the budget bar (residents measured, then predicted) and the machine bar (others, fitevict,
    reserve, free)."""
    here = [v for v in residents if dev.name in v["devices"]]
    measured = [(v, v["devices"][dev.name]["measured_bytes"]) for v in here]
    predicted = [(v, v["devices"][dev.name]["predicted_bytes"]) for v in here]
    used_m = sum(n for _v, n in measured if n is not None)
    used_p = sum(n for _v, n in predicted if n is not None)
    scale = max(dev.budget_bytes, used_m, used_p, 1)
    budget_title = f"budget {_size(dev.budget_bytes)} ({dev.budget_source})"
    rows = []
    for which, pairs, used in (("measured", measured, used_m), ("predicted", predicted, used_p)):
        segs = [_segment(f"res {which}", n, scale, _resident_title(v, dev.name, which), key=v["key"],
                         label=v["key"]) for v, n in pairs if n is not None]
        room = max(0, dev.budget_bytes - used)
        segs.append(_segment("room", room, scale, f"room left in the budget: {_size(room)} = {budget_title} - "
                             f"{which} resident bytes {_size(used)}", label="room"))
        missing = [v["key"] for v, n in pairs if n is None]
        note = (f'<span class="miss" title="not measured yet">{escape(", ".join(missing))}: unavailable</span>'
                if missing else "")
        rows.append(f'<div class="row"><span class="lab">{which}</span><div class="bar" data-device="'
                    f'{escape(dev.name)}" data-kind="{which}" data-scale="{scale}">{"".join(segs)}</div>'
                    f'<span class="num">{escape(_size(used))}</span>{note}</div>')
    total = max(dev.total.bytes, 1)
    free = dev.free.bytes
    reserve = min(dev.reserve.bytes, free)
    machine = "".join([
        _segment("others", dev.others_bytes, total, f"other processes: {_size(dev.others_bytes)} (derived: total "
                 f"- free - held by fitevict)", label="others"),
        _segment("held", dev.held.bytes, total, f"held by fitevict's seats: {_size(dev.held.bytes)} "
                 f"({dev.held.source})", label="fitevict"),
        _segment("reserve", reserve, total, f"reserve: {_size(dev.reserve.bytes)} ({dev.reserve.source})",
                 label="reserve"),
        _segment("free", free - reserve, total, f"free beyond the reserve: {_size(free - reserve)}; free "
                 f"{_size(free)} ({dev.free.source})", label="free"),
    ])
    limit = (f' · limit <b title="{escape(dev.limit.source)}">{escape(_size(dev.limit.bytes))}</b>'
             if dev.limit is not None else "")
    head = (f'<div class="devhead"><h3>{escape(dev.name)}</h3><div class="figs">budget '
            f'<b title="{escape(dev.budget_source)}">{escape(_size(dev.budget_bytes))}</b>{limit} · free '
            f'<b title="{escape(dev.free.source)}">{escape(_size(free))}</b> · reserve '
            f'<b title="{escape(dev.reserve.source)}">{escape(_size(dev.reserve.bytes))}</b> · total '
            f'<b title="{escape(dev.total.source)}">{escape(_size(dev.total.bytes))}</b></div></div>')
    machine_row = (f'<div class="row"><span class="lab">machine</span><div class="bar thin" data-device="'
                   f'{escape(dev.name)}" data-kind="machine" data-scale="{total}">{machine}</div>'
                   f'<span class="num">{escape(_size(dev.total.bytes))}</span></div>')
    return f'<div class="card dev">{head}{"".join(rows)}{machine_row}</div>'


def _outgrew_mark(v: dict) -> str:
    """A resident outgrowing its price: a mark with its figures (its outgrew event), else nothing."""
    o = v.get("outgrew")
    if not o:
        return ""
    rate = o.get("growth_bytes_per_second")
    title = (f"outgrowing its price on {o.get('device')}: read {_size(o.get('reading_bytes'))} against "
             f"{_size(o.get('price_bytes'))} priced (bound {_size(o.get('bound_bytes'))}, budget.outgrow_margin)"
             + (f", growing {_size(int(rate))}/s since its load" if rate else "")
             + "; stopped first under memory pressure")
    return f' <span class="miss outgrew" title="{escape(title)}">outgrew</span>'


def residents_table(residents: Sequence[dict], peaks: dict[str, int | None], admin: bool, now: float) -> str:
    if not residents:
        return '<p class="empty">Nothing is loaded. A request for any model in the catalog loads it.</p>'
    out = []
    for v in residents:
        cpu = v["devices"].get(HOST, {})
        idle = ("never used" if v["last_used"] is None else
                f"{max(0, v['unload_at'] - now):.0f} s" if v["unload_at"] else "off")
        btn = (f'<button class="act" data-act="unload" data-model="{escape(v["key"])}">unload</button>'
               if admin else "")
        peak = peaks.get(v["key"])
        out.append(
            f'<tr class="resident" data-model="{escape(v["key"])}"><td><i class="dot" style="background:'
            f'{colour(v["key"])}"></i>{escape(v["key"])}</td><td>{escape(v["state"])}</td>'
            f'<td>{escape(v["placement"])}</td>'
            f'<td title="{escape(str(cpu.get("measured_source")))}">{escape(_size(cpu.get("measured_bytes")))}'
            f'{_outgrew_mark(v)}</td>'
            f'<td title="{escape(str(cpu.get("predicted_source")))}">{escape(_size(cpu.get("predicted_bytes")))}'
            f'</td><td title="measured: smaps_rollup PSS of the seat\'s process tree, highest this window">'
            f'{escape(_size(peak))}</td><td>{v["ctx"]}</td><td>{v["in_flight"]}</td><td>{escape(idle)}</td>'
            f"<td>{btn}</td></tr>")
    return ('<table><thead><tr><th>model</th><th>state</th><th>placement</th><th>host measured</th>'
            '<th>host predicted</th><th>peak PSS</th><th>ctx</th><th>in flight</th><th>idle unload</th><th></th>'
            f'</tr></thead><tbody>{"".join(out)}</tbody></table>')


def plan_verdict(plan: dict) -> tuple[str, str]:
    """What loading now would do, in a few words, and its class: fits, evicts X, waits, resident, refused."""
    action = plan["action"]
    if action == "hit":
        return "resident", "hit"
    if action == "refuse":
        ctx = plan.get("largest_ctx")
        return (f"refused; largest ctx that fits: {ctx}" if ctx else "refused: does not fit at any ctx"), "refuse"
    if action == "wait":
        return f"waits for {', '.join(plan.get('wait_for') or ['in-flight requests'])}", "wait"
    if plan["evict"]:
        freed = sum(sum(e["bytes"].values()) for e in plan["evict"])
        return f"evicts {', '.join(e['key'] for e in plan['evict'])} ({_size(freed)})", "evict"
    return ("fits" if action == "load" else f"fits ({action})"), "fits"


def _price_title(plan: dict) -> str:
    fp = plan.get("footprint") or {}
    parts = []
    for d in fp.get("devices", []):
        src = d.get("sources", {})
        parts.append(f"{d['name']}: " + ", ".join(f"{k} {_size(d.get(f'{k}_bytes'))} ({src.get(k)})"
                                                  for k in ("model", "context", "compute", "output")))
    host = fp.get("host") or {}
    if host:
        parts.append(f"host: mapped {_size(host.get('mapped_bytes'))}, committed {_size(host.get('committed_bytes'))} "
                     f"({host.get('source')})")
    return "; ".join(parts) or "no footprint"


def catalog_table(rows: Sequence[tuple[Any, dict | None, str]], resident_keys: set[str], admin: bool) -> str:
    """``rows``: (catalog entry, its dry-run plan JSON or None, the error that kept it from being priced)."""
    out = []
    for entry, plan, error in rows:
        btn = ""
        if admin:
            act = "unload" if entry.key in resident_keys else "load"
            btn = f'<button class="act" data-act="{act}" data-model="{escape(entry.key)}">{act}</button>'
        if plan is None:
            out.append(f'<tr data-model="{escape(entry.key)}"><td>{escape(entry.key)}</td>'
                       f'<td>{escape(entry.store)}</td><td>{escape(entry.engine)}</td>'
                       f'<td colspan=3 class="err">unpriced: {escape(error)}</td><td>{btn}</td></tr>')
            continue
        words, cls = plan_verdict(plan)
        needed = ", ".join(f"{d} {_size(n)}" for d, n in plan["needed_bytes"].items() if n) or "-"
        ctx = (plan.get("placement") or {}).get("ctx")
        out.append(
            f'<tr data-model="{escape(entry.key)}" data-action="{escape(plan["action"])}"><td><i class="dot" style='
            f'"background:{colour(entry.key)}"></i>{escape(entry.key)}</td><td>{escape(entry.store)}</td>'
            f'<td>{escape(entry.engine)}</td>'
            f'<td title="{escape(_price_title(plan))}">{escape(needed)}</td><td>{escape(str(ctx))}</td>'
            f'<td><span class="pill {cls}" title="{escape(plan["reason"])}">{escape(words)}</span></td>'
            f"<td>{btn}</td></tr>")
    return ('<table><thead><tr><th>model</th><th>store</th><th>engine</th><th>price (default ctx)</th><th>ctx</th>'
            f'<th>loading it now</th><th></th></tr></thead><tbody>{"".join(out)}</tbody></table>')


def _duration(ev: Event) -> float | None:
    if ev.event == "load":
        return ev.seconds
    rel = ev.details.get("release_seconds")
    exit_s = ev.seconds or 0.0
    return exit_s + (rel if isinstance(rel, (int, float)) else 0.0) if ev.seconds is not None else None


def timeline(events: Sequence[Event]) -> str:
    evs = [e for e in events if e.event in TIMELINE_EVENTS]
    if not evs:
        return '<p class="empty">No loads, evictions or failures yet.</p>'
    longest = max((_duration(e) or 0.0 for e in evs), default=0.0) or 1.0
    out = []
    for e in evs:
        d = _duration(e)
        rel = e.details.get("release_seconds")
        title = ("load: engine start to ready, measured" if e.event == "load" else
                 f"exit {e.seconds if e.seconds is not None else '?'} s + release "
                 f"{rel if rel is not None else 'unverified'} s (measured)")
        bar = (f'<div class="dur" style="width:{100 * d / longest:.2f}%" title="{escape(title)}"></div>'
               if d is not None else "")
        src = history_sources(e)  # every figure's label follows the event's own data
        bytes_, source = (
            (f"freed {_size(e.freed_bytes)}", src["freed"]) if e.event in ("evict", "unload", "idle-unload", "crash",
                                                                            "pressure", "recycle")
            else (f"host {_size(e.host_bytes)}", src["host"]) if e.event == "load"
            else (f"needs {_size(e.predicted_bytes)}", src["predicted"]) if e.event == "refuse"
            else (f"read {_size(e.details.get('reading_bytes'))} of {_size(e.details.get('price_bytes'))} priced",
                  str(e.details.get("source", ""))) if e.event == "outgrew" else ("", ""))
        out.append(
            f'<li class="ev {escape(e.event)}"><time>{time.strftime("%H:%M:%S", time.localtime(e.time))}</time>'
            f'<span class="kind">{escape(e.event)}</span><span class="who">{escape(e.model or "")}</span>'
            f'<span class="track">{bar}</span><span class="secs">{"" if d is None else f"{d:.2f} s"}</span>'
            f'<span class="bytes" title="{escape(source)}">{escape(bytes_)}</span>{_speed(e)}'
            f'<span class="why" title="{escape(e.reason or "")}">{escape(e.strategy or e.reason or "")}</span></li>')
    return f'<ol class="timeline">{"".join(out)}</ol>'


def _speed(e: Event) -> str:
    """The engine's own timings over a stopped seat's answers: generation and prompt tokens/s, labelled."""
    t = e.details.get("engine_timings")
    if not isinstance(t, dict):
        return ""
    gen, prompt = t.get("predicted_per_second"), t.get("prompt_per_second")
    words = (f"{t.get('answers')} answers: gen {'n/a' if gen is None else f'{gen:g}'} tok/s, "
             f"prompt {'n/a' if prompt is None else f'{prompt:g}'} tok/s")
    src = t.get("sources") or {}
    title = f"generation: {src.get('predicted_per_second')}; prompt: {src.get('prompt_per_second')}"
    return f'<span class="tps" title="{escape(title)}">{escape(words)}</span>'


def report_table(rows: Sequence[Row]) -> str:
    if not rows:
        return ('<p class="empty">No serving window is stored yet: a window is stored when its seat stops '
                "(or the server does).</p>")
    out = [f'<tr><td>{escape(r.model)}</td><td>{escape(r.engine)}</td><td>{escape(LABELS[r.figure])}</td>'
           f'<td>{"BLOCKED" if r.peak_bytes is None else escape(_size(r.peak_bytes))}</td>'
           f'<td>{escape(format_size(r.threshold_bytes, unavailable="none declared"))}</td>'
           f'<td><span class="pill {r.result.lower()}">{escape(r.result)}</span></td><td class="why">'
           f'{escape(r.why)}</td></tr>' for r in rows]
    return ('<table class="report"><thead><tr><th>model</th><th>engine</th><th>figure</th><th>peak</th>'
            f'<th>threshold</th><th>result</th><th>why</th></tr></thead><tbody>{"".join(out)}</tbody></table>')
