"""``fitevict report``: peak memory per model and engine over stored serving windows, judged against thresholds
declared in a file before the run; ``--ab`` compares two configurations of one model over swapped legs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console

console = Console()
err = Console(stderr=True)


def _selector(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            err.print(f"[red]{flag} {item!r}:[/] expected FIELD=VALUE of the seat's load configuration, "
                      "e.g. cache_type_k=q8_0")
            raise typer.Exit(2)
        out[k] = v
    return out


def report_cmd(
    thresholds: Path | None = typer.Option(None, "--thresholds", help="TOML file of limits ([default] and "
                                           "[models.NAME]: peak_pss, peak_rss, peak_gpu, peak_available_drop), "
                                           "written before the serving run."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    out: Path | None = typer.Option(None, "--out", help="Write report.md and report.json into this folder."),
    model: str | None = typer.Option(None, "--model", help="Only this model."),
    since: float | None = typer.Option(None, "--since", help="Only windows that started at or after (unix s)."),
    ab: str | None = typer.Option(None, "--ab", help="A/B mode: compare two configurations of this model."),
    a: list[str] = typer.Option([], "--a", help="A/B: leg A's FIELD=VALUE (repeatable), e.g. cache_type_k=q8_0."),
    b: list[str] = typer.Option([], "--b", help="A/B: leg B's FIELD=VALUE (repeatable), e.g. cache_type_k=f16."),
    config: Path | None = typer.Option(None, "--config", help="fitevict TOML config (for store_url)."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="fitevict's data folder (its store)."),
    store_url: str | None = typer.Option(None, "--store-url", help="The store's URL (sqlite:///... or postgresql)."),
) -> None:
    """Peak PSS, RSS, GPU and MemAvailable drop per model and engine, each beside its declared threshold."""
    from fitevict.cli.admin import data_dir_line
    from fitevict.cli.serve import build_config
    from fitevict.host.datadir import data_dir_usage
    from fitevict.report import (ThresholdsError, ab_markdown, compare, legs, load_thresholds, markdown,
                                 report_rows)
    from fitevict.store import Store
    from fitevict.store.peaks import q_peaks

    try:
        limits = load_thresholds(thresholds) if thresholds is not None else None
    except ThresholdsError as e:
        err.print(f"[red]{e}[/]")
        raise typer.Exit(2) from e
    cfg = build_config(config, {"data_dir": str(data_dir) if data_dir else None, "store_url": store_url})
    with Store.open(cfg.store_url) as store:
        windows = store.read(q_peaks(model or ab, since))
    if ab is not None:
        sel_a, sel_b = _selector(a, "--a"), _selector(b, "--b")
        if not sel_a or not sel_b:
            err.print("[red]--ab needs --a FIELD=VALUE and --b FIELD=VALUE[/] (the two configurations compared)")
            raise typer.Exit(2)
        pairs = legs(windows, ab, sel_a, sel_b)
        comps = compare(pairs)
        doc = {"model": ab, "a": sel_a, "b": sel_b, "legs": [{"leg": leg, **w.to_json()} for leg, w in pairs],
               "comparisons": [c.to_json() for c in comps]}
        text = ab_markdown(ab, sel_a, sel_b, pairs, comps)
    else:
        rows = report_rows(windows, limits)
        doc = {"generated_at": time.time(), "store": cfg.store_url,
               "thresholds": None if limits is None else {"path": limits.path, "sha256": limits.sha256,
                                                          "declared_at": limits.declared_at},
               "rows": [r.to_json() for r in rows], "windows": [w.to_json() for w in windows]}
        text = markdown(rows, limits)
        if not rows:
            text += "\nNo serving windows stored yet: serve some models, then stop them or the server.\n"
        doc["data_dir"] = data_dir_usage(Path(cfg.data_dir)).to_json()
        text += f"\nData folder {data_dir_line(doc['data_dir'])} (measured now; `[logs]` bounds it).\n"
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(text)
        (out / "report.json").write_text(json.dumps(doc, indent=2))
        err.print(f"wrote {out / 'report.md'} and {out / 'report.json'}")
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
    else:
        typer.echo(text)


def _contract(text: str, flag: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as e:
        err.print(f"[red]{flag} {text!r}:[/] not JSON: {e}; e.g. '{{\"kv_cache_type\": \"q8_0\"}}'")
        raise typer.Exit(2) from e
    if not isinstance(value, dict):
        err.print(f"[red]{flag}:[/] expected a JSON object (a load contract), got {type(value).__name__}")
        raise typer.Exit(2)
    return value


def leg_order(pairs: int) -> str:
    """Swapped pairs: AB BA AB BA ..., so a drift over the run weighs on both sides alike."""
    return "".join("AB" if i % 2 == 0 else "BA" for i in range(pairs))


def ab_cmd(
    model: str = typer.Argument(..., help="The model to compare under two configurations."),
    a: str = typer.Option(..., "--a", help='Leg A\'s load contract (JSON), e.g. \'{"kv_cache_type": "q8_0"}\'.'),
    b: str = typer.Option(..., "--b", help="Leg B's load contract (JSON)."),
    pairs: int = typer.Option(2, "--pairs", min=2, help="Swapped pairs to run (2: A B B A)."),
    prompt: str = typer.Option("Write a short poem about memory.", "--prompt", help="What each leg serves."),
    max_tokens: int = typer.Option(32, "--max-tokens", min=1),
    url: str | None = typer.Option(None, "--url", help="The fitevict server (default $FITEVICT_URL)."),
    key: str | None = typer.Option(None, "--key", help="Admin key."),
    as_json: bool = typer.Option(False, "--json"),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait for the last leg's window to be stored."),
) -> None:
    """Run swapped A/B legs of MODEL on a running fitevict; compare their peaks above the noise floor."""
    from fitevict.cli.admin import admin_call
    from fitevict.report import ab_markdown, compare
    from fitevict.store.peaks import SeatPeaks

    sides = {"A": _contract(a, "--a"), "B": _contract(b, "--b")}
    order = leg_order(pairs)
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    before = {w["id"] for w in admin_call(url, key, "GET", "/dashboard/report.json")["windows"] if w["id"] is not None}
    admin_call(url, key, "POST", f"/v1/models/{model}/unload")
    for i, leg in enumerate(order):
        err.print(f"leg {i + 1}/{len(order)}: {leg} {json.dumps(sides[leg])}")
        admin_call(url, key, "POST", "/v1/chat/completions", json={**body, "fitevict": sides[leg]})
        admin_call(url, key, "POST", f"/v1/models/{model}/unload")
    deadline = time.monotonic() + timeout
    while True:
        new = [w for w in admin_call(url, key, "GET", "/dashboard/report.json")["windows"]
               if w["id"] is not None and w["id"] not in before and w["model"] == model]
        if len(new) >= len(order) or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # the server stores a window right after its seat stops: poll it over HTTP
    if len(new) < len(order):
        err.print(f"[red]only {len(new)} of {len(order)} legs' windows were stored within {timeout:.0f} s[/]")
        raise typer.Exit(1)
    new.sort(key=lambda w: w["started_at"])
    windows = [SeatPeaks(**{k: v for k, v in w.items()}) for w in new[-len(order):]]
    legs = list(zip(order, windows))
    comps = compare(legs)
    if as_json:
        typer.echo(json.dumps({"model": model, "a": sides["A"], "b": sides["B"], "order": order,
                               "legs": [{"leg": leg, **w.to_json()} for leg, w in legs],
                               "comparisons": [c.to_json() for c in comps]}, indent=2))
    else:
        typer.echo(ab_markdown(model, {"contract": json.dumps(sides["A"])}, {"contract": json.dumps(sides["B"])},
                               legs, comps))


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
    app.command("ab")(ab_cmd)
