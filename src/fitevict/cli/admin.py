"""``fitevict plan`` (offline dry run) and ``ps`` / ``history`` / ``load`` / ``unload`` (against a running server)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import httpx
import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fitevict.host.pagecache import cached_words, residency
from fitevict.units import format_size

console = Console()
err = Console(stderr=True)

URL_HELP = "The fitevict server (default $FITEVICT_URL or http://127.0.0.1:8080)."


def _url(url: str | None) -> str:
    return (url or os.environ.get("FITEVICT_URL") or "http://127.0.0.1:8080").rstrip("/")


def _client(url: str | None, key: str | None) -> httpx.Client:
    key = key or os.environ.get("FITEVICT_ADMIN_KEY") or os.environ.get("FITEVICT_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=_url(url), headers=headers, timeout=httpx.Timeout(600, connect=5))


def admin_call(url: str | None, key: str | None, method: str, path: str, **kw: Any) -> Any:
    try:
        with _client(url, key) as c:
            r = c.request(method, path, **kw)
    except httpx.TransportError as e:
        err.print(f"[red]cannot reach fitevict at {_url(url)}:[/] {e}. Is `fitevict serve` running? (--url)")
        raise typer.Exit(1) from e
    _check(r)
    return r.json()


def _check(r: httpx.Response) -> None:
    """Exit 1 with the server's own message on an HTTP error."""
    if r.status_code < 400:
        return
    r.read()
    try:
        msg = r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = r.text
    err.print(f"[red]{r.status_code}:[/] {msg}")
    raise typer.Exit(1)


def _parse_sizes(items: list[str], flag: str) -> dict[str, int]:
    from fitevict.units import SizeError, parse_size

    out: dict[str, int] = {}
    for item in items:
        name, sep, size = item.partition("=")
        if not sep:
            err.print(f"[red]{flag} {item!r}:[/] expected NAME=SIZE, e.g. CUDA0=24GiB")
            raise typer.Exit(2)
        try:
            out[name] = parse_size(size, name=f"{flag} {name}")
        except SizeError as e:
            err.print(f"[red]{e}[/]")
            raise typer.Exit(2) from e
    return out


def plan_cmd(
    model: str = typer.Argument(..., help="Model key or alias."),
    config: Path | None = typer.Option(None, "--config", help="fitevict TOML config."),
    models_dir: list[Path] = typer.Option([], "--models-dir", help="A folder of models; repeatable."),
    ctx: int | None = typer.Option(None, "--ctx", "-c", help="Context size (0 = training context)."),
    kv_cache_type: str | None = typer.Option(None, "--kv-cache-type", help="f16, q8_0 or q4_0."),
    flash_attn: bool | None = typer.Option(None, "--flash-attn/--no-flash-attn"),
    alloc_mode: str | None = typer.Option(None, "--alloc-mode", help="gpu-only, max-gpu, max-ram, ram-only, explicit."),
    n_gpu_layers: int | None = typer.Option(None, "--n-gpu-layers", "-ngl", help="For --alloc-mode explicit."),
    n_cpu_moe: int | None = typer.Option(None, "--n-cpu-moe", help="For --alloc-mode explicit."),
    ram_limit: str | None = typer.Option(None, "--ram-limit", help="Ceiling on host RAM for fitevict's models."),
    gpu_limit: str | None = typer.Option(None, "--gpu-limit", help="Ceiling on each device, or per device by the "
                                         "engine's names: Vulkan0=100MiB,RPC0=200MiB."),
    ram: str | None = typer.Option(None, "--ram", help="Plan for a machine with this much host RAM free (declared), instead of this one."),
    gpu: list[str] = typer.Option([], "--gpu", help="Plan for a device NAME=SIZE free (declared), e.g. CUDA0=24GiB or Vulkan0=2GiB (devices.uma declares it unified); repeatable."),
    residents: Path | None = typer.Option(None, "--residents", help='JSON list of residents: [{"key", "bytes": {"CPU": n, "CUDA0": n}, "last_used", "pinned", "protected", "in_flight"}].'),
    server: str | None = typer.Option(None, "--server", help="Ask a running fitevict for its plan instead (its residents, its budget)."),
    key: str | None = typer.Option(None, "--key", help="Admin key for --server."),
    as_json: bool = typer.Option(False, "--json", help="Print the Plan as JSON."),
) -> None:
    """Dry run: what loading MODEL would do now (load, partial, ram, hit, wait or refuse) and why. Changes nothing."""
    contract_fields = {"ctx": ctx, "kv_cache_type": kv_cache_type, "flash_attn": flash_attn, "alloc_mode": alloc_mode,
                       "n_gpu_layers": n_gpu_layers, "n_cpu_moe": n_cpu_moe}
    contract_json = {k: v for k, v in contract_fields.items() if v is not None}
    if server:
        out = admin_call(server, key, "POST", f"/v1/models/{model}/plan", json=contract_json)
        if out.get("node") and not as_json:  # a cluster's front door: the node its routing picks
            console.print(f"node {escape(out['node'])} ({escape(str(out.get('route')))})")
        if out.get("plan") is None:
            err.print(f"[red]no node answered a dry run for {escape(model)}[/]")
            raise typer.Exit(1)
        _show_plan(out["plan"], out.get("budget"), as_json, out.get("page_cache"))
        return

    from fitevict.cli.serve import build_config

    cfg = build_config(config, {"models_dirs": [str(p) for p in models_dir] or None,
                                "budget.ram_limit": ram_limit, "budget.gpu_limit": gpu_limit})
    budget = _offline_budget(cfg, ram, gpu)
    res = _declared_residents(residents) if residents is not None else []
    the_plan, path = _offline_plan(cfg, model, contract_json, budget, res)
    _show_plan(the_plan.to_json(), budget.to_json(), as_json, residency(path).to_json())


def _offline_plan(cfg, model: str, contract_json: dict, budget, residents: list):
    """The server's plan for ``model`` without a server: the same price book, primed from the same store (stored
    measurements, corrections, the engine's and the transformers seats' overheads), and the same policy; with the
    file (or folder) a load of it reads."""
    from fitevict import planner as pl
    from fitevict.engines.llama_cpp.install import resolve_binary
    from fitevict.pricing.gguf import PricingError
    from fitevict.request.ask import ask
    from fitevict.request.catalog import Catalog, GgufFileError, UnknownModel
    from fitevict.request.contract import Contract, ContractError, parse_contract
    from fitevict.store import Store
    from fitevict.prices.learned import plan_policy, prime_price_book
    from fitevict.prices.book import PriceBook

    try:
        entry = Catalog.from_config(cfg).resolve(model)
        contract = parse_contract(contract_json or None) or Contract()
        # without an engine here the plan is priced without its process overhead, as a first load would be
        binary = resolve_binary("llama-server", configured=cfg.engine.llama_server,
                                vulkan_devices=cfg.engine.vulkan_devices).path or Path("llama-server")
        with Store.open(cfg.store_url) as store:
            book = PriceBook(store, binary.parent, cfg.policy.default_alloc_mode)
            prime_price_book(book, store, binary, calibrate=False)
            asked = ask(entry, contract, book)
            sheet = book.read_sheet(asked.path, asked.request.config)  # the server's planner prices from the same sheet
            return pl.plan(asked.request, residents, budget, lambda _k, c: sheet.footprint(c), plan_policy(cfg),
                           time.time()), asked.path
    except (UnknownModel, ContractError, GgufFileError, PricingError) as e:
        err.print(f"[red]{e}[/]")
        raise typer.Exit(2) from e


def _offline_budget(cfg, ram: str | None, gpu: list[str]):
    """This machine's budget under the config (its devices as the engine build lists them, with ``devices.rpc``), or
    a declared machine (``--ram``, ``--gpu NAME=SIZE``; ``devices.uma`` says which declared devices are unified)."""
    from fitevict.budget import Budget, BudgetError, per_device
    from fitevict.engines.llama_cpp.install import resolve_binary
    from fitevict.engines.llama_cpp.census import take_census
    from fitevict.host.budget import budget_from_config

    try:
        if ram is None and not gpu:
            binary = resolve_binary("llama-server", configured=cfg.engine.llama_server).path
            census = take_census(binary, rpc=cfg.devices.rpc, declared=cfg.devices.uma) if binary else None
            return budget_from_config(cfg.budget, census=census)
        from fitevict.units import parse_size

        spec: dict[str, Any] = {}
        if ram is not None:
            spec["CPU"] = {"total": parse_size(ram, name="--ram"), "reserve": 0,
                           **({"limit": cfg.budget.ram_limit} if cfg.budget.ram_limit else {})}
        for name, size in _parse_sizes(gpu, "--gpu").items():
            limit = per_device(cfg.budget.gpu_limit, name, None)
            spec[name] = {"total": size, "reserve": 0, "unified": cfg.devices.uma.get(name, False),
                          **({"limit": limit} if limit else {})}
        if "CPU" not in spec:
            from fitevict.host.procmem import read_meminfo

            m = read_meminfo()
            spec["CPU"] = {"total": m.total_bytes, "free": m.available_bytes, "reserve": cfg.budget.ram_reserve,
                           **({"limit": cfg.budget.ram_limit} if cfg.budget.ram_limit else {})}
        return dataclasses.replace(Budget.declared(spec), rpc=cfg.devices.rpc)
    except BudgetError as e:
        err.print(f"[red]{e}[/]")
        raise typer.Exit(2) from e


def _declared_residents(path: Path) -> list:
    """``--residents FILE``: a JSON list of residents, each figure labelled declared."""
    from fitevict import planner as pl
    from fitevict.pricing.loadconfig import LoadConfig

    try:
        return [pl.Resident(key=r["key"], config=LoadConfig.from_json(r.get("config", {})),
                            bytes={k: int(v) for k, v in r["bytes"].items()},
                            last_used=float(r.get("last_used", 0.0)), bytes_source="declared",
                            pinned=bool(r.get("pinned")), protected=bool(r.get("protected")),
                            in_flight=int(r.get("in_flight", 0)))
                for r in json.loads(path.read_text())]
    except (OSError, ValueError, KeyError, TypeError) as e:
        err.print(f"[red]--residents {path}:[/] {e!r}; expected a JSON list of "
                  '{"key": str, "bytes": {"CPU": int, ...}, "last_used": float, "pinned": bool, "in_flight": int}')
        raise typer.Exit(2) from e


def compact_table(title: str | None, columns: list[str], *, right: tuple[str, ...] = ()) -> Table:
    """A table for an 80-column terminal: no outer frame, one space between columns, and long cells folded onto a
    second line instead of cut with an ellipsis (the full figures are in --json)."""
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0), title_justify="left",
              show_edge=False)
    for col in columns:
        t.add_column(col, overflow="fold", justify="right" if col in right else "left")
    return t


def _show_plan(plan: dict, budget: dict | None, as_json: bool, cached: dict | None = None) -> None:
    if as_json:
        typer.echo(json.dumps({**plan, "budget": budget, "page_cache": cached}, indent=2, default=str))
        return
    colour = {"refuse": "red", "wait": "yellow"}.get(plan["action"], "green")
    console.print(f"[bold {colour}]{plan['action']}[/] {escape(plan['key'])}: {escape(plan['reason'])}")
    if plan.get("remedy"):
        console.print(f"remedy: {escape(plan['remedy'])}")
    cols = ["device", "needed", "budget", "free now", "free after", "avail."]
    t = compact_table("bytes per device", cols, right=tuple(cols[1:]))
    unified = {d["name"]: d.get("unified_source", "") for d in (budget or {}).get("devices", []) if d.get("unified")}
    for dev in plan["budget_bytes"]:
        t.add_row(f"{dev} (unified: counted in CPU too)" if dev in unified else dev, *(format_size(plan[k].get(dev)) if plan[k].get(dev) is not None else "-" for k in
                         ("needed_bytes", "budget_bytes", "free_bytes_before", "free_bytes_after", "available_bytes")))
    console.print(t)
    console.print("[dim]needed: predicted (formula / dry run); avail.: after the evictions allowed; residents: "
                  "measured or declared[/]")
    for dev, source in unified.items():
        console.print(f"[dim]{escape(dev)} is unified memory ({escape(source)}): its budget is carved out of RAM; "
                      f"its bytes count in CPU's needed and free as well, and its own budget is a limit inside "
                      f"CPU's[/]")
    if cached:
        got = (f"{format_size(cached['resident_bytes'])} of {format_size(cached['file_bytes'])}"
               if cached["resident_bytes"] is not None else "")
        console.print(f"[dim]its file in the page cache: {cached_words(cached)} {got} ({escape(cached['source'])}; "
                      f"{cached['counted']})[/]")
    for e in plan["evict"]:
        console.print(f"evict {escape(e['key'])}: {escape(e['reason'])}")
    if plan.get("wait_for"):
        console.print(f"waits for in-flight requests on: {escape(', '.join(plan['wait_for']))}")


def ps(url: str | None = typer.Option(None, "--url", help=URL_HELP), key: str | None = typer.Option(None, "--key"),
       as_json: bool = typer.Option(False, "--json")) -> None:
    """What a running fitevict has loaded (like `ollama ps`)."""
    doc = admin_call(url, key, "GET", "/v1/models/residents")
    data = doc["data"]
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    console.print(ps_table(data, time.time(), _url(url)))
    if doc.get("queued"):
        console.print(queued_table(doc["queued"]))
    console.print("[dim]host: measured (the latest reading); pred.: predicted; cached: its file in the page cache "
                  "(measured: mincore; reclaimable, never budgeted); busy: in flight + waiting; --json: every figure "
                  "with its source[/]")
    usage = admin_call(url, key, "GET", "/health").get("data_dir")
    if usage:
        console.print(f"[dim]data folder {escape(data_dir_line(usage))}[/]")


def queued_table(queued: list[dict]) -> Table:
    """The requests waiting for a seat, in the queue's order, each with the wait estimated for it now."""
    t = compact_table("waiting (est.: from its place, the measured loads and service ahead of it)",
                      ["model", "client", "class", "waited", "est.", "ahead", "loads"],
                      right=("waited", "est.", "ahead", "loads"))
    for q in queued:
        e = q["estimate"]
        t.add_row(q["model"], q["client"], q["class"], f"{q['waited_seconds']:.1f} s", f"{e['seconds']:.1f} s",
                  str(e["position"]), str(e["placements"]))
    return t


def data_dir_line(usage: dict) -> str:
    """The data folder's measured size by part (``/health``'s ``data_dir``), in one line."""
    if usage.get("total_bytes") is None:
        return f"{usage.get('path')}: size unavailable, because {usage.get('why')}"
    parts = ", ".join(f"{k} {format_size(v)}" for k, v in sorted(usage["parts"].items(), key=lambda kv: -kv[1]) if v)
    return f"{usage['path']}: {format_size(usage['total_bytes'])} on disk ({parts or 'empty'})"


def _where(placement: str) -> str:
    """ "100% CPU" -> "cpu"; "40%/60% CPU/GPU" -> "gpu 60%". """
    return "cpu" if placement == "100% CPU" else "gpu " + placement.split("/")[1].split(" ")[0]


def ps_table(data: list[dict], now: float, url: str) -> Table:
    """The residents; from a cluster's front door (rows that name their node), the node first (its id's head); the
    store a model came from when any came from another tool's store than a models dir."""
    nodes = any("node" in r for r in data)
    stores = any(r.get("store") not in (None, "models-dir") for r in data)
    t = compact_table(f"residents of {url}",
                      ["node"] * nodes + ["model"] + ["store"] * stores + ["state", "where", "host", "pred.",
                                                                          "cached", "ctx", "busy", "unload in"],
                      right=("host", "pred.", "cached", "ctx", "busy"))
    for r in data:
        cpu = r["devices"].get("CPU", {})
        unload = (f"{max(0, r['unload_at'] - now):.0f} s" if r.get("unload_at") else
                  "unused" if r["last_used"] is None else "off")
        ts = (r.get("config") or {}).get("tensor_split")
        where = _where(r["placement"]) + (f" split {'/'.join(f'{w:g}' for w in ts)}" if ts else "")
        t.add_row(*[str(r.get("node") or "")[:8]] * nodes, r["key"], *[r.get("store") or ""] * stores, r["state"],
                  where,
                  format_size(cpu.get("measured_bytes")) + ("!" if r.get("outgrew") else ""),
                  format_size(cpu.get("predicted_bytes")), cached_words(r.get("page_cache")), str(r["ctx"]),
                  f"{r['in_flight']}+{r.get('waiting', 0)}", unload)
    if any(r.get("outgrew") for r in data):
        t.caption = "!: outgrowing its price (its reading exceeds it by more than budget.outgrow_margin; stopped " \
                    "first under memory pressure; fitevict history --event outgrew)"
    return t


def history_cmd(url: str | None = typer.Option(None, "--url", help=URL_HELP),
                key: str | None = typer.Option(None, "--key"),
                model: str | None = typer.Option(None, "--model"), event: str | None = typer.Option(None, "--event"),
                since: float | None = typer.Option(None, "--since", help="Unix seconds."),
                limit: int = typer.Option(50, "--limit"), as_json: bool = typer.Option(False, "--json")) -> None:
    """What fitevict did and why: loads, evictions, unloads, failures, refusals, crashes, orphans."""
    params = {k: v for k, v in {"model": model, "event": event, "since": since, "limit": limit}.items() if v is not None}
    data = admin_call(url, key, "GET", "/v1/models/history", params=params)["data"]
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    console.print(history_table(data))


def history_table(data: list[dict]) -> Table:
    t = compact_table("history (host: each figure with what it is; freed: measured, what came back)",
                      ["time", "event", "model", "secs", "host", "freed", "why"], right=("secs", "host", "freed"))
    stops = ("evict", "unload", "idle-unload", "crash")
    for e in data:
        b = e["bytes"]
        t.add_row(time.strftime("%H:%M:%S", time.localtime(e["time"])), e["event"], e["model"] or "",
                  f"{e['seconds']:.2f}" if e["seconds"] is not None else "",
                  _labelled(b["host"], (e.get("sources") or {}).get("host")),
                  format_size(b["freed"], unavailable="n/a") if e["event"] in stops else "",
                  _short(e["strategy"] or e["reason"] or "") + _served(e.get("engine_timings")))
    t.caption = "why: the reason's first words (a stop: what its seat served); --json has all of it"
    return t


def _labelled(n: int | None, source: str | None) -> str:
    """A figure and the first word of its source (measured, planned, engine-reported, predicted), "n/a" when the
    event has none."""
    if n is None:
        return "n/a"
    kind = re.match(r"[a-z-]+", source or "")
    return f"{format_size(n)}\n{kind.group(0)}" if kind else format_size(n)  # the kind under it: a narrow column


def _served(timings: dict | None) -> str:
    """What a stopped seat served, from the engine's own timings summed over its answers (measured)."""
    if not timings:
        return ""
    tps = timings.get("predicted_per_second")
    return f"\nserved {timings['answers']}" + (f", {tps:g} tok/s" if tps is not None else "")


def _short(text: str) -> str:
    """The head of a reason or strategy: before its first colon, semicolon or parenthesis (--json has it all)."""
    for sep in (": ", "; ", " ("):
        text = text.split(sep)[0]
    return text


def load_cmd(model: str, url: str | None = typer.Option(None, "--url", help=URL_HELP),
             key: str | None = typer.Option(None, "--key"), ctx: int | None = typer.Option(None, "--ctx"),
             alloc_mode: str | None = typer.Option(None, "--alloc-mode"),
             as_json: bool = typer.Option(False, "--json", help="No progress bar: print the resident view as JSON.")
             ) -> None:
    """Load MODEL on a running fitevict (evicting what the plan says), with its progress: plan, evictions,
    engine start, weights in memory (measured against predicted), ready."""
    body = {k: v for k, v in {"ctx": ctx, "alloc_mode": alloc_mode}.items() if v is not None}
    if as_json:
        typer.echo(json.dumps(admin_call(url, key, "POST", f"/v1/models/{model}/load", json=body), indent=2))
        return
    from fitevict.cli.progress import show_load

    try:
        with _client(url, key) as c, c.stream("POST", f"/v1/models/{model}/load", params={"stream": "true"},
                                              json=body) as r:
            _check(r)
            ok = show_load(model, r.iter_lines(), console)
    except httpx.TransportError as e:
        err.print(f"[red]cannot reach fitevict at {_url(url)}:[/] {e}. Is `fitevict serve` running? (--url)")
        raise typer.Exit(1) from e
    if not ok:
        raise typer.Exit(1)


def unload_cmd(model: str, url: str | None = typer.Option(None, "--url", help=URL_HELP),
               key: str | None = typer.Option(None, "--key")) -> None:
    """Unload MODEL on a running fitevict and report whether its memory came back."""
    typer.echo(json.dumps(admin_call(url, key, "POST", f"/v1/models/{model}/unload"), indent=2))


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)
    app.command("ps")(ps)
    app.command("history")(history_cmd)
    app.command("load")(load_cmd)
    app.command("unload")(unload_cmd)
