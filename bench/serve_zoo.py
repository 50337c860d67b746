"""A Ray Serve deployment that serves the zoo's GGUF files with ``@serve.multiplexed``: each model a real llama-server
process (``-c 4096 -np 1``, CPU only), started by the multiplexer's load function and stopped when the model object's
last reference goes (no ``__del__``: a model dropped from the cache finishes the requests that hold it). Every load
and release is reported, with the model's priced bytes, to a recorder actor. Used by ``cluster_real.py``."""

from __future__ import annotations

import asyncio
import subprocess
import time
import weakref
from typing import Any

import httpx
import ray
from ray import serve

RECORDER = ("bench-recorder", "bench")  # name, namespace


@ray.remote(num_cpus=0)
class Recorder:
    """Loads and releases as (unix time, node id, event, model, bytes)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, str, str, int]] = []

    def add(self, *row: Any) -> None:
        self.events.append(tuple(row))  # type: ignore[arg-type]

    def all(self) -> list[tuple[float, str, str, str, int]]:
        return list(self.events)


class Engine:
    """One model's llama-server (no ``__del__``: Serve's multiplexer only drops it from its cache)."""

    def __init__(self, key: str, proc: subprocess.Popen, port: int) -> None:
        self.key, self.proc, self.url = key, proc, f"http://127.0.0.1:{port}"
        self.client = httpx.AsyncClient(timeout=120)

    async def complete(self, prompt: str) -> dict:
        r = await self.client.post(self.url + "/completion", json={"prompt": prompt, "n_predict": 1})
        r.raise_for_status()
        return r.json()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_app(n_models: int, binary: str, paths: dict[str, str], sizes: dict[str, int]) -> Any:
    @serve.deployment(num_replicas=3, ray_actor_options={"num_cpus": 0, "resources": {"serve_slot": 1}})
    class Zoo:
        def __init__(self) -> None:
            self.node = ray.get_runtime_context().get_node_id()
            self.recorder = ray.get_actor(*RECORDER)

        def _record(self, event: str, key: str) -> None:
            self.recorder.add.remote(time.time(), self.node, event, key, sizes[key])

        @serve.multiplexed(max_num_models_per_replica=n_models)
        async def get_model(self, key: str) -> Engine:
            self._record("load", key)
            port = _free_port()
            proc = subprocess.Popen([binary, "-m", paths[key], "-c", "4096", "-np", "1", "-dev", "none", "-t", "1",
                                     "--host", "127.0.0.1", "--port", str(port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            engine = Engine(key, proc, port)
            weakref.finalize(engine, _stop, proc, self._record, key)
            async with httpx.AsyncClient(timeout=2) as c:
                for _ in range(1200):
                    try:
                        if (await c.get(engine.url + "/health")).status_code == 200:
                            return engine
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.05)
            raise RuntimeError(f"{key}: llama-server not healthy within 60 s")

        async def __call__(self, request: Any) -> dict:
            engine = await self.get_model(serve.get_multiplexed_model_id())
            out = await engine.complete("hi")
            return {"model": engine.key, "node": self.node, "content": out.get("content", "")}

    return Zoo.bind()


def _stop(proc: subprocess.Popen, record: Any, key: str) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    record("release", key)
