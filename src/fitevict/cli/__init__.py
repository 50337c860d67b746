"""The ``fitevict`` command line (typer + rich).

Each subcommand group lives in its own module under ``fitevict.cli`` and exposes
``register(app)``; ``COMMAND_MODULES`` lists them in the order ``--help`` shows them.
"""

from __future__ import annotations

import importlib

import typer

from fitevict import __version__

COMMAND_MODULES: tuple[str, ...] = (
    "fitevict.cli.engine",
    "fitevict.cli.zoo",
    "fitevict.cli.price",
    "fitevict.cli.serve",
    "fitevict.cli.admin",
    "fitevict.cli.report",
)

app = typer.Typer(
    name="fitevict",
    help="Price local models' memory exactly, plan loads and evictions, and serve them behind an OpenAI-compatible API.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fitevict {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """fitevict: price -> plan -> supervise -> serve."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    app()
