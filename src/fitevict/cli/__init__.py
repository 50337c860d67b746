"""The ``fitevict`` command line (typer + rich).

Each subcommand group lives in its own module under ``fitevict.cli`` and exposes
``register(app)``; ``COMMAND_MODULES`` lists them in the order ``--help`` shows them.
"""

from __future__ import annotations

import importlib
import sys

import typer

from fitevict import __version__

COMMAND_MODULES: tuple[str, ...] = (
    "fitevict.cli.engine",
    "fitevict.cli.zoo",
    "fitevict.cli.price",
    "fitevict.cli.serve",
    "fitevict.cli.admin",
    "fitevict.cli.report",
    "fitevict.cli.cluster",
)

# commands whose module alone serves them: ``fitevict serve`` does not import what only the other commands
# need (the zoo writer, the engine installer, the pricing tables' CLI, rich's progress bars)
ALONE: dict[str, str] = {"serve": "fitevict.cli.serve"}


def _new_app() -> typer.Typer:
    return typer.Typer(
        name="fitevict",
        help="Price local models' memory exactly, plan loads and evictions, and serve them behind an OpenAI-compatible "
             "API.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fitevict {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """fitevict: price -> plan -> supervise -> serve."""


def build(modules: tuple[str, ...] = COMMAND_MODULES) -> typer.Typer:
    """The command line with the commands of ``modules``."""
    cli = _new_app()
    cli.callback()(_root)
    for name in modules:
        importlib.import_module(name).register(cli)
    return cli


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # every command, built on first use
        globals()["app"] = built = build()
        return built
    raise AttributeError(name)


def main() -> None:
    alone = ALONE.get(sys.argv[1]) if len(sys.argv) > 1 else None
    build((alone,) if alone else COMMAND_MODULES)()
