"""``fitevict demo-models DIR``: write the demo GGUF zoo and list what is there."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from fitevict.units import format_size
from fitevict.zoo import ZOO_NAMES, ZooError, resolve_names, write_zoo
from fitevict.zoo_adapters import DEMO_BASE, write_adapters


def demo_models(
    dest: Path = typer.Argument(
        ..., metavar="DIR", help="Directory to write <name>.gguf files into (created if missing)."
    ),
    only: list[str] | None = typer.Option(
        None, "--only", metavar="NAME", help=f"Write only this model (repeatable). Names: {', '.join(ZOO_NAMES)}."
    ),
) -> None:
    """Write small deterministic GGUF test models (llama, MoE, SWA, quantized, ...) into DIR, and LoRA adapters
    for llama-gqa in DIR/llama-gqa.adapters/."""
    out = Console()
    err = Console(stderr=True)
    try:
        names = resolve_names(only or None)
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

            models = write_zoo(dest, only=names, progress=step)
            adapters = write_adapters(dest) if DEMO_BASE in names else []
            bar.update(task, completed=len(names))
    except ZooError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False)
        raise typer.Exit(2) from e
    except OSError as e:
        err.print(
            f"[red]error:[/red] writing the zoo into {dest} failed: {e}; free space or pick another DIR",
            highlight=False,
        )
        raise typer.Exit(1) from e

    table = Table(title=f"demo models in {dest}")
    table.add_column("name")
    table.add_column("arch")
    table.add_column("quant")
    table.add_column("size (file-size)", justify="right")
    table.add_column("path", overflow="fold")
    for m in models:
        table.add_row(m.name, m.arch, m.quant, format_size(m.file_bytes), str(m.path))
    out.print(table)
    if adapters:
        out.print(f"LoRA adapters of {DEMO_BASE} (served as {DEMO_BASE}:<name>), in "
                  f"{adapters[0].path.parent}: {', '.join(a.name for a in adapters)}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("demo-models")(demo_models)
