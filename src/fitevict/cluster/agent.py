"""The node agent: one per Ray node, pinned to it. It runs that node's own ``fitevict serve`` (its door) and answers
what routing asks: the node's facts and its planner's dry runs.

The node's door is a whole fitevict front door: its supervisor, budget, seats, planner and store are the node's
own, and its planner stays authoritative (the door may refuse what routing chose). It listens on the node's Ray
address and admits only the cluster key (``server.admin_keys``), which the front doors get from the agent; its
seats stay on the node's loopback. It reads the node's own config and environment (the ``ray start`` process's:
``FITEVICT_MODELS_DIRS``, ``FITEVICT_DATA_DIR``, a config file), with the budget the node declares as a Ray
resource (``fitevict_ram_limit_mib``, ``fitevict_gpu_limit_mib``) over it.

The door is the agent's child: it gets SIGTERM when the agent's process ends (``PR_SET_PDEATHSIG``), however it
ends, so a node whose Ray processes die takes its door and seats with it. That signal fires when the *thread*
that forked the child ends, not only the process: the door is forked from a thread of its own, which lives as
long as the door (it waits for it), so no thread of the agent's can take the door with it (``spawn_tied``). Ray
itself would SIGKILL the door as the agent's worker ends (it kills a worker's children): the agent runs with that
off (``fleet.AGENT_ENV``), so the signal the door gets is this SIGTERM, and it stops as one machine does.

The key the door admits: the node's own ``server.cluster_key`` (its config file, or ``FITEVICT_CLUSTER_KEY`` for
``ray start``), else the one the front door that started the agent offers (its own ``server.cluster_key``), else
a random one. Front doors read it from the agent.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

RAM_RESOURCE = "fitevict_ram_limit_mib"
GPU_RESOURCE = "fitevict_gpu_limit_mib"
# what Ray sets for a worker that asked for no GPU and one CPU's threads: the node's door must see its machine
RAY_WORKER_ENV = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
MODELS_EVERY_S = 5.0  # the node's model list changes rarely: read it at most this often
PR_SET_PDEATHSIG = 1


def spawn_tied(argv: list[str], **popen: Any) -> subprocess.Popen:
    """Start ``argv`` as a child that gets SIGTERM when this process ends, however it ends.

    The child is forked from a thread started for it, which then waits for it: ``PR_SET_PDEATHSIG`` follows the
    forking thread, and this one ends only after the child has. The child arms the signal, then checks that its
    parent is still this process (it may have ended in between) before it runs ``argv``."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    parent = os.getpid()

    def tie() -> None:  # pragma: no cover - runs in the child between fork and exec
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)

    got: dict[str, Any] = {}
    started = threading.Event()

    def parent_thread() -> None:
        try:
            got["proc"] = subprocess.Popen(argv, preexec_fn=tie, **popen)
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            got["error"] = e
        finally:
            started.set()
        if "proc" in got:
            got["proc"].wait()

    threading.Thread(target=parent_thread, name=f"fitevict-parent-of-{Path(argv[0]).name}", daemon=True).start()
    started.wait()
    if "error" in got:
        raise got["error"]
    return got["proc"]


def node_key() -> str | None:
    """This node's own ``server.cluster_key`` (its config file or ``FITEVICT_CLUSTER_KEY``), or None (a config that
    does not load counts as none: the node's door reports it)."""
    from fitevict.config import ConfigError, load_config

    try:
        return load_config(None).server.cluster_key
    except ConfigError:
        return None


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def door_argv(host: str, port: int, key: str, options: dict[str, Any]) -> list[str]:
    """The node door's command line: the node's address, the cluster key as its only admin key, and the options
    the agent was given (``data_dir``, ``models_dirs``, ``ram_limit``, ``gpu_limit``) over the node's config."""
    argv = [sys.executable, "-m", "fitevict.cli", "serve", "--host", host, "--port", str(port), "--admin-key", key]
    if options.get("data_dir"):
        argv += ["--data-dir", str(options["data_dir"])]
    for d in options.get("models_dirs") or ():
        argv += ["--models-dir", str(d)]
    if options.get("ram_limit"):
        argv += ["--ram-limit", str(options["ram_limit"])]
    if options.get("gpu_limit"):
        argv += ["--gpu-limit", str(options["gpu_limit"])]
    return argv


def budget_from_resources(resources: dict[str, float]) -> dict[str, str]:
    """The budget a node declares as Ray resources (MiB), as ``--ram-limit``/``--gpu-limit`` values."""
    out = {}
    if resources.get(RAM_RESOURCE):
        out["ram_limit"] = f"{int(resources[RAM_RESOURCE])}MiB"
    if resources.get(GPU_RESOURCE):
        out["gpu_limit"] = f"{int(resources[GPU_RESOURCE])}MiB"
    return out


def budget_of(metrics_text: str) -> dict[str, int]:
    """``fitevict_budget_bytes`` per device from a door's /metrics."""
    out: dict[str, int] = {}
    for line in metrics_text.splitlines():
        if line.startswith("fitevict_budget_bytes{"):
            labels, value = line[len("fitevict_budget_bytes{"):].rsplit("}", 1)
            device = next((p.split("=", 1)[1].strip('"') for p in labels.split(",") if p.startswith("device=")), None)
            if device is not None:
                out[device] = int(float(value))
    return out


class NodeAgent:
    """Runs the node's door and reports on it. ``options``: ``data_dir``, ``models_dirs``, ``ram_limit``,
    ``gpu_limit``, ``key`` (the cluster key offered, when the node names none), ``env`` (variables for the door),
    ``start_timeout`` (seconds)."""

    def __init__(self, node_id: str, host: str, options: dict[str, Any]) -> None:
        self.node_id, self.host = node_id, host
        self.key = node_key() or options.get("key") or secrets.token_urlsafe(24)
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}"
        data = Path(options.get("data_dir") or os.environ.get("FITEVICT_DATA_DIR") or _default_data(node_id))
        data.mkdir(parents=True, exist_ok=True)
        self.log_path = data / "node-door.log"
        env = {k: v for k, v in os.environ.items() if k not in RAY_WORKER_ENV}
        env.update(options.get("env") or {})
        argv = door_argv(host, self.port, self.key, {**options, "data_dir": str(data)})
        with self.log_path.open("ab") as log:
            self.proc = spawn_tied(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=30.0)
        self._lock = threading.Lock()
        self._models: tuple[float, dict] | None = None
        self._wait_healthy(float(options.get("start_timeout") or 120.0))

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the node door exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if self.http.get("/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            try:
                self.proc.wait(0.1)
            except subprocess.TimeoutExpired:
                pass
        raise RuntimeError(f"the node door was not healthy within {timeout:g} s: {self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError as e:
            return f"(no log: {e})"

    def door(self) -> dict[str, Any]:
        """Where the node's door listens, and its key (a front door relays with it)."""
        return {"node": self.node_id, "url": self.url, "key": self.key, "pid": self.proc.pid}

    def facts(self) -> dict[str, Any]:
        """The node's facts, read from its door now: residents and queues, the model list, the budget per
        device, and when they were taken (``taken_at``, unix seconds). ``error`` when the door does not answer."""
        taken = time.time()
        out: dict[str, Any] = {"node": self.node_id, "url": self.url, "taken_at": taken}
        if self.proc.poll() is not None:
            return {**out, "error": f"the node door exited with {self.proc.returncode}"}
        try:
            out["residents"] = self.http.get("/v1/models/residents").json()
            out["budget_bytes"] = budget_of(self.http.get("/metrics").text)
            out["models"] = self._model_list(taken)
        except (httpx.HTTPError, ValueError) as e:
            return {**out, "error": f"the node door did not answer: {e!r}"}
        return out

    def _model_list(self, now: float) -> dict:
        with self._lock:
            if self._models is None or now - self._models[0] > MODELS_EVERY_S:
                self._models = (now, self.http.get("/v1/models").json())
            return self._models[1]

    def plan(self, model: str, contract: dict | None = None) -> dict[str, Any]:
        """The node planner's dry run for ``model`` (``POST /v1/models/{model}/plan``): its status and answer."""
        r = self.http.post(f"/v1/models/{model}/plan", json=contract) if contract else self.http.post(
            f"/v1/models/{model}/plan")
        return {"node": self.node_id, "status": r.status_code, "body": r.json()}

    def stop(self) -> int | None:
        """Stop the node's door (SIGTERM: it stops its seats), and wait for it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def _default_data(node_id: str) -> Path:
    """A node's own data folder when its config names none: under this machine's data folder, one per node, so
    that nodes sharing a machine never share a store."""
    from fitevict.paths import data_dir

    return data_dir() / "cluster" / node_id[:16]
