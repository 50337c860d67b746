"""The serving process of ``fitevict serve``.

``fitevict serve`` reads its options and checks the settings with the CLI's libraries (typer, rich), then
replaces itself with this entry point (``os.execv``: the same pid, the same stdout and stderr), so the process that
serves for days holds none of them: typer alone brings pydantic, about 20 MiB of the front door's memory
(``docs/benchmarks.md``). What it is given is what ``serve`` checked: the config file, the overrides from the
command line and the log level; it loads the same config through the same function.

    python -m fitevict.server.main --overrides '{"server.port": 8080}' [--config FILE] [--log-level info]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path


#: Modules a library imports only for a command line of its own, which the serving process never runs: httpx's
#: ``__init__`` imports ``httpx._main`` (its CLI) when click is installed, and with it click, rich and pygments,
#: ~4 MiB of the front door's idle RSS (docs/benchmarks.md). Marked absent before anything imports httpx, the
#: library takes its own fallback (it catches the ImportError).
NOT_SERVED = ("httpx._main",)


def leave_out_command_lines() -> None:
    """Keep the libraries' own command-line modules out of this process (``NOT_SERVED``)."""
    for name in NOT_SERVED:
        if name.partition(".")[0] not in sys.modules:
            sys.modules.setdefault(name, None)  # type: ignore[assignment]  # import machinery: "not importable"


def argv_for(config: Path | None, overrides: dict, log_level: str) -> list[str]:
    """The command line that runs this entry point with these settings (what ``serve`` execs)."""
    argv = [sys.executable, "-m", "fitevict.server.main", "--overrides", json.dumps(overrides),
            "--log-level", log_level]
    return argv + (["--config", str(config)] if config is not None else [])


def _fail(what: str, detail: object) -> int:
    print(f"{what}: {detail}", file=sys.stderr, flush=True)
    return 2


def main(args: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fitevict-serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=None)
    ap.add_argument("--overrides", default="{}", help="settings by dotted key, as JSON")
    ap.add_argument("--log-level", default="info")
    ns = ap.parse_args(args)
    leave_out_command_lines()
    from fitevict.host.heap import limit_arenas

    limit_arenas()  # before any thread of the door allocates (host.heap)

    from fitevict.config import ConfigError, load_config, redact_url
    from fitevict.engines import build_pricer

    try:
        cfg = load_config(ns.config, overrides=json.loads(ns.overrides))
    except ConfigError as e:
        return _fail("config error", e)
    found, why, default = build_pricer().resolve_build(cfg.engine.llama_server)
    if found is None:  # the door serves the other engines' models; a llama-server model's load says why not
        print(f"note: no llama-server: {why}; its models fail to load until one is installed", file=sys.stderr)
    binary = found or default

    logging.basicConfig(level=ns.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    # the format above names no source line, thread or process: skip finding them for every request's line
    # (the "Optimization" table of Python's logging HOWTO)
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False

    from fitevict.request.catalog import Catalog
    from fitevict.server.app import create_app
    from fitevict.server.runner import serve as run_server
    from fitevict.store import Store, StoreError, StoreVersionError

    try:
        catalog = Catalog.from_config(cfg)
    except ConfigError as e:
        return _fail("config error", e)
    for note in catalog.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"fitevict: {len(catalog)} models, engine {found or 'none'}, store {redact_url(cfg.store_url)}",
          file=sys.stderr, flush=True)
    try:
        store = Store.open(cfg.store_url)
    except (StoreError, StoreVersionError, OSError) as e:
        return _fail(f"store error: {redact_url(cfg.store_url)}", e)
    app = create_app(cfg, engine_binary=binary, catalog=catalog, store=store, own_store=True)
    summary = run_server(app, app.state.supervisor, host=cfg.server.host, port=cfg.server.port,
                         log_level=ns.log_level)
    if summary is not None:
        print(summary.line(), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
