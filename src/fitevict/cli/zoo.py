"""``fitevict demo-models DIR``: write the demo GGUF zoo (and, with the torch extra, the HF zoo) and list it;
``--life-size``: the life-size zoo instead (models at the shapes of public models, on the engine's vocabularies)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from fitevict.engines.llama_cpp.install import resolve_binary, source_dir
from fitevict.units import format_size
from fitevict.zoo import ZOO_NAMES, ZOO_VERSION, ZooError, ZooModel, resolve_names, write_zoo
from fitevict.zoo.lifesize import write_life_size
from fitevict.zoo.lifesize_recipes import LIFE_SIZE_NAMES
from fitevict.zoo.gguf_adapters import DEMO_BASE, write_adapters
from fitevict.zoo.peft import DEMO_PEFT_BASE, write_peft_adapters
from fitevict.zoo.hf import HF_ZOO_NAMES, torch_available, write_hf_zoo


def demo_models(
    dest: Path = typer.Argument(
        ..., metavar="DIR", help="Directory to write <name>.gguf files into (created if missing)."
    ),
    only: list[str] | None = typer.Option(
        None, "--only", metavar="NAME",
        help=f"Write only this model (repeatable). Names: {', '.join(ZOO_NAMES + HF_ZOO_NAMES)}; with "
             f"--life-size: {', '.join(LIFE_SIZE_NAMES)}."
    ),
    hf: bool | None = typer.Option(None, "--hf/--no-hf",
                                   help="Also build the HF folders (default: when the torch extra is installed)."),
    zoo_version: int = typer.Option(ZOO_VERSION, "--zoo-version", min=1, max=ZOO_VERSION,
                                    help="2: realistic shapes (64-wide heads, FFN multiples of 64); 1: the first "
                                         "zoo's files, byte for byte (the known answers' models)."),
    life_size: bool = typer.Option(False, "--life-size",
                                   help="Write the life-size zoo instead: models at the shapes of public models "
                                        "(0.07 to 4.5 GB each, about 10 GB in all) with the engine's real "
                                        "vocabularies (needs `fitevict engine install llama.cpp`)."),
) -> None:
    """Write small deterministic GGUF test models (llama, MoE, SWA, quantized, ...) into DIR, and tiny HF folders
    (GQA llama, sliding window, MoE, tied embeddings, a diffusers pipeline) when torch is installed, and LoRA
    adapters for llama-gqa in DIR/llama-gqa.adapters/ (and PEFT adapters for hf-llama-gqa in
    DIR/hf-llama-gqa.adapters/ with the HF folders). With --life-size: Qwen2.5-0.5B, Llama-3.2-1B (and a
    Q4_K_M of it made by llama-quantize), Gemma-3-1B, Llama-3.1-8B, a Qwen3-MoE with 128 experts and a BGE
    embedder, random weights and the tokenizers the engine's source ships; a file already written is reused."""
    out = Console()
    err = Console(stderr=True)
    if life_size:
        _print_table(out, dest, _write_life_size(dest, only or None, err))
        return
    wanted = only or None
    hf_names = [n for n in (wanted or HF_ZOO_NAMES) if n in HF_ZOO_NAMES]
    gguf_wanted = [n for n in wanted if n not in HF_ZOO_NAMES] if wanted else None
    build_hf = bool(hf_names) and (hf if hf is not None else (torch_available() or bool(wanted)))
    hf_models = []
    adapters = []
    peft = []
    try:
        names = resolve_names(gguf_wanted, zoo_version) if gguf_wanted is not None or not wanted else []
        with Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err, transient=True
        ) as bar:
            task = bar.add_task("demo models", total=len(names))
            done = 0

            def step(line: str) -> None:
                nonlocal done
                bar.console.print(f"  {line}", highlight=False)
                bar.update(task, description=line, completed=done)
                done += 1

            models = write_zoo(dest, only=names, progress=step, version=zoo_version) if names else []
            adapters = write_adapters(dest) if DEMO_BASE in names else []
            bar.update(task, completed=len(names))
            if build_hf:
                hf_models = write_hf_zoo(dest, only=hf_names, progress=lambda line: bar.console.print(f"  {line}"))
                peft = write_peft_adapters(dest / DEMO_PEFT_BASE) if DEMO_PEFT_BASE in hf_names else []
    except ZooError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False)
        raise typer.Exit(2) from e
    except OSError as e:
        err.print(
            f"[red]error:[/red] writing the zoo into {dest} failed: {e}; free space or pick another DIR",
            highlight=False,
        )
        raise typer.Exit(1) from e

    _print_table(out, dest, models, hf_models)
    if adapters:
        out.print(f"LoRA adapters of {DEMO_BASE} (served as {DEMO_BASE}:<name>), in "
                  f"{adapters[0].path.parent}: {', '.join(a.name for a in adapters)}", highlight=False)
    if peft:
        out.print(f"PEFT adapters of {DEMO_PEFT_BASE} (served as {DEMO_PEFT_BASE}:<name>), in "
                  f"{peft[0].path.parent}: {', '.join(a.name for a in peft)}", highlight=False)


def _print_table(out: Console, dest: Path, models: list[ZooModel], hf_models: list = ()) -> None:
    table = Table(title=f"demo models in {dest}")
    table.add_column("name")
    table.add_column("arch")
    table.add_column("quant")
    table.add_column("size (file-size)", justify="right")
    table.add_column("path", overflow="fold")
    for m in models:
        table.add_row(m.name, m.arch, m.quant, format_size(m.file_bytes), str(m.path))
    for h in hf_models:
        table.add_row(h.name, h.arch, "safetensors", format_size(h.file_bytes), str(h.path))
    out.print(table)


def _write_life_size(dest: Path, only: list[str] | None, err: Console) -> list[ZooModel]:
    """The life-size zoo into ``dest``, a line per model on stderr; a named error (exit 2, or 1 for the disk)."""
    quantize = resolve_binary("llama-quantize").path
    try:
        with err.status("life-size models") as status:
            def step(line: str) -> None:
                err.print(f"  {line}", highlight=False)
                status.update(line)

            written = write_life_size(source_dir(), dest, only=only, quantize=quantize, progress=step)
    except ZooError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False)
        raise typer.Exit(2) from e
    except OSError as e:
        err.print(f"[red]error:[/red] writing the life-size zoo into {dest} failed: {e}; free space (about 10 GB "
                  f"for all of it) or pick another DIR", highlight=False)
        raise typer.Exit(1) from e
    return [w.model for w in written]


def register(app: typer.Typer) -> None:
    app.command("demo-models")(demo_models)
