"""``policy.recycle_outgrown`` with a real ``fitevict serve`` and a real llama-server that leaks (the ``LD_PRELOAD``
shim of ``test_live_readings``, here 64 MiB per marked request): the seat outgrows its price while it serves a long
answer; it is drained (the answer runs to its end, a request arriving meanwhile is not sent to it but waits) and
stopped when its request ends (a ``recycle`` event with the outgrowth's figures), and the waiting request loads it
again: a new process, priced with what the leaking one outgrew to.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door, history, poll
from test_live_readings import MARKER, _residents, build_shim
from fitevict.units import MiB

pytestmark = pytest.mark.e2e

LEAK_MIB = 64
LONG = 1200  # tokens of the answer the seat is busy with when it outgrows its price
CONTRACT = {"ctx": 2048, "parallel": 1}


def _chat(base: str, text: str, n: int, request_id: str) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", timeout=600, headers={"x-request-id": request_id}, json={
        "model": "leaky", "max_tokens": n, "ignore_eos": True, "fitevict": CONTRACT,
        "messages": [{"role": "user", "content": text}]})


def test_an_outgrowing_busy_seat_is_drained_and_loaded_again(zoo: dict, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "leaky.gguf")
    cfg = tmp_path / "f.toml"
    cfg.write_text(f"[budget]\noutgrow_margin = {16 * MiB}\n[server]\nsample_seconds = 0.2\n"
                   "[policy]\nidle_unload_seconds = 0\nrecycle_outgrown = true\n")
    env = {"FITEVICT_CONFIG": str(cfg), "LD_PRELOAD": str(build_shim(tmp_path, LEAK_MIB))}
    with front_door(tmp_path, "--models-dir", str(models), env=env) as door:
        base = door.base_url
        assert _chat(base, "hi", 2, "first").status_code == 200
        old_pid = _residents(base)["leaky"]["pid"]
        long: dict = {}
        busy = threading.Thread(target=lambda: long.update(r=_chat(base, f"{MARKER} tell a story", LONG, "long")))
        busy.start()
        try:
            (grew,) = poll(lambda: history(door, event="outgrew"), "the outgrew event", 120)
            assert busy.is_alive(), "the long answer ended before the seat was seen outgrowing its price"
            after = _chat(base, "hi", 2, "after")  # arrives while the seat drains
        finally:
            busy.join(600)
        r = long["r"]
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == LONG  # served to its end
        assert after.status_code == 200
        (rec,) = history(door, event="recycle")
        print(f"recycle: {rec['reason']}; held {rec['details']['held_committed_bytes']}, freed {rec['bytes']['freed']}")
        assert grew["reason"] in rec["reason"] and "1 request(s) in flight when it outgrew" in rec["reason"]
        assert rec["details"]["held_committed_bytes"] > LEAK_MIB * MiB  # the leak went with it
        reload = [e for e in history(door, event="load") if e["time"] > rec["time"]]
        assert [e["request_id"] for e in reload] == ["after"]  # the waiting request loaded it again
        new = _residents(base)["leaky"]
        assert new["pid"] != old_pid and new["outgrew"] is None
        assert new["price_learned"]["extra_bytes"]["CPU"] == grew["details"]["price_learned"]["extra_bytes"]["CPU"]
