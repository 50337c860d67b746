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


def check_unreadable(fd: FrontDoor, model: str, why: str) -> None:
    """``model`` is answered with OpenAI's error envelope naming its file and ``why``, nothing started for it, no
    traceback anywhere, and history untouched by it."""
    r = ask(fd, model)
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["code"] == "model_unreadable" and f"{model}.gguf" in err["message"] and why in err["message"]
    assert "rescan" in err["message"]  # the remedy
    assert not seats_of(fd, model)
    assert not [e for e in history(fd) if e["model"] == model]
    assert "Traceback" not in r.text and "Traceback" not in fd.log()


@pytest.mark.fault(
    fault="a listed model's file truncated",
    client="`500` `model_unreadable`: \"model 'trunc': its file cannot be read (...trunc.gguf: truncated: its "
           "tensors end at byte N but the file has M bytes; re-download or re-convert it); replace or remove the "
           "file, then rescan the models\"",
    history="nothing",
    running="nothing started for it",
    lost="nothing")
def test_model_file_truncated_while_listed(door: FrontDoor) -> None:
    assert "trunc" in listed(door)
    path = next(door.data_dir.parent.glob("models/trunc.gguf"))
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)
    check_unreadable(door, "trunc", "truncated")


@pytest.mark.fault(
    fault="a listed model's file deleted",
    client='`500` `model_unreadable`, naming the file and "No such file or directory", with the same remedy',
    history="nothing",
    running="nothing started for it",
    lost="nothing")
def test_model_file_deleted_while_listed(door: FrontDoor) -> None:
    assert "gone" in listed(door)
    next(door.data_dir.parent.glob("models/gone.gguf")).unlink()
    check_unreadable(door, "gone", "No such file")


@pytest.mark.fault(
    fault="a model file still being copied into the models folder (a third of it there), then complete",
    client='while partial: `500` `model_unreadable` naming it ("truncated"); once whole: a normal answer, with no '
           'rescan',
    history="nothing while partial; then its `load`",
    running="nothing for it while partial",
    lost="nothing")
def test_model_file_still_being_copied_then_complete(door: FrontDoor) -> None:
    """A download into the models folder: listed while half written (a clear error naming it), served once whole,
    with no rescan."""
    path = next(door.data_dir.parent.glob("models/growing.gguf"))
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 3])  # the copy so far
    assert "growing" in listed(door)
    check_unreadable(door, "growing", "truncated")
    with path.open("ab") as f:  # the rest arrives
        f.write(whole[len(whole) // 3:])
    r = ask(door, "growing")
    assert r.status_code == 200, r.text
    assert [e["event"] for e in history(door) if e["model"] == "growing"] == ["load"]


@pytest.mark.fault(
    fault="the engine binary removed while a seat runs, then a load of another model",
    client='`502` `load_failed` naming the missing binary ("failed to execute .../llama-server: No such file or '
           'directory"); the running model still answers `200`; once the binary is back, the model loads',
    history="a `fail` for the load, naming the binary; then, with the binary back, its `load`",
    running="the running seat, same process, untouched; nothing for the failed model",
    lost="nothing")
def test_engine_binary_missing_at_load(door: FrontDoor) -> None:
    assert ask(door, "alive").status_code == 200
    [running] = seats_of(door, "alive")
    link = door.data_dir.parent / "engine" / "llama-server"
    target = link.readlink()
    link.unlink()
    try:
        r = ask(door, "other")
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert err["code"] == "load_failed" and str(link) in err["message"] and "No such file" in err["message"]
        fail = next(e for e in history(door) if e["model"] == "other")
        assert fail["event"] == "fail" and str(link) in fail["reason"]
        assert not seats_of(door, "other")
        # the running seat is untouched: same process, still answering
        assert ask(door, "alive").status_code == 200 and seats_of(door, "alive") == [running]
    finally:
        link.symlink_to(target)
    # the binary back: the same model loads
    assert ask(door, "other").status_code == 200
    assert [e["event"] for e in history(door) if e["model"] == "other"][:2] == ["load", "fail"]
    assert "Traceback" not in door.log()
