"""``fitevict load``'s progress display: the server's load events (SSE) as a rich progress bar and lines."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

from fitevict.units import format_size


def sse_events(lines: Iterable[str]) -> Iterator[tuple[str, dict]]:
    """(event, data) of each SSE message; comment lines and blank keep-alives are skipped."""
    event, data = "message", []
    for line in lines:
        if not line:
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    if data:
        yield event, json.loads("\n".join(data))


def show_load(model: str, lines: Iterable[str], console: Console) -> bool:
    """Show a load's phases as they arrive; True when it ended ready."""
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
               TextColumn("{task.fields[note]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(f"{model}: plan", total=None, note="")
        for event, d in sse_events(lines):
            if event == "error":
                e = d.get("error", {})
                bar.update(task, description=f"{model}: failed", note="")
                console.print(f"[red]{d.get('status', '')}:[/] {e.get('message', d)}")
                return False
            if event == "done":
                return True
            phase = d.get("phase")
            if phase == "plan":
                console.print(f"plan: {d['message']}")
                for e in d.get("evict", []):
                    console.print(f"  will evict {e['model']} ({format_size(e['bytes'])})")
            elif phase == "evict":
                bar.update(task, description=f"{model}: evicting")
                console.print(f"evicted {d['model']}: freed {format_size(d.get('freed_bytes'))} "
                              f"({d.get('freed_source')})")
            elif phase == "start":
                bar.update(task, description=f"{model}: engine start", total=d["predicted_bytes"], completed=0,
                           note=f"pid {d['pid']}")
                console.print(f"engine started: {d['engine']} pid {d['pid']}; predicted "
                              f"{format_size(d['predicted_bytes'])} on the host ({d['predicted_source']})")
            elif phase == "weights":
                bar.update(task, description=f"{model}: weights in memory",
                           completed=min(d["resident_bytes"], d["predicted_bytes"] or d["resident_bytes"]),
                           note=f"{format_size(d['resident_bytes'])} measured")
            elif phase == "ready":
                total = d.get("predicted_bytes") or d.get("host_bytes") or 0
                bar.update(task, description=f"{model}: ready", total=total, completed=total,
                           note=f"{format_size(d.get('host_bytes'))} {d.get('host_source')}")
                console.print(f"ready: {d['message']} (predicted {format_size(d.get('predicted_bytes'))}, "
                              f"{d.get('predicted_source')})")
    return False
