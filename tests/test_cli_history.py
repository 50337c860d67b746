"""``fitevict history``'s table: each host figure says what it is (a planned figure is never shown as measured)."""

from __future__ import annotations

from rich.console import Console

from fitevict.cli.admin import history_table


def _row(event: str, host: int | None, source: str | None) -> dict:
    return {"time": 0.0, "event": event, "model": "m", "seconds": 1.0, "strategy": None, "reason": "r",
            "engine_timings": None, "bytes": {"host": host, "freed": None}, "sources": {"host": source}}


def test_each_host_figure_says_what_it_is() -> None:
    rows = [_row("load", 100 * 2**20, "planned: the larger of measured PSS (smaps_rollup) and the engine-reported "
                 "buffers + engine overhead"),
            _row("load", 50 * 2**20, "measured: PSS (smaps_rollup)"),
            _row("refuse", 70 * 2**20, "predicted (formula): nothing measured"),
            _row("fail", None, "n/a")]
    con = Console(record=True, width=200)
    con.print(history_table(rows))
    text = con.export_text()
    assert "bytes measured" not in text and "host: each figure with what it is" in text.replace("\n", " ")
    lines = [line.split() for line in text.splitlines()]  # each figure, and its kind on the line under it
    for figure, kind in (("100 MiB", "planned"), ("50.0 MiB", "measured"), ("70.0 MiB", "predicted")):
        at = next(i for i, words in enumerate(lines) if " ".join(words).find(figure) >= 0)
        assert kind in lines[at + 1], (figure, kind, text)
    assert "n/a" in text
