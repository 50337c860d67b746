"""Model files changed under a running seat, against one real front door (``fitevict serve``) and real seats: a file
replaced by another model (a new download renamed into place), and a file truncated in place.

For each: what the client receives, what the catalog says (``/v1/models``, ``/api/tags``), what history records,
and what the next load uses: the new file at its own price, or a clear refusal naming the file.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from _frontdoor import FrontDoor, engine_pids_of, front_door, history, poll
from faultrows import FaultSeen
from test_seat_faults import gone, seat_pid

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def door(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    tmp = tmp_path_factory.mktemp("filesinuse")
    models = tmp / "models"
    models.mkdir()
    for name, source in (("swap", "llama-gqa"), ("other", "qwen3-headdim"), ("cut", "llama-gqa"),
                         ("idlecut", "llama-gqa")):
        shutil.copyfile(zoo[source].path, models / f"{name}.gguf")
    with front_door(tmp, "--models-dir", str(models), timeout=180) as fd:
        yield fd


def ask(fd: FrontDoor, model: str) -> httpx.Response:
    return httpx.post(fd.base_url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


def model_file(fd: FrontDoor, model: str) -> Path:
    return fd.data_dir.parent / "models" / f"{model}.gguf"


def listed(fd: FrontDoor, model: str) -> tuple[dict, dict]:
    """``model``'s entry in ``/v1/models`` and in ``/api/tags``."""
    openai_entry = next(m for m in httpx.get(fd.base_url + "/v1/models", timeout=30).json()["data"]
                        if m["id"] == model)
    ollama_entry = next(m for m in httpx.get(fd.base_url + "/api/tags", timeout=30).json()["models"]
                        if m["name"] == model)
    return openai_entry, ollama_entry


def loads(fd: FrontDoor, model: str) -> list[dict]:
    return [e for e in reversed(history(fd)) if e["model"] == model and e["event"] == "load"]


def mapped_files(pid: int) -> set[str]:
    return {line.split(None, 5)[5] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if len(line.split(None, 5)) == 6 and ".gguf" in line}


@pytest.mark.fault(
    fault="a model file replaced by another model (a new download renamed over it) while a seat serves it",
    kind="real door")
def test_model_file_replaced_while_a_seat_uses_it(door: FrontDoor, tmp_path: Path, fault_seen: FaultSeen) -> None:
    path = model_file(door, "swap")
    assert ask(door, "swap").status_code == 200 and ask(door, "other").status_code == 200
    old_pid = seat_pid(door, "swap")
    before_openai, before_ollama = listed(door, "swap")
    assert before_openai["fitevict"]["file"]["bytes"] == before_ollama["size"] == path.stat().st_size
    new = tmp_path / "swap.gguf.part"
    shutil.copyfile(model_file(door, "other"), new)
    os.replace(new, path)  # how a download lands: the old inode stays mapped by its seat
    # the seat keeps serving the file it mapped
    assert fault_seen.client(ask(door, "swap").status_code, "the running seat, after the swap") == 200
    assert fault_seen.running(seat_pid(door, "swap") == old_pid, "the same seat") is True
    deleted = sorted(f.rsplit("/", 1)[-1] for f in mapped_files(old_pid))
    assert "swap.gguf (deleted)" in fault_seen.running(deleted, "the files it maps")
    # the catalog says what is on disk now
    after_openai, after_ollama = listed(door, "swap")
    assert after_openai["fitevict"]["file"]["bytes"] == after_ollama["size"] == path.stat().st_size
    assert fault_seen.client(after_ollama["size"] != before_ollama["size"], "`/api/tags` size changed") is True
    assert after_ollama["digest"] != before_ollama["digest"]
    # the next load uses the new file at its own price
    assert httpx.post(door.base_url + "/v1/models/swap/unload", timeout=60).status_code == 200
    poll(lambda: gone(old_pid), "the old seat gone")
    assert fault_seen.client(ask(door, "swap").status_code, "after an unload, the next request") == 200
    first, second = loads(door, "swap")
    [control] = loads(door, "other")
    assert fault_seen.history(second["bytes"]["predicted"] == control["bytes"]["predicted"],
                              "the second `load` priced as the new file") is True
    assert control["bytes"]["predicted"] != first["bytes"]["predicted"]
    assert fault_seen.running(mapped_files(seat_pid(door, "swap")) == {str(path)}, "the new seat maps the new file")


@pytest.mark.fault(
    fault="a model file truncated in place to half while its seat streams an answer from it (mmap'd weights)",
    kind="real door")
def test_model_file_truncated_while_a_seat_maps_it(door: FrontDoor, fault_seen: FaultSeen) -> None:
    path = model_file(door, "cut")
    assert ask(door, "cut").status_code == 200
    size = path.stat().st_size
    client = openai.OpenAI(base_url=door.base_url + "/v1", api_key="none", max_retries=0, timeout=60)
    stream = client.chat.completions.create(model="cut", messages=[{"role": "user", "content": "hi"}], stream=True,
                                            max_tokens=4000, extra_body={"ignore_eos": True})
    got, pid = 0, None
    with pytest.raises(openai.APIError) as e:
        for _ in stream:
            got += 1
            if got == 3:
                pid = seat_pid(door, "cut")
                with path.open("r+b") as f:
                    f.truncate(size // 2)
    assert pid is not None and fault_seen.client(got, "stream chunks before the error") >= 3
    fault_seen.client(type(e.value), "the SDK raised")
    assert fault_seen.client(e.value.body["code"], "code") == "engine_lost"
    poll(lambda: gone(pid), f"seat pid {pid} reaped")
    crash = poll(lambda: next((x for x in history(door) if x["model"] == "cut" and x["event"] == "crash"), None),
                 "the crash in history")
    assert fault_seen.history(crash["details"]["exit_code"], "`crash` exit_code") == -signal.SIGBUS
    assert fault_seen.history(crash["details"]["cause"], "cause") == "signal"
    reason = fault_seen.history(crash["reason"], "reason")
    assert f"{path} was truncated since the seat started ({size} bytes then, {size // 2} now)" in reason
    r = ask(door, "cut")
    assert fault_seen.client(r.status_code, "the next request") == 500, r.text
    err = r.json()["error"]
    assert fault_seen.client(err["code"], "code") == "model_unreadable"
    assert str(path) in err["message"] and "truncated" in err["message"]
    events = fault_seen.history([x["event"] for x in reversed(history(door)) if x["model"] == "cut"], "its events")
    assert events == ["load", "crash"]
    seats = [p for p in engine_pids_of(door.proc.pid) if "/cut.gguf" in Path(f"/proc/{p}/cmdline").read_text()]
    assert fault_seen.running(seats, "its seats") == []


@pytest.mark.fault(
    fault="a model file truncated in place to half while its seat is loaded and idle",
    kind="real door")
def test_model_file_truncated_while_its_seat_is_idle(door: FrontDoor, fault_seen: FaultSeen) -> None:
    path = model_file(door, "idlecut")
    assert ask(door, "idlecut").status_code == 200
    pid = seat_pid(door, "idlecut")
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)
    r = ask(door, "idlecut")
    assert fault_seen.client(r.status_code, "status") == 500
    assert fault_seen.client(r.json()["error"]["code"], "code") == "model_unreadable", r.text
    message = fault_seen.client(r.json()["error"]["message"], "message")
    assert str(path) in message and "truncated" in message
    poll(lambda: gone(pid), f"seat pid {pid} stopped and reaped")
    assert fault_seen.running(gone(pid), "its seat stopped and reaped") is True
    events = poll(lambda: [e for e in reversed(history(door)) if e["model"] == "idlecut"][1:] or None,
                  "the seat's end in history")
    assert fault_seen.history([e["event"] for e in events], "its end") == ["unload"]
    reason = fault_seen.history(events[0]["reason"], "reason")
    assert "its model file cannot be read any more" in reason and "truncated" in reason
