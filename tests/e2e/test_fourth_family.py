"""A fourth engine family whose model is not a GGUF file and whose price is its own: ``engines/declared/`` (one
package) and its one registry line. A folder holding ``fitevict-engine.toml`` is any OpenAI-compatible server
fitevict does not know; here ``tests/engines/declared_server.py``, which holds the bytes its manifest declares. Through
a real ``fitevict serve`` on loopback: listed, priced at its declared footprint, served, and under a budget that
fits one of two such models, evicted for the other with its release verified (process gone, memory back)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import psutil
import pytest

from _frontdoor import front_door, history, poll

pytestmark = pytest.mark.e2e
MiB = 1024 ** 2
AT_REST, PER_TOKEN, CTX = 96 * MiB, 4096, 4096  # each model's declared footprint (its server holds as much) ...
DECLARED = AT_REST + PER_TOKEN * CTX  # ... at the door's default context
SERVER = Path(__file__).resolve().parent.parent / "engines" / "declared_server.py"
MANIFEST = """model = "{name}"
command = ["{{python}}", "{{folder}}/server.py", "--port", "{{port}}", "--bytes", "{bytes}", "--per-token", "{per_token}",
           "--ctx", "{{ctx}}", "--name", "{{model}}"]
health = "/health"

[memory]
bytes = {bytes}
per_context_token = {per_token}
"""


def declared_model(root: Path, name: str) -> Path:
    """A model folder of the declared family: the server script and its manifest."""
    folder = root / name
    folder.mkdir(parents=True)
    shutil.copyfile(SERVER, folder / "server.py")
    (folder / "fitevict-engine.toml").write_text(MANIFEST.format(name=name, bytes=AT_REST, per_token=PER_TOKEN))
    return folder


def chat(door, model: str, text: str) -> httpx.Response:
    return httpx.post(door.base_url + "/v1/chat/completions", timeout=120,
                      json={"model": model, "messages": [{"role": "user", "content": text}]})


def seat_pids(door_pid: int, name: str) -> list[int]:
    """The door's children serving ``name`` (its folder's server.py)."""
    return [c.pid for c in psutil.Process(door_pid).children()
            if any(a.endswith(f"/{name}/server.py") for a in c.cmdline())]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_declared_model_is_listed_priced_served_and_evicted_for_another(tmp_path: Path) -> None:
    models = tmp_path / "models"
    for name in ("alpha", "beta"):
        declared_model(models, name)
    limit = int(1.6 * DECLARED)  # one fits, two do not
    with front_door(tmp_path, "--models-dir", str(models), "--ram-limit", str(limit)) as door:
        listed = {m["id"]: m["fitevict"] for m in httpx.get(door.base_url + "/v1/models", timeout=30).json()["data"]}
        assert {k: listed[k]["engine"] for k in ("alpha", "beta")} == {"alpha": "declared", "beta": "declared"}

        # priced: the footprint its manifest declares, labelled declared, with no engine overhead joined
        plan = httpx.post(door.base_url + "/v1/models/alpha/plan", timeout=60).json()["plan"]
        assert plan["needed_bytes"]["CPU"] == DECLARED and plan["config"]["n_ctx"] == CTX
        host = plan["footprint"]["devices"][0]
        assert (host["model_bytes"], host["context_bytes"], plan["footprint"]["host"]["source"]) == (
            AT_REST, PER_TOKEN * CTX, "declared")
        assert host["sources"]["model"] == host["sources"]["context"] == "declared"

        r = chat(door, "alpha", "hello fourth family")
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == f"alpha holds {DECLARED} bytes and heard: hello fourth family"
        [alpha_pid] = seat_pids(door.proc.pid, "alpha")
        load = next(e for e in history(door, event="load") if e["model"] == "alpha")
        assert load["engine"] == "declared" and load["details"]["pid"] == alpha_pid
        assert load["details"]["predicted"]["host"]["source"] == "declared"
        # measured by its process: its PSS right after the load, what it declared and the interpreter beside it
        measured = load["details"]["measured"]
        assert measured["host"]["source"] == "measured" and measured["devices"][0]["sources"]["model"] == "measured"
        assert DECLARED <= measured["total_bytes"] == load["bytes"]["measured"] < DECLARED + 64 * MiB
        assert load["details"]["guard"]["accepted"] is True

        r = chat(door, "beta", "hello again")
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"].startswith("beta holds")
        evict = next(e for e in history(door, event="evict") if e["model"] == "alpha")
        residents = [v["key"] for v in httpx.get(door.base_url + "/v1/models/residents", timeout=30).json()["data"]]
        assert residents == ["beta"] and gone(alpha_pid)  # its process ended before its eviction was recorded
    assert evict["reason"].startswith("evicted for beta") and evict["engine"] == "declared"
    assert evict["details"]["pid"] == alpha_pid and evict["details"]["release_verified"] is True
    # memory back: the machine's counter fell by what it held (with what other programs took meanwhile, read beside)
    assert evict["bytes"]["freed"] >= 0.9 * DECLARED, evict["details"]


def test_a_door_without_llama_server_serves_a_declared_model_and_says_why_a_gguf_does_not_load(
        tmp_path: Path, zoo: dict) -> None:
    models = tmp_path / "models"
    declared_model(models, "alpha")
    shutil.copyfile(zoo["llama-gqa"].path, models / "gqa.gguf")
    nowhere = {"FITEVICT_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "FITEVICT_LLAMA_SERVER": None}
    with front_door(tmp_path, "--models-dir", str(models), env=nowhere) as door:
        assert "no llama-server" in door.log()  # said at start
        r = chat(door, "alpha", "no llama-server here")
        assert r.status_code == 200, r.text
        gguf = chat(door, "gqa", "and you?")
        fail = next(e for e in history(door, event="fail") if e["model"] == "gqa")
    # refused before any engine started: the binary it would run, and what to do
    assert gguf.status_code == 502 and gguf.json()["error"]["message"] == fail["reason"]
    assert f"no engine binary at {tmp_path / 'cache'}" in fail["reason"], fail
    assert "fitevict engine install llama.cpp" in fail["reason"] and "inside fitevict" not in fail["reason"]
