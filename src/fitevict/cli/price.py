"""``fitevict price MODEL.gguf [llama-server flags]``: what a model costs, per device and term, with sources.

``fitevict price -- llama-server -m X.gguf -c 4096 ...`` prices an exact command line. The buffers are the footprint;
the engine process's own host memory beyond them (its part calibrated for the engine fitevict would run, and the
parts that scale with the model) is shown apart, with the host total a seat is planned at.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from fitevict.cli.price_hf import footprint_table, parse_max_memory, price_hf_folder
from fitevict.engines.llama_cpp.dryrun import DryRun
from fitevict.engines.llama_cpp.install import SERVER
from fitevict.pricing.cmdline import parse_server_argv
from fitevict.pricing.hf_price import HfLoadConfig
from fitevict.pricing.safetensors import is_hf_folder
from fitevict.pricing.gguf import GgufStructure, PricingError, load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.engines.llama_cpp.devprobe import buffer_names, rules_for
from fitevict.engines.llama_cpp.machine import host_buffers
from fitevict.pricing.hostbufs import dry_run_check
from fitevict.pricing.footprint import HOST, Footprint
from fitevict.pricing.price import Pricing, price
from fitevict.units import format_size


def _dry_run(model: Path, cfg: LoadConfig, enabled: bool | None,
             extra_args: tuple[str, ...] = ()) -> tuple[DryRun | None, str]:
    """The engine's dry run (compute bytes, and the caches it sized) when a binary is found and it is not
    disabled, else why not."""
    if enabled is False:
        return None, "dry run disabled (--no-dry-run)"
    from fitevict.engines.llama_cpp.dryrun import Unavailable, dry_run
    from fitevict.engines.llama_cpp.install import resolve_binary

    found = resolve_binary("llama-server")
    if found.path is None:
        return None, f"no engine for a dry run: {found.why}"
    res = dry_run(found.path.parent, model, cfg, extra_args=extra_args)
    if isinstance(res, Unavailable):
        return None, res.reason
    return res, ""


def _device_rules(s: GgufStructure, cfg: LoadConfig, probe: bool) -> tuple[dict, list[str]]:
    """Each device's backend rules as the engine fitevict would run answers them (stored, else probed now when the
    engine may be run), and what could not be learned."""
    from fitevict.engines.llama_cpp.install import resolve_binary

    found = resolve_binary("llama-server")
    return rules_for(found.path, s, cfg, probe)


def process_overhead(s: GgufStructure, cfg: LoadConfig) -> dict:
    """The engine process's own host memory beyond its buffers, as the server prices it: the calibrated part of the
    llama-server fitevict would run (unavailable when that build was never calibrated) and the model's own parts."""
    from fitevict.engines.llama_cpp.install import resolve_binary
    from fitevict.engines.llama_cpp.overhead import calibratable, calibrated_overhead, model_terms, shared_pages

    found = resolve_binary("llama-server")
    calibrated = calibrated_overhead(found.path) if found.path is not None else None
    fixed = calibrated.get(HOST) if calibrated else None
    terms = model_terms(s, cfg, host_buffers())
    why = (found.why if found.path is None else "this build was never calibrated (fitevict engine install does it)")
    pages = shared_pages(found.path) if found.path is not None and calibratable(found.path) else None
    return {"calibrated_bytes": fixed,
            "calibrated_source": ("measured: peak PSS beyond the buffers and the binary's own file pages through a "
                                  "filled context of the calibration model" if fixed is not None
                                  else f"unavailable, because {why}"),
            "terms": [t.to_json() for t in terms], "bytes": (fixed or 0) + sum(t.bytes for t in terms),
            # the binary's own file pages: not in the price; the first seat of the binary carries them
            "shared_pages": pages.to_json() if pages is not None else None}


def rpc_server_overhead(s: GgufStructure, cfg: LoadConfig, fp: Footprint) -> dict:
    """Each RPC device's rpc-server beyond the engine's buffers there (``pricing/rpcserver``: rules), and the
    device as planned: its buffers and those parts."""
    from fitevict.pricing.placement import place
    from fitevict.pricing.rpcserver import rpc_devices, rpc_server_parts

    if not rpc_devices(cfg):
        return {}
    parts = rpc_server_parts(s, cfg, place(s, cfg, host_buffers()))
    return {d: {"terms": [t.to_json() for t in ts], "bytes": (n := sum(t.bytes for t in ts)),
                "device_planned_bytes": fp.bytes_on(d) + n} for d, ts in parts.items() if fp.device(d) is not None}


def to_json(s: GgufStructure, cfg: LoadConfig, p: Pricing) -> dict:
    fp = p.footprint
    return {
        "model": s.path,
        "file_bytes": s.file_bytes,
        "arch": s.arch,
        "n_layer": s.n_layer,
        # per block, as llama.cpp decides it: attention, attention+swa, recurrent, attention+recurrent or none
        "layer_kinds": [s.kinds.kind(il, s.swa_layers[il]) for il in range(s.n_layer)],
        "config": p.config_json(cfg),
        "devices": [d.to_json() for d in fp.devices],
        "buffers": [{"name": b.name, "device": b.device, "bytes": b.bytes, "mapped": b.mapped} for b in p.buffers],
        "host_buffers": p.host_buffers,  # where the extra host buffer rules (AMX, CPU_REPACK, ...) came from
        # each device, the name of its buffers and where its backend's rules came from (probe or rule table)
        "device_rules": [{"device": d, "buffer": b, "rules": r} for d, b, r in p.device_rules],
        "kv": {**p.kv.to_json(), "source": p.context_source} if p.kv else None,
        "output_at_load_bytes": p.output_at_load,
        "host": {"mapped_bytes": fp.host_mapped_bytes, "committed_bytes": fp.host_committed_bytes},
        "process": (proc := process_overhead(s, cfg)),  # beyond the buffers: the engine process's own
        "host_planned_bytes": fp.bytes_on(HOST) + proc["bytes"],
        # an RPC device's rpc-server holds more than the engine's buffers there: its own parts, by rule
        "rpc_servers": rpc_server_overhead(s, cfg, fp),
        "total_bytes": fp.total_bytes,
        "warnings": list(p.warnings),
    }


def price_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(..., metavar="MODEL.gguf", help="GGUF file, or `-- llama-server -m X.gguf ...`."),
    ctx_size: int = typer.Option(4096, "-c", "--ctx-size", help="Context size (0 = the model's training context)."),
    parallel: int | None = typer.Option(None, "-np", "--parallel", help="Slots (absent: 4 slots, unified KV)."),
    n_gpu_layers: int = typer.Option(0, "-ngl", "--n-gpu-layers", "--gpu-layers", help="Layers on the GPU (-1 all)."),
    n_cpu_moe: int = typer.Option(0, "-ncmoe", "--n-cpu-moe", help="Keep experts of the first N layers on the CPU."),
    cache_type_k: str = typer.Option("f16", "-ctk", "--cache-type-k", help="K cache type."),
    cache_type_v: str = typer.Option("f16", "-ctv", "--cache-type-v", help="V cache type."),
    flash_attn: str = typer.Option("auto", "-fa", "--flash-attn", help="on | off | auto."),
    ubatch: int = typer.Option(512, "-ub", "--ubatch-size", help="Physical batch size."),
    batch: int = typer.Option(2048, "-b", "--batch-size", help="Logical batch size."),
    load_mode: str = typer.Option("auto", "-lm", "--load-mode", help="auto | mmap | none (none = no mmap)."),
    kv_unified: bool | None = typer.Option(None, "-kvu/-no-kvu", "--kv-unified/--no-kv-unified",
                                           help="One KV buffer shared by all slots."),
    swa_full: bool = typer.Option(False, "--swa-full", help="Full-size SWA cache."),
    device: str = typer.Option("none", "-dev", "--device",
                               help="Devices, e.g. CUDA0,CUDA1, Vulkan0 or RPC0,RPC1 (none = CPU only)."),
    rpc: str | None = typer.Option(None, "--rpc", help="rpc-server endpoints HOST:PORT[,...]: devices RPC0, RPC1, ..."),
    tensor_split: str | None = typer.Option(None, "-ts", "--tensor-split",
                                            help="Each device's share of the offloaded layers, e.g. 3,1."),
    no_kv_offload: bool = typer.Option(False, "-nkvo", "--no-kv-offload", help="Keep the KV cache in host memory."),
    override_tensor: list[str] = typer.Option(
        [], "-ot", "--override-tensor", help="PATTERN=BUFFER_TYPE[,...]: put matching weights in CPU or a device."),
    embeddings: bool = typer.Option(False, "--embeddings", "--embedding", help="An embeddings seat."),
    pooling: str | None = typer.Option(None, "--pooling", help="none | mean | cls | last | rank (graph only)."),
    dry_run: bool | None = typer.Option(None, "--dry-run/--no-dry-run",
                                        help="Take the compute buffer from the engine's dry run (default: when found)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    dtype: str = typer.Option("auto", "--dtype", help="HF folders: auto (as stored) | float32 | bfloat16 | float16."),
    quant: str = typer.Option("none", "--quant", help="HF folders: none | bnb4 | bnb8 (bitsandbytes at load)."),
    double_quant: bool = typer.Option(False, "--double-quant", help="HF folders: bnb4 with double quantization."),
    device_map: str = typer.Option("cpu", "--device-map", help="HF folders: cpu | CUDA0 | split (with --max-memory)."),
    max_memory: list[str] = typer.Option([], "--max-memory", help="HF folders, split: GPU=SIZE, e.g. CUDA0=2GiB."),
) -> None:
    """Price a model's memory per device: model, context, compute and output buffers, each with its source.

    MODEL may also be a Hugging Face folder (config.json + *.safetensors, or a diffusers pipeline)."""
    err = Console(stderr=True)
    if is_hf_folder(Path(model)):
        _price_hf(model, ctx_size, dtype, quant, double_quant, device_map, max_memory, as_json, err)
        return
    try:
        if Path(model).name in (SERVER, f"{SERVER}.exe"):
            cmd = parse_server_argv([model, *ctx.args])
            path, cfg, notes = Path(cmd.model), cmd.config, list(cmd.warnings)
        else:
            if ctx.args:
                raise PricingError(f"unexpected arguments {' '.join(ctx.args)}; "
                                   "to price a command line write: fitevict price -- llama-server -m X.gguf ...")
            cmd = parse_server_argv(["-m", model, "-c", str(ctx_size), "-ngl", str(n_gpu_layers),
                                     "--n-cpu-moe", str(n_cpu_moe), "-ctk", cache_type_k, "-ctv", cache_type_v,
                                     "-fa", flash_attn, "-ub", str(ubatch), "-b", str(batch), "-lm", load_mode,
                                     *(["--rpc", rpc] if rpc else []), "-dev", device,
                                     *(["-ts", tensor_split] if tensor_split else []),
                                     *(["-nkvo"] if no_kv_offload else []),
                                     *(["-np", str(parallel)] if parallel is not None else []),
                                     *(["-kvu" if kv_unified else "-no-kvu"] if kv_unified is not None else []),
                                     *(["--swa-full"] if swa_full else []),
                                     *[x for v in override_tensor for x in ("-ot", v)],
                                     *(["--embeddings"] if embeddings else []),
                                     *(["--pooling", pooling] if pooling is not None else [])])
            path, cfg, notes = Path(cmd.model), cmd.config, list(cmd.warnings)
        s = load_structure(path)
        # the engine's dry run sizes the compute buffer, and the caches of an architecture fitevict has no rules for
        dry, why = _dry_run(path, cfg, dry_run, cmd.dry_run_args)
        backends, probe_notes = _device_rules(s, cfg, dry_run is not False)
        p = price(s, cfg, compute=dry.compute if dry else None, context=dry.context if dry else None,
                  host=host_buffers(), backends=backends, buffer_names=buffer_names(backends))
        notes += probe_notes
    except PricingError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False)
        raise typer.Exit(2) from e
    warnings = _warnings(notes, p, cfg, dry, why)
    if as_json:
        out = to_json(s, cfg, p)
        out["warnings"] = warnings
        typer.echo(json.dumps(out, indent=2))
        return
    _show(s, cfg, p, warnings)


def _price_hf(model: str, ctx_size: int, dtype: str, quant: str, double_quant: bool, device_map: str,
              max_memory: list[str], as_json: bool, err: Console) -> None:
    """A Hugging Face folder's price (exits 2 on a configuration it cannot take)."""
    try:
        cfg_hf = HfLoadConfig(n_ctx=ctx_size, dtype=dtype, quant=quant, bnb4_double_quant=double_quant,  # type: ignore[arg-type]
                              device_map=device_map, max_memory=parse_max_memory(max_memory))
    except (PricingError, ValueError) as e:
        err.print(f"[red]error:[/red] {e}", highlight=False)
        raise typer.Exit(2) from e
    price_hf_folder(model, cfg_hf, as_json)


def _warnings(notes: list[str], p: Pricing, cfg: LoadConfig, dry: DryRun | None, why: str) -> list[str]:
    """What the price's reader should know: the command line's notes, pricing's, why compute is a formula, and where
    the engine's own dry run disagrees with the host buffer table."""
    sources = {d.compute.source for d in p.footprint.devices}
    label = "compute from a formula" if "formula" in sources else "compute unavailable"
    out = [*notes, *p.warnings, *([f"{label}: {why}"] if dry is None and why else [])]
    if dry is not None and dry.model_mib and cfg.repack:  # the engine's own whole-MiB rows check the table
        out += dry_run_check(((b.name, b.bytes) for b in p.buffers), dry.model_mib)
    return out


def _show(s: GgufStructure, cfg: LoadConfig, p: Pricing, warnings: list[str]) -> None:
    """The price as text: the configuration, the footprint per device and term, the model buffers and the notes."""
    con = Console()
    c = p.config_json(cfg)
    con.print(f"[bold]{s.path}[/bold]  {s.arch}, {s.n_layer} layers, file {format_size(s.file_bytes)}", highlight=False)
    con.print(f"n_ctx {c['n_ctx']} (per slot {c['n_ctx_seq']}), slots {c['parallel']}, "
              f"kv_unified {c['kv_unified']}, -ngl {c['n_gpu_layers']}, K {c['cache_type_k']} / V {c['cache_type_v']}, "
              f"flash_attn {c['flash_attn']}, ubatch {c['ubatch']}, mmap {c['mmap']}", highlight=False)
    con.print(footprint_table(p.footprint))
    bt = Table(title="model buffers (as llama.cpp names them)")
    for col in ("buffer", "device", "bytes", "size", "kind"):
        bt.add_column(col)
    for b in p.buffers:
        bt.add_row(b.name, b.device, str(b.bytes), format_size(b.bytes), "mapped (page cache)" if b.mapped else "committed")
    con.print(bt)
    con.print(f"host buffer rules: {p.host_buffers}", highlight=False)
    for d, b, r in p.device_rules:
        con.print(f"device {d}: buffers {b}; rules {r}", highlight=False)
    if p.kv:
        k = p.kv
        con.print(f"KV: {k.cells} cells x {k.layers_full} layers, SWA {k.cells_swa} cells x {k.layers_swa} layers, "
                  f"recurrent layers {k.layers_recurrent} ({p.context_source})", highlight=False)
    if cfg.embeddings:
        con.print(f"output: {format_size(p.output_at_load)} at load; an embeddings seat grows it to "
                  f"{format_size(p.footprint.device('CPU').output.value)} with its first full batch",  # type: ignore[union-attr]
                  highlight=False)
    fp = p.footprint
    con.print(f"host: mapped {format_size(fp.host_mapped_bytes)} + committed {format_size(fp.host_committed_bytes)}",
              highlight=False)
    proc = process_overhead(s, cfg)
    parts = ", ".join(f"{t['name']} {format_size(t['bytes'])}" for t in proc["terms"])
    fixed = (format_size(proc["calibrated_bytes"]) if proc["calibrated_bytes"] is not None
             else proc["calibrated_source"])
    con.print(f"engine process beyond its buffers: calibrated {fixed}; the model's own: {parts}; host as planned "
              f"{format_size(fp.bytes_on(HOST) + proc['bytes'])}", highlight=False)
    for dev, server in rpc_server_overhead(s, cfg, fp).items():
        parts = ", ".join(f"{t['name']} {format_size(t['bytes'])}" for t in server["terms"])
        con.print(f"{dev}'s rpc-server beyond its buffers: {parts}; {dev} as planned "
                  f"{format_size(server['device_planned_bytes'])}", highlight=False)
    for w in warnings:
        con.print(f"[yellow]note:[/yellow] {w}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command(
        "price",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(price_cmd)
