"""The serving process holds only what serving needs: a real ``fitevict serve``, read through /proc.

``serve`` execs a lean entry point (same pid), so the CLI's libraries (typer brings pydantic) are not in it, and the
FastAPI app is built on the first request that needs it. pydantic's compiled core is a shared library, so whether
it is loaded shows in ``/proc/PID/maps``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door
from fitevict.zoo import write_zoo

pytestmark = pytest.mark.e2e


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_serving_loads_fastapi_only_for_routes_that_need_it(tmp_path: Path, llama_server: Path) -> None:
    models = tmp_path / "models"
    write_zoo(models, only=["llama-gqa"])
    with front_door(tmp_path, "--models-dir", str(models)) as fd, httpx.Client(base_url=fd.base_url,
                                                                             timeout=120) as c:
        pid = fd.proc.pid
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"fitevict.server.main" in cmdline, cmdline  # the same pid, now the lean entry point
        # inference and the routes monitors poll are answered without FastAPI or pydantic
        r = c.post("/v1/chat/completions", json={"model": "llama-gqa", "max_tokens": 2,
                                                 "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        assert c.get("/health").json()["status"] == "ok"
        listed = c.get("/v1/models").json()
        assert [m["id"] for m in listed["data"]] == ["llama-gqa"] and listed["data"][0]["fitevict"]["resident"]
        assert "fitevict_requests_total" in c.get("/metrics").text
        bad = c.post("/health")
        assert bad.status_code == 405 and bad.json()["error"]["message"] == "Method Not Allowed"
        assert "pydantic_core" not in _maps(pid)
        before = _rss_kib(pid)
        assert c.get("/v1/models/residents").json()["data"][0]["key"] == "llama-gqa"  # polled: plain too
        assert "pydantic_core" not in _maps(pid)
        # an admin route builds the FastAPI app (and its models) then, once
        assert c.get("/v1/models/history", params={"event": "load"}).json()["data"][0]["model"] == "llama-gqa"
        assert "pydantic_core" in _maps(pid)
        assert _rss_kib(pid) > before
        assert c.get("/v1/models/llama-gqa").json()["id"] == "llama-gqa"


def test_plain_routes_keep_the_keys_rule(tmp_path: Path, llama_server: Path) -> None:
    models = tmp_path / "models"
    write_zoo(models, only=["llama-gqa"])
    with front_door(tmp_path, "--models-dir", str(models), "--api-key", "k1") as fd:
        assert httpx.get(fd.base_url + "/health").status_code == 200  # health is public
        denied = httpx.get(fd.base_url + "/v1/models")
        assert denied.status_code == 401 and denied.json()["error"]["type"]
        assert httpx.get(fd.base_url + "/metrics").status_code == 401
        ok = httpx.get(fd.base_url + "/v1/models", headers={"Authorization": "Bearer k1"})
        assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "llama-gqa"
        assert httpx.get(fd.base_url + "/metrics", headers={"x-api-key": "k1"}).status_code == 200


def test_the_readme_first_command_serves_the_demo_zoo_from_the_lean_process(tmp_path: Path,
                                                                           llama_server: Path) -> None:
    """``./run.sh serve`` is ``fitevict serve --demo-if-empty``: with no models configured the demo zoo is written,
    and its models are served by the serving process that ``serve`` execs into (the overrides survive the exec)."""
    with front_door(tmp_path, "--demo-if-empty") as fd, httpx.Client(base_url=fd.base_url, timeout=120) as c:
        assert b"fitevict.server.main" in Path(f"/proc/{fd.proc.pid}/cmdline").read_bytes()
        ids = {m["id"] for m in c.get("/v1/models").json()["data"]}
        assert {"llama-gqa", "llama-medium", "mamba"} <= ids
        r = c.post("/v1/completions", json={"model": "llama-gqa", "prompt": "hi", "max_tokens": 1})
        assert r.status_code == 200, r.text
    assert (fd.data_dir / "demo-models" / "llama-gqa.gguf").is_file()
