"""A server-rendered status page: the budget, what is resident and what fitevict did, every figure with its source.

Plain HTML with a refresh header; no scripts and nothing fetched from elsewhere, so it works offline.
"""

from __future__ import annotations

import asyncio
import time
from html import escape

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from fitevict import __version__
from fitevict.server.door import Door
from fitevict.server.labels import NA, history_sources
from fitevict.units import format_size

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f3f3f3}.src{color:#777;font-size:12px}.refuse,.fail,.crash{color:#a00}.evict,.idle-unload{color:#a60}
"""


def _fig(n: int | None, source: str) -> str:
    if n is None:
        return f'unavailable <span class="src">({escape(source)})</span>'
    return f'{escape(format_size(n))} <span class="src">({escape(source)})</span>'


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body or '<tr><td colspan=99>none</td></tr>'}</table>"


def router(door: Door) -> APIRouter:
    app = APIRouter()

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/dashboard")

    @app.get("/dashboard", response_class=HTMLResponse, tags=["admin"], summary="Status page (HTML)")
    async def dashboard(request: Request) -> HTMLResponse:
        door.check_auth(request, admin=False)
        sup = door.sup
        budget = await asyncio.to_thread(sup.budget)
        now = time.time()
        b_rows = [[escape(d.name), _fig(d.total.bytes, d.total.source), _fig(d.free.bytes, d.free.source),
                   _fig(d.reserve.bytes, d.reserve.source),
                   _fig(d.limit.bytes, d.limit.source) if d.limit else "none",
                   _fig(d.budget_bytes, d.budget_source)] for d in budget.devices]
        r_rows = []
        for v in sup.resident_views():
            cpu = v["devices"].get("CPU", {})
            idle = ("never used" if v["last_used"] is None else
                    f"{max(0, v['unload_at'] - now):.0f} s" if v["unload_at"] else "off")
            r_rows.append([escape(v["key"]), escape(v["state"]), escape(v["placement"]),
                           _fig(cpu.get("measured_bytes"), cpu.get("measured_source", "")),
                           _fig(cpu.get("predicted_bytes"), cpu.get("predicted_source", "")),
                           str(v["ctx"]), str(v["in_flight"]), escape(idle)])
        events = await asyncio.to_thread(door.store.events, limit=30)
        h_rows = []
        for e in events:
            src = history_sources(e)
            h_rows.append([escape(time.strftime("%H:%M:%S", time.localtime(e.time))),
                           f'<span class="{escape(e.event)}">{escape(e.event)}</span>', escape(e.model or ""),
                           "" if e.seconds is None else f"{e.seconds:.2f} s",
                           "" if src["host"] == NA else _fig(e.host_bytes, src["host"]),
                           "" if src["freed"] == NA else _fig(e.freed_bytes, src["freed"]),
                           escape(e.strategy or e.reason or "")])
        notes = "".join(f"<li>{escape(n)}</li>" for n in budget.notes)
        html = f"""<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>fitevict</title><style>{STYLE}</style></head><body>
<h1>fitevict {escape(__version__)}</h1>
<h2>Budget</h2>{_table(["device", "total", "free", "reserve", "limit", "budget for models"], b_rows)}
{f"<ul>{notes}</ul>" if notes else ""}
<h2>Resident</h2>{_table(["model", "state", "placement", "host now", "host predicted", "ctx", "in flight",
                         "idle unload in"], r_rows)}
<h2>History</h2>{_table(["time", "event", "model", "seconds", "host", "freed", "strategy / reason"], h_rows)}
</body></html>"""
        return HTMLResponse(html)

    return app
