"""``fitevict engine install|list``: provision the pinned llama.cpp and show which binary is used."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fitevict.engines.llama_cpp import install as inst
from fitevict.engines.base import Unavailable
from fitevict.engines.llama_cpp.machine import build_report
from fitevict.engines.llama_cpp.overhead import calibrate_overhead, calibrated_overhead
from fitevict.pricing.footprint import HOST
from fitevict.units import format_size

engine_app = typer.Typer(help="Provision and inspect inference engines.", no_args_is_help=True)
console = Console()
err = Console(stderr=True)


def _lookup(config: Path | None) -> dict:
    """The lookup's settings from the config file, if one is given or found: engine.llama_server and
    engine.vulkan_devices, as resolve_binary takes them."""
    from fitevict.cli.serve import build_config

    cfg = build_config(config, {})
    return {"configured": str(cfg.engine.llama_server) if cfg.engine.llama_server else None,
            "vulkan_devices": cfg.engine.vulkan_devices}


@engine_app.command("install")
def install_cmd(
    engine: str = typer.Argument("llama.cpp", help="Engine to build. Only llama.cpp is provisioned by fitevict."),
    force: bool = typer.Option(False, "--force", help="Rebuild even when a complete install exists."),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Parallel build jobs (default: all cores)."),
    cuda: bool = typer.Option(False, "--cuda", help="Build with CUDA (needs nvcc) into its own directory; "
                              "the cache step of the lookup then prefers it."),
    vulkan: bool = typer.Option(False, "--vulkan", help="Build with Vulkan (AMD, Intel, NVIDIA GPUs and APUs; Debian: "
                                "mesa-vulkan-drivers libvulkan-dev glslc spirv-headers) into its own directory, beside "
                                "the CPU build; the lookup chooses it where it lists a GPU."),
    cuda_arch: str = typer.Option("native", "--cuda-arch", help="CMAKE_CUDA_ARCHITECTURES for --cuda, e.g. 89;90 "
                                  "(native needs a visible GPU while building)."),
) -> None:
    """Build llama-server, llama-fit-params, llama-quantize and ggml-rpc-server from llama-cpp-python's vendored
    llama.cpp: the CPU build, or with --vulkan / --cuda a device build beside it."""
    if engine != inst.ENGINE:
        err.print(f"[red]unknown engine {engine!r}[/]: fitevict provisions only {inst.ENGINE!r}")
        raise typer.Exit(2)
    if cuda and vulkan:
        err.print("[red]--cuda and --vulkan build two variants[/]: install one, then the other")
        raise typer.Exit(2)
    variant = "cuda" if cuda else "vulkan" if vulkan else "cpu"
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), console=err, transient=False) as bar:
        task = bar.add_task(f"{inst.SDIST_PACKAGE}=={inst.SDIST_VERSION}", total=1.0)

        def progress(msg: str, frac: float | None) -> None:
            bar.update(task, description=msg[:70], **({"completed": frac} if frac is not None else {}))

        try:
            result = inst.install(force=force, jobs=jobs or None, progress=progress,
                                  variant=variant, cuda_arch=cuda_arch)
        except inst.EngineInstallError as e:
            bar.stop()
            err.print(f"[red]engine install failed:[/] {e}")
            raise typer.Exit(1) from e
        bar.update(task, completed=1.0, description="done")
    what = "already installed" if result.already else f"built in {result.seconds:.0f} s"
    applied = result.stamp.get("patches") or []
    console.print(f"llama.cpp {inst.LLAMA_CPP_COMMIT} ({inst.SDIST_PACKAGE}=={inst.SDIST_VERSION}), "
                  f"{inst.VARIANT_NAMES[variant]}, {what}" + (f"; source patches: {', '.join(applied)}" if applied else ""))
    for b in inst.BINARIES:
        console.print(f"  {result.bin_dir / b}")
    if variant == "vulkan":
        _say_vulkan_devices(result.bin_dir / "llama-server")
    server = result.bin_dir / "llama-server"
    if calibrated_overhead(server) is None:
        got = calibrate_overhead(server)
        if isinstance(got, Unavailable):
            err.print(f"[yellow]process overhead not calibrated:[/] {got.reason} (it is learned after a first load)")
        else:
            console.print(f"process overhead: {format_size(got['overhead'][HOST])} beside the rules that scale with "
                          f"the model (measured in {got['seconds']:.1f} s: peak PSS {format_size(got['pss_bytes'])} "
                          f"through a filled context, minus buffers {format_size(got['buffer_bytes'])} and "
                          f"{format_size(sum(t['bytes'] for t in got['terms']))} of the calibration model's own)")
    _probe(server, again=False)


def _say_vulkan_devices(server: Path) -> None:
    """The devices the Vulkan build lists as the lookup would run it, and so whether the lookup chooses it."""
    import os

    from fitevict.engines.llama_cpp import vulkan

    choice = vulkan.lookup(server, os.environ, vulkan.visible_setting(None, os.environ))
    console.print(f"  devices: {choice.words()}; "
                  + ("the lookup chooses this build" if choice.chosen else "the lookup keeps the CPU build"))


def _probe(server: Path, *, again: bool) -> None:
    """Learn this machine's extra host buffers from the engine (once per build and CPU, unless ``again``)."""
    from fitevict.engines.llama_cpp.probe import probe
    from fitevict.engines.llama_cpp.machine import stored_probe, this_cpu

    table = None if again else stored_probe(server)
    if table is None:
        got = probe(server, say=lambda m: err.print(f"  {m}"))
        if isinstance(got, Unavailable):
            err.print(f"[yellow]host buffers not probed:[/] {got.reason}; pricing uses the rule table for this CPU")
            return
        table = got
    console.print(f"host buffers on {this_cpu().describe()}: {table.label()}")
    for e in table.extras:
        kinds = ", ".join(f"{t} (rows % {r.row_multiple}{', packed' if r.bytes_per_block else ''})"
                          for t, r in e.types)
        console.print(f"  {e.name}: {kinds or 'no weight kind probed'}")
    for note in table.notes:
        err.print(f"[yellow]  note:[/] {note}")


@engine_app.command("probe")
def probe_cmd(
    config: Path | None = typer.Option(None, "--config", help="fitevict TOML config (engine.llama_server)."),
) -> None:
    """Ask the engine which extra host buffer (AMX, CPU_REPACK, ...) each kind of weight lands in on this machine,
    and store the answer for pricing (``engine install`` does this once per build and CPU)."""
    r = inst.resolve_binary(**_lookup(config))
    if r.path is None:
        err.print(f"[red]no llama-server:[/] {r.why}")
        raise typer.Exit(1)
    _probe(r.path, again=True)


@engine_app.command("list")
def list_cmd(
    config: Path | None = typer.Option(None, "--config", help="fitevict TOML config (engine.llama_server, "
                                       "engine.vulkan_devices)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Show which engine binaries will be used and why (config, $FITEVICT_LLAMA_SERVER, PATH, cache), and every
    build in the cache (CPU, Vulkan, CUDA)."""
    lookup = _lookup(config)
    rows = [inst.resolve_binary(b, **lookup) for b in inst.BINARIES]
    versions = {r.name: _version_now(r.path) for r in rows if r.path and r.name == inst.SERVER}
    builds = {r.name: build_report(r.path) for r in rows if r.path}
    cached = _cached_builds(rows[0])
    if as_json:
        typer.echo(json.dumps([
            {"name": r.name, "path": str(r.path) if r.path else None, "why": r.why,
             "version": versions.get(r.name), "build": builds.get(r.name), "env": dict(r.env),
             "candidates": [{"source": c.source, "path": str(c.path) if c.path else None, "status": c.status}
                            for c in r.candidates],
             **({"cached_builds": cached} if r.name == inst.SERVER else {})}
            for r in rows], indent=2))
        return
    table = Table(title="engine binaries (lookup: config → $FITEVICT_LLAMA_SERVER → PATH → cache)")
    for col in ("binary", "path", "why", "version", "build"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.name, str(r.path) if r.path else "[red]none[/]", r.why, versions.get(r.name, ""),
                      _build_words(builds[r.name]) if r.name in builds else "")
    console.print(table)
    table = Table(title=f"builds in the cache ({inst.engine_root()})")
    for col in ("build", "folder", "state", "source patches", "lookup"):
        table.add_column(col)
    for b in cached:
        table.add_row(inst.VARIANT_NAMES[b["variant"]], Path(b["bin_dir"]).name, b["state"], ", ".join(b["patches"]) or "none",
                      b["lookup"])
    console.print(table)
    if any(r.path is None for r in rows):
        raise typer.Exit(1)


def _cached_builds(server: inst.Resolution) -> list[dict]:
    """Each build variant in the cache: installed or not, its patches, and what the lookup made of it."""
    out = []
    for variant in inst.VARIANTS:
        bin_dir = inst.installed_bin_dir(variant=variant)
        stamp = inst.read_stamp(variant=variant)
        said = next((c.status for c in server.candidates if c.source == "cache" and c.path is not None
                     and c.path.parent == bin_dir), None)
        state = ("installed, " + ", ".join(stamp.get("binaries", inst.BINARIES)) if stamp else "not installed"
                 + (f" (fitevict engine install llama.cpp --{variant})" if variant != "cpu" else
                    " (fitevict engine install llama.cpp)"))
        out.append({"variant": variant, "bin_dir": str(bin_dir), "installed": stamp is not None, "state": state,
                    "patches": list(stamp.get("patches", [])) if stamp else [],
                    "build_seconds": stamp.get("build_seconds") if stamp else None,
                    "lookup": said or ""})  # "used", "shadowed", "passed over: <why>"
    return out


def _version_now(path: Path) -> str:
    """What the binary on disk says of itself now (its ``--version`` line), or why it says nothing."""
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable, because {path} --version failed: {e}"
    lines = (out.stdout + out.stderr).strip().splitlines()
    return next((x for x in lines if x.startswith("version:")), lines[-1] if lines else "")


def _build_words(report: dict) -> str:
    """The build column: as installed, changed since (and how), or not installed by fitevict."""
    rec = report["recorded"]
    if rec is None:
        return f"{report['build']} (no install record beside it)"
    then = f"installed llama.cpp {rec['commit']} ({rec['variant']}), {' '.join(rec['version'])}"
    if report["changed"] is None:
        return f"as installed: {then}"
    return f"[red]changed since installed[/]: {then}; now {report['changed']}"


def register(app: typer.Typer) -> None:
    app.add_typer(engine_app, name="engine")
