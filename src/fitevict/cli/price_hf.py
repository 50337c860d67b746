"""``fitevict price HF_DIR``: a Hugging Face folder's footprint, in the same JSON shape as a GGUF price."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from fitevict.pricing.footprint import Footprint
from fitevict.pricing.gguf import PricingError
from fitevict.pricing.hf_price import HfLoadConfig, HfPricing, price_hf
from fitevict.pricing.safetensors import HfStructure, load_hf_structure
from fitevict.units import format_size, parse_size


def parse_max_memory(values: list[str]) -> tuple[tuple[str, int], ...]:
    """``CUDA0=2GiB`` options as (device, bytes) pairs."""
    out = []
    for v in values:
        dev, sep, size = v.partition("=")
        if not sep or not dev:
            raise PricingError(f"--max-memory {v!r}: write DEVICE=SIZE, e.g. CUDA0=2GiB")
        out.append((dev, parse_size(size, name=f"--max-memory {dev}")))
    return tuple(out)


def _buffers(p: HfPricing) -> list[dict]:
    """Weights grouped by how they are held, per device: the HF counterpart of llama.cpp's model buffers."""
    where = dict(p.placement)
    rows: dict[tuple[str, str], int] = {}
    for w in p.weights:
        key = (f"weights ({w.kind})", where[w.group])
        rows[key] = rows.get(key, 0) + w.bytes
        if w.quant_state_bytes:
            k2 = (f"{w.kind} quant_state", where[w.group])
            rows[k2] = rows.get(k2, 0) + w.quant_state_bytes
    first = p.placement[0][1] if p.placement else "CPU"
    for what, b in p.extra_buffers:
        rows[(what, first)] = rows.get((what, first), 0) + b
    mapped = p.footprint.host_mapped_bytes > 0
    return [{"name": n, "device": d, "bytes": b, "mapped": mapped and n == "weights (stored)" and d == "CPU"}
            for (n, d), b in rows.items()]


def to_json(s: HfStructure, cfg: HfLoadConfig, p: HfPricing) -> dict:
    fp = p.footprint
    c = s.config.get("text_config", s.config)
    return {
        "model": s.path, "file_bytes": s.file_bytes, "arch": s.arch, "engine": "transformers",
        "n_layer": c.get("num_hidden_layers") if isinstance(c, dict) else None,
        "config": {**cfg.to_json(), "n_ctx": p.n_ctx},
        "devices": [d.to_json() for d in fp.devices],
        "buffers": _buffers(p),
        "kv": {**p.kv.to_json(), "source": "formula"} if p.kv else None,
        "compute_formula": p.compute_formula,
        "weights": {"stored_bytes": s.stored_bytes, "held_bytes": p.weight_bytes, "model_bytes": p.model_bytes,
                    "quant_method": s.quant_method},
        "placement": [{"module": g, "device": d} for g, d in p.placement],
        "host": {"mapped_bytes": fp.host_mapped_bytes, "committed_bytes": fp.host_committed_bytes},
        "total_bytes": fp.total_bytes,
        "warnings": list(p.warnings),
    }


def footprint_table(fp: Footprint) -> Table:
    """The footprint per device (GGUF and HF prices alike): each term with its source."""
    def cell(t) -> str:  # type: ignore[no-untyped-def]
        return f"{format_size(t.bytes)} [dim]({t.source})[/dim]"

    t = Table(title="footprint per device (source)")
    for col in ("device", "model", "context", "compute", "output", "total"):
        t.add_column(col, justify="left" if col == "device" else "right")
    for d in fp.devices:
        t.add_row(d.name, cell(d.model), cell(d.context), cell(d.compute), cell(d.output), format_size(d.total_bytes))
    return t


def price_hf_folder(path: str, cfg: HfLoadConfig, as_json: bool) -> None:
    """Print the price of one HF folder (exit 2 with the reason for a folder or configuration it cannot price)."""
    try:
        s = load_hf_structure(path)  # type: ignore[arg-type]
        p = price_hf(s, cfg)
    except PricingError as e:
        Console(stderr=True).print(f"[red]error:[/red] {e}", highlight=False)
        raise typer.Exit(2) from e
    if as_json:
        typer.echo(json.dumps(to_json(s, cfg, p), indent=2))
        return
    con = Console()
    con.print(f"[bold]{s.path}[/bold]  {s.arch} ({s.kind}), safetensors {format_size(s.file_bytes)}", highlight=False)
    con.print(f"n_ctx {p.n_ctx}, dtype {cfg.dtype}, quant {cfg.quant}, device_map {cfg.device_map}", highlight=False)
    con.print(footprint_table(p.footprint))
    bt = Table(title="weights as held")
    for col in ("what", "device", "bytes", "size"):
        bt.add_column(col)
    for b in _buffers(p):
        bt.add_row(b["name"], b["device"], str(b["bytes"]), format_size(b["bytes"]))
    con.print(bt)
    if p.kv:
        k = p.kv
        con.print(f"KV: {k.layers_full} full layers x {k.cells} tokens, {k.layers_swa} sliding layers x "
                  f"{k.cells_swa} tokens, {k.bytes_per_token_layer} B per token and layer (formula)", highlight=False)
    con.print(f"compute: {p.compute_formula}", highlight=False)
    fp = p.footprint
    con.print(f"host: mapped {format_size(fp.host_mapped_bytes)} + committed {format_size(fp.host_committed_bytes)}",
              highlight=False)
    for w in p.warnings:
        con.print(f"[yellow]note:[/yellow] {w}", highlight=False)
