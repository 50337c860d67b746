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
    client="`200`s throughout: the running seat keeps serving the file it mapped; after an unload, the next "
           "request loads the new file",
    history="the first `load` at the old file's price; the next `load` at the new file's own price (equal to a "
            "seat of the same file loaded under another name), not the old structure's; before the fix, the old "
            "file's dry-run compute bytes (cached by path), and `/v1/models` and `/api/tags` gave the old size until "
            "a rescan",
    running="the old seat until unloaded (same pid, mapping the replaced file, `(deleted)`), then a seat of the new "
            "file",
    lost="nothing")
def test_model_file_replaced_while_a_seat_uses_it(door: FrontDoor, tmp_path: Path) -> None:
    path = model_file(door, "swap")
    assert ask(door, "swap").status_code == 200 and ask(door, "other").status_code == 200
    old_pid = seat_pid(door, "swap")
    before_openai, before_ollama = listed(door, "swap")
    assert before_openai["fitevict"]["file"]["bytes"] == before_ollama["size"] == path.stat().st_size
    new = tmp_path / "swap.gguf.part"
    shutil.copyfile(model_file(door, "other"), new)
    os.replace(new, path)  # how a download lands: the old inode stays mapped by its seat
    # the seat keeps serving the file it mapped
    assert ask(door, "swap").status_code == 200 and seat_pid(door, "swap") == old_pid
    assert any(f.endswith("swap.gguf (deleted)") for f in mapped_files(old_pid))
    # the catalog says what is on disk now
    after_openai, after_ollama = listed(door, "swap")
    assert after_openai["fitevict"]["file"]["bytes"] == after_ollama["size"] == path.stat().st_size
    assert after_ollama["size"] != before_ollama["size"] and after_ollama["digest"] != before_ollama["digest"]
    # the next load uses the new file at its own price
    assert httpx.post(door.base_url + "/v1/models/swap/unload", timeout=60).status_code == 200
    poll(lambda: gone(old_pid), "the old seat gone")
    assert ask(door, "swap").status_code == 200
    first, second = loads(door, "swap")
    [control] = loads(door, "other")
    assert second["bytes"]["predicted"] == control["bytes"]["predicted"] != first["bytes"]["predicted"]
    assert mapped_files(seat_pid(door, "swap")) == {str(path)}


@pytest.mark.fault(
    fault="a model file truncated in place to half while its seat streams an answer from it (mmap'd weights)",
    client="the chunks before the cut, then the `engine_lost` error event (`openai.APIError`); the next request: "
           "`500` `model_unreadable` naming the file (\"truncated: its tensors end at byte N but the file has M "
           "bytes\") and the remedy; before the fix, a `500` \"Internal Server Error\" (a traceback in the log) when "
           "the file broke between the request's read and its load",
    history="`load`, then a `crash` (`cause: signal`): \"died by SIGBUS\", and \"its model file ... was truncated "
            "since the seat started (N bytes then, M now)\"; nothing for the refused request",
    running="nothing for the model: the seat died at its next read of the lost pages, and nothing is started for "
            "the truncated file",
    lost="the rest of that one answer")
def test_model_file_truncated_while_a_seat_maps_it(door: FrontDoor) -> None:
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
    assert pid is not None and e.value.body["code"] == "engine_lost"
    poll(lambda: gone(pid), f"seat pid {pid} reaped")
    crash = poll(lambda: next((x for x in history(door) if x["model"] == "cut" and x["event"] == "crash"), None),
                 "the crash in history")
    assert crash["details"]["exit_code"] == -signal.SIGBUS and crash["details"]["cause"] == "signal"
    assert f"{path} was truncated since the seat started ({size} bytes then, {size // 2} now)" in crash["reason"]
    r = ask(door, "cut")
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["code"] == "model_unreadable" and str(path) in err["message"] and "truncated" in err["message"]
    assert [x["event"] for x in reversed(history(door)) if x["model"] == "cut"] == ["load", "crash"]
    assert not [p for p in engine_pids_of(door.proc.pid) if "/cut.gguf" in Path(f"/proc/{p}/cmdline").read_text()]


@pytest.mark.fault(
    fault="a model file truncated in place to half while its seat is loaded and idle",
    client="`500` `model_unreadable` naming the file (\"truncated\") and the remedy; before the fix the same, but "
           "the seat was left running, holding its memory, to die of SIGBUS if it were ever asked",
    history="`load`, then an `unload` whose reason says the seat was stopped because its model file cannot be read "
            "any more (\"truncated: ...\")",
    running="nothing for the model: its seat stopped and reaped",
    lost="nothing")
def test_model_file_truncated_while_its_seat_is_idle(door: FrontDoor) -> None:
    path = model_file(door, "idlecut")
    assert ask(door, "idlecut").status_code == 200
    pid = seat_pid(door, "idlecut")
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)
    r = ask(door, "idlecut")
    assert r.status_code == 500 and r.json()["error"]["code"] == "model_unreadable", r.text
    assert str(path) in r.json()["error"]["message"] and "truncated" in r.json()["error"]["message"]
    poll(lambda: gone(pid), f"seat pid {pid} stopped and reaped")
    events = poll(lambda: [e for e in reversed(history(door)) if e["model"] == "idlecut"][1:] or None,
                  "the seat's end in history")
    assert [e["event"] for e in events] == ["unload"]
    assert "its model file cannot be read any more" in events[0]["reason"] and "truncated" in events[0]["reason"]
