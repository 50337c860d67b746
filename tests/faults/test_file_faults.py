"""Files that change under a running front door: a model file truncated or deleted while it is listed, and the
engine binary gone while seats run. One real ``fitevict serve`` for the module, its engine a link to the real
llama-server (removed and put back by the test that needs it).

For each: what the client receives (a clear error naming the file, never a traceback), what history records, and
what keeps running.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from _frontdoor import FrontDoor, engine_pids_of, front_door, history
from faultrows import FaultSeen

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def door(zoo: dict, llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    tmp = tmp_path_factory.mktemp("filefaults")
    models = tmp / "models"
    models.mkdir()
    for name in ("trunc", "gone", "alive", "other", "growing"):
        shutil.copyfile(zoo["llama-gqa"].path, models / f"{name}.gguf")
    (tmp / "engine").mkdir()
    (tmp / "engine" / "llama-server").symlink_to(llama_server)
    with front_door(tmp, "--models-dir", str(models),
                    env={"FITEVICT_LLAMA_SERVER": str(tmp / "engine" / "llama-server")}) as fd:
        yield fd


def ask(fd: FrontDoor, model: str) -> httpx.Response:
    return httpx.post(fd.base_url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


def seats_of(fd: FrontDoor, model: str) -> list[int]:
    return [p for p in engine_pids_of(fd.proc.pid)
            if f"/{model}.gguf" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]


def listed(fd: FrontDoor) -> set[str]:
    return {m["id"] for m in httpx.get(fd.base_url + "/v1/models", timeout=30).json()["data"]}


def check_unreadable(fd: FrontDoor, model: str, why: str, seen: FaultSeen) -> None:
    """``model`` is answered with OpenAI's error envelope naming its file and ``why``, nothing started for it, no
    traceback anywhere, and history untouched by it."""
    r = ask(fd, model)
    assert seen.client(r.status_code, "status") == 500, r.text
    err = r.json()["error"]
    assert seen.client(err["code"], "code") == "model_unreadable"
    message = seen.client(err["message"], "message")
    assert f"{model}.gguf" in message and why in message
    assert "rescan" in message  # the remedy
    assert seen.running(seats_of(fd, model), "its seats") == []
    assert seen.history([e["event"] for e in history(fd) if e["model"] == model], "its events") == []
    assert "Traceback" not in r.text and seen.history(fd.log().count("Traceback"), "tracebacks in the log") == 0


@pytest.mark.fault(
    fault="a listed model's file truncated",
    kind="real door")
def test_model_file_truncated_while_listed(door: FrontDoor, fault_seen: FaultSeen) -> None:
    assert "trunc" in listed(door)
    path = next(door.data_dir.parent.glob("models/trunc.gguf"))
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)
    check_unreadable(door, "trunc", "truncated", fault_seen)


@pytest.mark.fault(
    fault="a listed model's file deleted",
    kind="real door")
def test_model_file_deleted_while_listed(door: FrontDoor, fault_seen: FaultSeen) -> None:
    assert "gone" in listed(door)
    next(door.data_dir.parent.glob("models/gone.gguf")).unlink()
    check_unreadable(door, "gone", "No such file", fault_seen)


@pytest.mark.fault(
    fault="a model file still being copied into the models folder (a third of it there), then complete",
    kind="real door")
def test_model_file_still_being_copied_then_complete(door: FrontDoor, fault_seen: FaultSeen) -> None:
    """A download into the models folder: listed while half written (a clear error naming it), served once whole,
    with no rescan."""
    path = next(door.data_dir.parent.glob("models/growing.gguf"))
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 3])  # the copy so far
    assert "growing" in listed(door)
    check_unreadable(door, "growing", "truncated", fault_seen)
    with path.open("ab") as f:  # the rest arrives
        f.write(whole[len(whole) // 3:])
    r = ask(door, "growing")
    assert fault_seen.client(r.status_code, "once whole, with no rescan") == 200, r.text
    events = fault_seen.history([e["event"] for e in history(door) if e["model"] == "growing"], "then its events")
    assert events == ["load"]
    assert fault_seen.running(len(seats_of(door, "growing")), "its seats then") == 1


@pytest.mark.fault(
    fault="the engine binary removed while a seat runs, then a load of another model",
    kind="real door")
def test_engine_binary_missing_at_load(door: FrontDoor, fault_seen: FaultSeen) -> None:
    assert ask(door, "alive").status_code == 200
    [running] = seats_of(door, "alive")
    link = door.data_dir.parent / "engine" / "llama-server"
    target = link.readlink()
    link.unlink()
    try:
        r = ask(door, "other")
        assert fault_seen.client(r.status_code, "the new load") == 502, r.text
        err = r.json()["error"]
        assert fault_seen.client(err["code"], "code") == "load_failed"
        assert str(link) in fault_seen.client(err["message"], "message") and "fitevict engine install" in err["message"]
        fail = next(e for e in history(door) if e["model"] == "other")
        assert fault_seen.history(fail["event"], "its event") == "fail" and str(link) in fail["reason"]
        assert fault_seen.running(seats_of(door, "other"), "its seats") == []
        # the running seat is untouched: same process, still answering
        assert fault_seen.client(ask(door, "alive").status_code, "the running model") == 200
        assert fault_seen.running(seats_of(door, "alive") == [running], "the running seat, the same process") is True
    finally:
        link.symlink_to(target)
    # the binary back: the same model loads
    assert fault_seen.client(ask(door, "other").status_code, "with the binary back") == 200
    events = [e["event"] for e in history(door) if e["model"] == "other"][:2]
    assert fault_seen.history(events, "then (newest first)") == ["load", "fail"]
    assert fault_seen.history(door.log().count("Traceback"), "tracebacks in the log") == 0
