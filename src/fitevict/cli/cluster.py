"""``fitevict cluster stop``: the node agents of a Ray cluster (``serve --ray``), and their doors."""

from __future__ import annotations

import importlib.util
import json

import typer
from rich.console import Console

console = Console()
err = Console(stderr=True)

app = typer.Typer(help="A Ray cluster's node agents (serve --ray; docs/cluster.md).", no_args_is_help=True)


@app.command("stop")
def stop(ray_address: str = typer.Option("auto", "--ray", help="The Ray cluster's address, or auto."),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """Stop every node agent on the cluster, and its door.

    Each door stops its seats (requests in flight finish within policy.shutdown_grace_seconds) and verifies their
    memory came back. The cluster's front doors lose those nodes: stop them first; a front door started again
    starts new agents (with the cluster key configured then)."""
    if importlib.util.find_spec("ray") is None:
        err.print("[red]cluster stop needs the ray extra:[/] pip install 'fitevict[ray]'")
        raise typer.Exit(2)
    from fitevict.cluster.stop import stop_agents

    try:
        rows = stop_agents(ray_address)
    except ConnectionError as e:
        err.print(f"[red]cannot reach the Ray cluster at {ray_address}:[/] {e}")
        raise typer.Exit(1) from e
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    elif not rows:
        console.print("no node agent runs on this cluster")
    for r in rows if not as_json else ():
        what = (f"door exited with {r['door_exit']}" if "door_exit" in r else
                f"gone: {r['gone']}" if "gone" in r else f"[red]{r['error']}[/]")
        console.print(f"node {r['node']}: agent stopped, {what}")
    if any("error" in r for r in rows):
        raise typer.Exit(1)


def register(cli: typer.Typer) -> None:
    cli.add_typer(app, name="cluster")
