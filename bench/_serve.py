"""A real ``fitevict serve`` for a bench: its own process group and log, a config file of its own, /health awaited,
always stopped with its seats. The machine's model stores are not read (every store switched off)."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from fitevict.engines.process import free_port, stop_group

STORES_OFF = {"FITEVICT_OLLAMA": "false", "FITEVICT_HF_CACHE": "false", "FITEVICT_LMSTUDIO": "false"}


@dataclass(frozen=True, slots=True)
class Served:
    """One running front door: its name in the bench and its URL."""

    name: str
    base: str
    pid: int = 0  # the front door's process

    def history(self, event: str | None = None) -> list[dict]:
        """``GET /v1/models/history``, newest first."""
        params = {"limit": 1000, **({"event": event} if event else {})}
        r = httpx.get(self.base + "/v1/models/history", params=params, timeout=60)
        r.raise_for_status()
        return r.json()["data"]

    def residents(self) -> dict[str, dict]:
        r = httpx.get(self.base + "/v1/models/residents", timeout=60)
        r.raise_for_status()
        return {x["key"]: x for x in r.json()["data"]}


def up(proc: subprocess.Popen[bytes], base: str, log_path: Path, what: str = "fitevict serve") -> bool:
    """Whether ``base/health`` answers 200; a process that exited ends the bench, naming its log."""
    if proc.poll() is not None:
        raise SystemExit(f"{what} exited with {proc.returncode}; its log: {log_path}")
    try:
        return httpx.get(base + "/health", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False  # not listening yet


@contextmanager
def serve(tmp: Path, name: str, models: Path, config: str, env: dict[str, str] | None = None) -> Iterator[Served]:
    """``fitevict serve`` on ``models`` with ``config`` (TOML text) as its config file; ``env`` over this
    process's environment."""
    root = tmp / name
    root.mkdir(parents=True, exist_ok=True)
    (root / "fitevict.toml").write_text(config)
    port = free_port()
    argv = [sys.executable, "-m", "fitevict.cli", "serve", "--port", str(port), "--data-dir", str(root / "data"),
            "--models-dir", str(models), "--log-level", "warning"]
    full_env = {**os.environ, **STORES_OFF, "FITEVICT_CONFIG": str(root / "fitevict.toml"), **(env or {})}
    with (root / "serve.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=full_env)
    served = Served(name, f"http://127.0.0.1:{port}", proc.pid)
    try:
        wait_for(lambda: up(proc, served.base, root / "serve.log"), f"{name}: fitevict serve healthy", 120)
        yield served
    finally:
        stop_group(proc, 30.0)  # the front door and its seats: one process group


def prices_read_ahead(base: str, timeout: float = 600.0) -> None:
    """Wait until the front door has read every model's price ahead (``server.read_prices_ahead``, in ``/health``)."""
    def done() -> bool:
        ahead = httpx.get(base + "/health", timeout=30).json()["prices_read_ahead"]
        return bool(ahead["models"]) and ahead["done"] >= ahead["models"]

    wait_for(done, "prices read ahead", timeout, 0.05)


def wait_for(fn, what: str, timeout: float = 120.0, step: float = 0.05):
    """The first truthy result of ``fn``, polled every ``step`` seconds."""
    deadline = time.monotonic() + timeout
    while not (got := fn()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)
    return got


def cpu_model() -> str:
    """The CPU's model name as ``lscpu`` prints it."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown CPU"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fmt(x: float | None, spec: str = ".3f", unit: str = "") -> str:
    return "unavailable" if x is None else f"{x:{spec}}{unit}"


def scale(x: float | None, k: float) -> float | None:
    """``x`` times ``k``; None (unavailable) stays None."""
    return None if x is None else x * k


def load_average() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def signal_exit() -> None:
    """SIGTERM leaves through ``sys.exit``, so the servers (and their seats) are stopped on the way out."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def spawn_engine(binary: Path, path: Path, n_ctx: int, *, repack: bool = True) -> tuple[subprocess.Popen, str]:
    """llama-server on ``path`` with the argv a seat gets (``LlamaServerEngine.launch_spec``, one slot; ``repack``
    False: ``-nr``, as a seat runs where the build's repacking crashed): the process (its own session) and its base
    URL."""
    from fitevict.engines.llama_cpp.server import LlamaServerEngine
    from fitevict.pricing.loadconfig import LoadConfig

    cfg = LoadConfig(n_ctx=n_ctx, n_parallel=1, repack=repack)
    spec = LlamaServerEngine(binary).launch_spec(path, cfg, free_port())
    proc = subprocess.Popen(list(spec.argv), env=dict(spec.env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    return proc, f"http://127.0.0.1:{spec.port}"


def engine_first_token(proc: subprocess.Popen, base: str, what: str, step: float = 0.005) -> None:
    """Until a spawned engine answers ``/health`` (polled every ``step`` s), then a one-token chat completion, the
    request the front door is sent."""
    def healthy() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with {proc.returncode} on {what}")
        try:
            return httpx.get(base + "/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(healthy, f"{what} healthy", 600, step)
    httpx.post(base + "/v1/chat/completions", timeout=600, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).raise_for_status()

