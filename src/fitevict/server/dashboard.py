"""The dashboard: memory bars per device, residents, the catalog with what loading each model now would do, a
timeline of what fitevict did, and the memory report. Rendered on the server (``dashboard_view``); the page
polls its live part every two seconds. Inline CSS and script only: nothing is fetched from elsewhere.

With keys configured the page asks for one (kept in the tab's sessionStorage, sent as a Bearer header); an admin
key adds load and unload buttons, which call the admin API.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from html import escape
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse

from fitevict import __version__
from fitevict.pricing.gguf import PricingError, load_structure
from fitevict.report import markdown, report_rows
from fitevict.server import dashboard_view as view
from fitevict.server.door import Door
from fitevict.server.errors import ApiError
from fitevict.store.peaks import SeatPeaks, q_peaks

POLL_MS = 2000
PLANS_TTL_S = 10.0

STYLE = """
:root{--bg:#f4f5f7;--card:#fff;--ink:#1d2330;--mute:#6b7385;--line:#e3e6ec;--accent:#2f6fde}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;
background:var(--bg);color:var(--ink)}
header{display:flex;align-items:center;gap:1.2em;padding:.8em 1.6em;background:#1d2330;color:#fff}
header h1{font-size:18px;margin:0;font-weight:600}header .ver{color:#9aa3b5;font-size:12px}
header nav{margin-left:auto;display:flex;gap:1em;align-items:center}header a{color:#cfe0ff;text-decoration:none}
#status{font-size:12px;color:#9aa3b5}
main{padding:1.2em 1.6em;max-width:1280px;margin:auto}
h2{font-size:15px;margin:1.4em 0 .5em;color:#39414f;text-transform:uppercase;letter-spacing:.04em}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:.8em 1em;margin:.6em 0;
box-shadow:0 1px 2px #0000000a}
.devhead{display:flex;align-items:baseline;gap:1em}.devhead h3{margin:0;font-size:15px}
.figs{color:var(--mute);font-size:13px}.figs b{color:var(--ink);font-weight:600;cursor:help}
.row{display:flex;align-items:center;gap:.7em;margin:.45em 0}
.lab{width:6.5em;color:var(--mute);font-size:12px;text-align:right}.num{width:6.5em;font-size:12px;
font-variant-numeric:tabular-nums}
.bar{flex:1;display:flex;height:26px;border-radius:5px;overflow:hidden;background:#eef0f4;border:1px solid
var(--line)}.bar.thin{height:14px}
.seg{height:100%;display:flex;align-items:center;justify-content:center;overflow:hidden;white-space:nowrap;
color:#fff;font-size:11px;font-weight:600;cursor:help;border-right:1px solid #ffffff80}
.seg span{overflow:hidden;text-overflow:ellipsis;padding:0 4px}
.seg.predicted{opacity:.55;background-image:repeating-linear-gradient(45deg,#ffffff40 0 6px,transparent 6px 12px)}
.seg.room{background:repeating-linear-gradient(45deg,#e9f6ee 0 6px,#f5fbf7 6px 12px);color:#3b7d55}
.seg.others{background:#9aa1ad}.seg.held{background:#4a78c9}.seg.reserve{background:#e3b35b}
.seg.free{background:#cfe9d7;color:#3b7d55}
.miss{font-size:12px;color:#a15c00}
table{border-collapse:collapse;width:100%;background:var(--card);border:1px solid var(--line);border-radius:8px;
overflow:hidden}th,td{padding:.45em .7em;text-align:left;border-bottom:1px solid var(--line);font-size:13px}
th{background:#f8f9fb;color:var(--mute);font-weight:600;font-size:12px}td[title]{cursor:help}
.dot{display:inline-block;width:10px;height:10px;border-radius:50%;margin-right:.5em;vertical-align:-1px}
.pill{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;background:#eef0f4;cursor:help}
.pill.fits,.pill.pass{background:#dff3e6;color:#20683c}.pill.evict,.pill.wait{background:#fdf0d8;color:#8a5a00}
.pill.refuse,.pill.fail,.pill.blocked{background:#fbe0e0;color:#a12020}.pill.hit{background:#e1ebfd;color:#1f4fa8}
.pill.undeclared{background:#eef0f4;color:var(--mute)}
.err{color:#a12020}.empty{color:var(--mute);font-style:italic}
button.act{font:inherit;font-size:12px;padding:2px 10px;border-radius:5px;border:1px solid var(--accent);
background:#fff;color:var(--accent);cursor:pointer}button.act:hover{background:var(--accent);color:#fff}
button.act[data-act=unload]{border-color:#c0392b;color:#c0392b}
button.act[data-act=unload]:hover{background:#c0392b;color:#fff}
.timeline{list-style:none;margin:0;padding:0;background:var(--card);border:1px solid var(--line);border-radius:8px}
.ev{display:grid;grid-template-columns:5.5em 6.5em 9em 1fr 5em 9em 2fr;gap:.6em;align-items:center;
padding:.35em .8em;border-bottom:1px solid var(--line);font-size:13px}
.ev time{color:var(--mute);font-variant-numeric:tabular-nums}.ev .kind{font-weight:600}
.ev .track{height:8px;background:#f1f3f6;border-radius:4px;overflow:hidden}.ev .dur{height:100%;background:#4a78c9}
.ev.evict .dur,.ev.idle-unload .dur{background:#e0a13a}.ev.pressure .dur{background:#c0392b}.ev.outgrew .kind{color:#c0392b}.ev.unload .dur{background:#8e98aa}
.ev.fail .kind,.ev.crash .kind,.ev.refuse .kind,.ev.leak .kind{color:#b02a2a}.ev.evict .kind{color:#a86a00}
.ev.load .kind{color:#1f6f3f}.ev .secs,.ev .bytes{font-variant-numeric:tabular-nums;color:#39414f}
.ev .why{color:var(--mute);overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
table.report td{white-space:nowrap}table.report td.why{white-space:normal;color:var(--mute);min-width:24em}
#keyform{display:none;gap:.5em;align-items:center}#keyform input{font:inherit;padding:3px 6px;border-radius:4px;
border:1px solid #556}
#note{margin:.6em 0;color:#a12020}
"""

SCRIPT = """
(function(){
  const live = document.getElementById('live'), status = document.getElementById('status');
  const form = document.getElementById('keyform'), note = document.getElementById('note');
  const src = live.dataset.src;
  function headers(){ const k = sessionStorage.getItem('fitevict-key');
    return k ? {'Authorization': 'Bearer ' + k} : {}; }
  let last = '';
  async function refresh(){
    try {
      const r = await fetch(src, {headers: headers(), cache: 'no-store'});
      if (r.status === 401 || r.status === 403) { form.style.display = 'flex';
        status.textContent = 'a key is needed'; return; }
      const html = await r.text();
      if (html !== last) { live.innerHTML = html; last = html; }
      status.textContent = 'updated ' + new Date().toLocaleTimeString();
    } catch (e) { status.textContent = 'cannot reach fitevict: ' + e; }
  }
  form.addEventListener('submit', function(ev){ ev.preventDefault();
    sessionStorage.setItem('fitevict-key', form.elements.key.value); form.style.display = 'none'; refresh(); });
  live.addEventListener('click', async function(ev){
    const b = ev.target.closest('button.act'); if (!b) return;
    b.disabled = true; note.textContent = b.dataset.act + 'ing ' + b.dataset.model + ' ...';
    const r = await fetch('/v1/models/' + encodeURIComponent(b.dataset.model) + '/' + b.dataset.act,
                          {method: 'POST', headers: headers()});
    let msg = '';
    if (!r.ok) { try { msg = (await r.json()).error.message; } catch (e) { msg = r.statusText; } }
    note.textContent = r.ok ? '' : b.dataset.act + ' ' + b.dataset.model + ': ' + r.status + ' ' + msg;
    refresh();
  });
  refresh(); setInterval(refresh, POLL_MS);
})();
"""


def _page(title: str, src: str, body: str) -> str:
    script = SCRIPT.replace("POLL_MS", str(POLL_MS))
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>{escape(title)}</title>
<style>{STYLE}</style></head><body>
<header><h1>fitevict</h1><span class="ver">{escape(__version__)}</span><nav>
<a href="/dashboard">dashboard</a><a href="/dashboard/report">memory report</a>
<a href="/dashboard/report.md">report.md</a><a href="/dashboard/report.json">report.json</a>
<a href="/metrics">metrics</a>
<form id="keyform"><input name="key" type="password" placeholder="API key" autocomplete="off">
<button class="act">use key</button></form><span id="status"></span></nav></header>
<main><div id="note"></div><div id="live" data-src="{escape(src)}">{body}</div></main>
<script>{script}</script></body></html>"""


def _read_structures(entries) -> None:
    """Parse every GGUF once, off the event loop (``load_structure`` caches), so the dry runs below stay quick.
    A file that cannot be read is reported by its dry run, in its catalog row."""
    for e in entries:
        if e.llama_servable:
            with contextlib.suppress(PricingError):
                load_structure(e.path)


class _Pages:
    """What the dashboard's pages are made of: the live status, the catalog's dry runs (made again when something
    happened, a history event, or after PLANS_TTL_S, not on every poll: each one reads the budget afresh) and the
    memory report."""

    def __init__(self, door: Door) -> None:
        self.door, self.sup, self.store = door, door.sup, door.store
        self.cached: dict[str, Any] = {"at": -PLANS_TTL_S, "events": -1, "plans": []}
        self.events_seen = 0
        door.sup.on_event.append(self._saw)

    def _saw(self, _ev: Any) -> None:
        self.events_seen += 1

    def is_admin(self, request: Request) -> bool:
        try:
            self.door.check_auth(request, admin=True)
        except ApiError:
            return False
        return True

    def visible(self, request: Request) -> bool:
        return not self.door.config.server.auth_enabled or bool(request.headers.get("authorization")
                                                                or request.headers.get("x-api-key"))

    async def catalog_plans(self) -> list[tuple[Any, dict | None, str]]:
        now, cached = time.monotonic(), self.cached
        if cached["events"] == self.events_seen and now - cached["at"] < PLANS_TTL_S:
            return cached["plans"]
        await asyncio.to_thread(_read_structures, self.door.catalog.entries())
        plans: list[tuple[Any, dict | None, str]] = []
        for entry in self.door.catalog.entries():
            try:
                plans.append((entry, self.sup.plan(entry.key).to_json(), ""))
            except Exception as e:  # shown in the catalog row: the model cannot be priced as it is
                plans.append((entry, None, f"{type(e).__name__}: {e}"))
        cached.update(at=now, events=self.events_seen, plans=plans)
        return plans

    async def windows(self) -> list[SeatPeaks]:
        stored = await self.store.aread(q_peaks())
        return stored + (self.door.sampler.open_windows() if self.door.sampler is not None else [])

    async def live(self, request: Request) -> str:
        door, sup = self.door, self.sup
        door.check_auth(request, admin=False)
        admin = self.is_admin(request)
        budget = await asyncio.to_thread(sup.budget)
        residents = sup.resident_views()
        plans = await self.catalog_plans()
        events = await self.store.aio.events(limit=40)
        open_peaks = {p.model: p.peak_pss_bytes for p in (door.sampler.open_windows() if door.sampler else [])}
        cards = "".join(view.device_card(d, residents, admin) for d in budget.devices)
        notes = "".join(f"<li>{escape(n)}</li>" for n in budget.notes)
        return (f'<h2>Memory</h2>{cards}{f"<ul>{notes}</ul>" if notes else ""}'
                f"<h2>Resident</h2>{view.residents_table(residents, open_peaks, admin, time.time())}"
                f"<h2>Catalog</h2>{view.catalog_table(plans, {v['key'] for v in residents}, admin)}"
                f'<h2>Timeline</h2>{view.timeline(events)}'
                f'<p class="empty">Peaks per model over serving windows: <a href="/dashboard/report">memory '
                f"report</a>.</p>")

    async def report_live(self, request: Request) -> str:
        self.door.check_auth(request, admin=False)
        rows = report_rows(await self.windows(), None)
        return ("<h2>Memory report</h2><p>Peak PSS, RSS, GPU and MemAvailable drop per model and engine over "
                "every serving window, the open ones included. Judge them against thresholds declared before the "
                "run with <code>fitevict report --thresholds FILE</code>.</p>" + view.report_table(rows))


def router(door: Door) -> APIRouter:
    app = APIRouter()
    view.use_palette([e.key for e in door.catalog.entries()])
    pages = _Pages(door)

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/dashboard")

    @app.get("/dashboard", response_class=HTMLResponse, tags=["admin"], summary="Live status page (HTML)")
    async def dashboard(request: Request) -> HTMLResponse:
        body = (await pages.live(request) if pages.visible(request)
                else '<p class="empty">Enter a key to see fitevict.</p>')
        return HTMLResponse(_page("fitevict", "/dashboard/live", body))

    @app.get("/dashboard/live", response_class=HTMLResponse, tags=["admin"], summary="The page's live part")
    async def dashboard_live(request: Request) -> HTMLResponse:
        return HTMLResponse(await pages.live(request), headers={"Cache-Control": "no-store"})

    @app.get("/dashboard/report", response_class=HTMLResponse, tags=["admin"], summary="Memory report (HTML)")
    async def report_page(request: Request) -> HTMLResponse:
        body = await pages.report_live(request) if pages.visible(request) else '<p class="empty">Enter a key.</p>'
        return HTMLResponse(_page("fitevict memory report", "/dashboard/report/live", body))

    @app.get("/dashboard/report/live", response_class=HTMLResponse, include_in_schema=False)
    async def report_fragment(request: Request) -> HTMLResponse:
        return HTMLResponse(await pages.report_live(request), headers={"Cache-Control": "no-store"})

    @app.get("/dashboard/report.md", response_class=PlainTextResponse, tags=["admin"],
             summary="Memory report (markdown, no thresholds)")
    async def report_md(request: Request) -> PlainTextResponse:
        door.check_auth(request, admin=False)
        return PlainTextResponse(markdown(report_rows(await pages.windows(), None), None),
                                 media_type="text/markdown; charset=utf-8")

    @app.get("/dashboard/report.json", tags=["admin"], summary="Memory report (JSON: rows and windows)")
    async def report_json(request: Request) -> JSONResponse:
        door.check_auth(request, admin=False)
        ws = await pages.windows()
        return JSONResponse({"rows": [r.to_json() for r in report_rows(ws, None)],
                             "windows": [w.to_json() for w in ws]})

    return app
