"""``fitevict serve``: the OpenAI-compatible front door."""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console

err = Console(stderr=True)


@contextmanager
def config_errors() -> Iterator[None]:
    """The CLI's one handler of a configuration error (a bad key or value, a budget that cannot be, a model store
    that cannot be read): its message, then exit 2."""
    from fitevict.budget import BudgetError
    from fitevict.config import ConfigError

    try:
        yield
    except (ConfigError, BudgetError) as e:
        err.print(f"[red]config error:[/] {e}")
        raise typer.Exit(2) from e


def build_config(config: Path | None, overrides: dict):
    from fitevict.config import load_config

    with config_errors():
        return load_config(config, overrides={k: v for k, v in overrides.items() if v is not None})


def engine_binary(cfg) -> Path | None:
    """The llama-server the door runs, or None: the door then serves the other engines' models, and a llama-server
    model's load fails naming what is missing."""
    from fitevict.engines.llama_cpp.install import resolve_binary

    found = resolve_binary("llama-server", configured=cfg.engine.llama_server,
                           vulkan_devices=cfg.engine.vulkan_devices)
    if found.path is None:
        err.print(f"[yellow]note: no llama-server:[/] {found.why}; its models fail to load until one is installed")
        return None
    # the door and every seat it starts run with them (engine.vulkan_devices: GGML_VK_VISIBLE_DEVICES)
    os.environ.update(dict(found.env))
    return found.path


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _store_models(cfg) -> bool:
    """Whether a model store (Ollama, the Hugging Face cache, LM Studio) holds a model to serve; says, per store,
    where it was read and how many models it holds, or why it was not read."""
    from fitevict.sources import read_stores, store_lines

    with config_errors():
        scans = read_stores(cfg.stores)
    for line in store_lines(cfg.stores, scans):
        err.print(line)
    return any(scan.models for scan in scans)


def serve(
    config: Path | None = typer.Option(None, "--config", help="TOML config file (default: $FITEVICT_CONFIG or ~/.config/fitevict/config.toml)."),
    host: str | None = typer.Option(None, "--host", help="Bind address (default 127.0.0.1)."),
    port: int | None = typer.Option(None, "--port", help="Port (default 8080; 0 = any free port)."),
    models_dir: list[Path] = typer.Option([], "--models-dir", help="A folder of models; repeatable. A flat folder of GGUF files gives keys from the file stems."),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="Where the store and seat logs live."),
    ram_limit: str | None = typer.Option(None, "--ram-limit", help="Most host RAM fitevict's models may hold, e.g. 600MiB."),
    gpu_limit: str | None = typer.Option(None, "--gpu-limit", help="Most memory per GPU fitevict's models may hold."),
    idle_unload_seconds: float | None = typer.Option(None, "--idle-unload-seconds", help="Unload a used model after this long idle (0 = never)."),
    api_key: list[str] = typer.Option([], "--api-key", help="A user key (inference); repeatable."),
    admin_key: list[str] = typer.Option([], "--admin-key", help="An admin key (load, unload, plan); repeatable."),
    demo_if_empty: bool = typer.Option(False, "--demo-if-empty", help="With no models configured, serve the generated demo zoo."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
    ray_address: str | None = typer.Option(None, "--ray", help="Serve a Ray cluster (its address, or auto): a node agent on every node runs that node's own door; requests go to the node where their model is, or fits best (docs/cluster.md)."),
) -> None:
    """Serve the OpenAI-compatible API: load on demand, evict only what must go, record why."""
    overrides: dict = {
        "server.host": host, "server.port": port, "data_dir": str(data_dir) if data_dir else None,
        "budget.ram_limit": ram_limit, "budget.gpu_limit": gpu_limit,
        "policy.idle_unload_seconds": idle_unload_seconds,
        "models_dirs": [str(p) for p in models_dir] or None,
        "server.api_keys": list(api_key) or None, "server.admin_keys": list(admin_key) or None,
    }
    cfg = build_config(config, overrides)
    if ray_address is not None:
        _serve_cluster(ray_address, config, overrides, log_level)
    if not _store_models(cfg) and demo_if_empty and not cfg.models_dirs and not cfg.models:
        from fitevict.zoo import write_zoo

        demo = Path(cfg.data_dir) / "demo-models"
        err.print(f"no models configured: serving the demo zoo in {demo} (add --models-dir or a config to use yours)")
        write_zoo(demo, progress=lambda m: err.print(f"  {m}"))
        overrides["models_dirs"] = [str(demo)]
        cfg = build_config(config, overrides)
    engine_binary(cfg)  # its environment set for the door and its seats; a missing one is said before anything starts
    from fitevict.host.budget import budget_from_config

    with config_errors():  # a limit above the machine's total, or a reserve that leaves nothing, is a config error now
        budget = budget_from_config(cfg.budget)
    for note in budget.notes:
        err.print(f"note: {note}")
    if not _loopback(cfg.server.host) and not cfg.server.auth_enabled:
        err.print(f"[yellow]warning:[/] binding {cfg.server.host} without API keys: anyone who can reach this port "
                  f"can load models and run inference. Set --api-key/--admin-key or server.api_keys.")

    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        err.print(f"[red]bad --log-level:[/] {log_level!r}; use debug, info, warning or error")
        raise typer.Exit(2)
    # serve from a process without the CLI's libraries: same pid, same output (``fitevict.server.main``)
    from fitevict.server.main import argv_for

    argv = argv_for(config, {k: v for k, v in overrides.items() if v is not None}, log_level.lower())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


def _serve_cluster(address: str, config: Path | None, overrides: dict, log_level: str) -> None:
    """``--ray``: the cluster's front door (``fitevict.cluster.main``); each node's door loads the models."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        err.print("[red]--ray needs the ray extra:[/] pip install 'fitevict[ray]'")
        raise typer.Exit(2) from None
    from fitevict.cluster.main import argv_for

    argv = argv_for(address, config, {k: v for k, v in overrides.items() if v is not None}, log_level.lower())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
