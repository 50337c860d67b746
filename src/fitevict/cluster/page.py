"""The cluster front door's text answers: ``/metrics`` (``cluster.metrics``) and a dashboard over every node.

The dashboard (``/dashboard``, its live part ``/dashboard/live``, polled every two seconds as one machine's page
is) shows the nodes (routable or not, their facts' age, budget, held and room per device), the residents with
their node, the models with the nodes that have their files and hold their seat (with load and unload buttons
for an admin key, which call the cluster's admin routes), and the merged timeline, each row naming its node.
Each node's own page (its catalog's dry runs, memory bars, the memory report) stays at its door. The HTML is made
from the merged JSON answers by pure functions (``live_html``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from fitevict.cluster import merge
from fitevict.cluster import metrics as cluster_metrics
from fitevict.cluster.door_port import Front
from fitevict.cluster.wire import Scope, Send, send_bytes
from fitevict.server.errors import ApiError
from fitevict.units import format_size


PAGES = ("/", "/dashboard", "/dashboard/live", "/metrics")
TIMELINE_ROWS = 40


async def answer(door: Front, scope: Scope, send: Send) -> None:
    path = scope["path"]
    if scope["method"] not in ("GET", "HEAD"):
        raise ApiError(405, "Method Not Allowed", headers={"Allow": "GET"})
    if path == "/":
        await send({"type": "http.response.start", "status": 307, "headers": [(b"location", b"/dashboard"),
                                                                              (b"content-length", b"0")]})
        return await send({"type": "http.response.body", "body": b""})
    if path == "/metrics":
        if not door.config.server.metrics_public:
            door.keys.check(scope)
        return await send_bytes(send, 200, cluster_metrics.CONTENT_TYPE, (await metrics_text(door)).encode())
    html = "text/html; charset=utf-8"
    if path == "/dashboard/live":
        door.keys.check(scope)
        return await send_bytes(send, 200, html, (await live(door, scope)).encode(), {"cache-control": "no-store"})
    headers = dict(scope["headers"])
    visible = not door.config.server.auth_enabled or b"authorization" in headers or b"x-api-key" in headers
    body = await live(door, scope) if visible else '<p class="empty">Enter a key to see the cluster.</p>'
    await send_bytes(send, 200, html, shell(body).encode())


async def metrics_text(door: Front) -> str:
    got = await door.ask_each("GET", "/metrics", timeout=10.0)
    per_node = {n: r.text for n, r in got.items() if r.status_code == 200}
    return cluster_metrics.text(per_node, door.fleet.rows(time.time()), door.routed)


async def live(door: Front, scope: Scope) -> str:
    try:
        door.keys.check(scope, admin=True)
        admin = True
    except ApiError:
        admin = False
    res, lists, hist = await asyncio.gather(door.each_node("/v1/models/residents"), door.each_node("/v1/models"),
                                            door.each_node("/v1/models/history", {"limit": str(TIMELINE_ROWS)}))
    residents = merge.residents(res)["data"]
    models = merge.models(lists, merge.resident_nodes(res))["data"]
    events = merge.history(hist, TIMELINE_ROWS)["data"]
    return live_html(door.fleet.rows(time.time()), residents, models, events, admin)


def shell(body: str) -> str:
    """The page around the live part: one machine's style and script (the key form, the polling, the buttons)."""
    from fitevict import __version__
    from fitevict.server.dashboard import POLL_MS, SCRIPT, STYLE

    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>fitevict cluster</title>
<style>{STYLE}</style></head><body>
<header><h1>fitevict cluster</h1><span class="ver">{escape(__version__)}</span><nav>
<a href="/dashboard">dashboard</a><a href="/metrics">metrics</a>
<form id="keyform"><input name="key" type="password" placeholder="API key" autocomplete="off">
<button class="act">use key</button></form><span id="status"></span></nav></header>
<main><div id="note"></div><div id="live" data-src="/dashboard/live">{body}</div></main>
<script>{SCRIPT.replace("POLL_MS", str(POLL_MS))}</script></body></html>"""


def _node(node: str) -> str:
    return f'<td class="node" title="{escape(node)}">{escape(merge.short(node))}</td>'


def _table(head: Sequence[str], rows: Sequence[str], empty: str) -> str:
    if not rows:
        return f'<p class="empty">{escape(empty)}</p>'
    ths = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f'<table><thead><tr>{ths}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def nodes_table(nodes: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for r in nodes:
        state = ('<span class="pill pass">routable</span>' if r["routable"] else
                 f'<span class="pill refuse" title="{escape(str(r.get("why_lost") or ""))}">lost</span>')
        budget, room = r.get("budget_bytes") or {}, r.get("room_bytes") or {}
        devs = "<br>".join(f"{escape(d)}: held {escape(format_size(b - room.get(d, b)))} of "
                           f"{escape(format_size(b))}, room {escape(format_size(room.get(d)))}"
                           for d, b in sorted(budget.items()))
        age = r.get("facts_age_s")
        rows.append(f'<tr class="cnode" data-node="{escape(r["node"])}">{_node(r["node"])}'
                    f'<td>{escape(r.get("url") or "")}</td><td>{state}</td>'
                    f'<td>{"" if age is None else f"{age:.1f} s"}</td><td>{devs}</td>'
                    f'<td>{escape(", ".join(r.get("residents") or ()))}</td></tr>')
    return _table(("node", "door", "state", "facts age", "budget per device", "residents"), rows,
                  "No node has joined yet.")


def residents_table(residents: Sequence[Mapping[str, Any]], admin: bool) -> str:
    rows = []
    for v in residents:
        planned = sum(int(d.get("planned_bytes") or 0) for d in (v.get("devices") or {}).values()
                      if isinstance(d, dict))
        btn = (f'<button class="act" data-act="unload" data-model="{escape(v["key"])}">unload</button>'
               if admin else "")
        rows.append(f'<tr class="resident" data-model="{escape(v["key"])}">{_node(v["node"])}'
                    f'<td>{escape(v["key"])}</td><td>{escape(str(v.get("state") or ""))}</td>'
                    f'<td>{escape(str(v.get("placement") or ""))}</td><td>{escape(format_size(planned))}</td>'
                    f'<td>{int(v.get("in_flight") or 0)}+{int(v.get("waiting") or 0)}</td><td>{btn}</td></tr>')
    return _table(("node", "model", "state", "placement", "planned", "busy", ""), rows,
                  "Nothing is loaded on any node. A request for a model loads it where it fits best.")


def models_table(models: Sequence[Mapping[str, Any]], admin: bool) -> str:
    rows = []
    for m in models:
        fx = m.get("fitevict") or {}
        on = fx.get("resident_on") or []
        act = "unload" if on else "load"
        btn = f'<button class="act" data-act="{act}" data-model="{escape(m["id"])}">{act}</button>' if admin else ""
        rows.append(f'<tr class="model" data-model="{escape(m["id"])}"><td>{escape(m["id"])}</td>'
                    f'<td>{escape(", ".join(merge.short(n) for n in fx.get("nodes") or ()))}</td>'
                    f'<td>{escape(", ".join(merge.short(n) for n in on))}</td><td>{btn}</td></tr>')
    return _table(("model", "files on", "resident on", ""), rows, "No node has a model.")


def timeline_table(events: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for e in events:
        secs = e.get("seconds")
        rows.append(f'<tr class="ev {escape(str(e.get("event")))}">'
                    f'<td>{time.strftime("%H:%M:%S", time.localtime(e.get("time") or 0))}</td>{_node(e["node"])}'
                    f'<td>{escape(str(e.get("event")))}</td><td>{escape(str(e.get("model") or ""))}</td>'
                    f'<td>{"" if secs is None else f"{secs:.2f} s"}</td>'
                    f'<td>{escape(str(e.get("strategy") or e.get("reason") or ""))}</td></tr>')
    return _table(("time", "node", "event", "model", "seconds", "why"), rows, "Nothing happened yet.")


def live_html(nodes: Sequence[Mapping[str, Any]], residents: Sequence[Mapping[str, Any]],
              models: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]], admin: bool) -> str:
    """The live part: nodes, residents, models and the timeline, each row naming its node (its id's head; the
    whole id on hover)."""
    return (f"<h2>Nodes</h2>{nodes_table(nodes)}<h2>Resident</h2>{residents_table(residents, admin)}"
            f"<h2>Models</h2>{models_table(models, admin)}<h2>Timeline</h2>{timeline_table(events)}"
            '<p class="empty">Each node\'s own page (memory bars, the catalog\'s dry runs, the memory report) is '
            "at its door.</p>")
