"""The price book learns from an outgrowth, with a real ``fitevict serve`` and a real llama-server that leaks (the
``LD_PRELOAD`` shim of ``test_live_readings``): after the seat's ``outgrew`` event, the next seat of the same file and
configuration is priced with what the leaking one was seen to need (its peak reading over its price), labelled as
learned from that outgrowth with the event's time, in the residents view and the load's history; and a restarted
server over the same store prices it the same. A copy of the same file that never leaked (another file identity) is
the control: priced as the leaking one was before, both after the same history of loads."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door, history, poll
from test_live_readings import LEAK_MIB, MARKER, _chat, _residents, shim  # noqa: F401 - shim is a fixture
from fitevict.units import MiB

pytestmark = pytest.mark.e2e

BOUND = 16 * MiB


def _load_price(door, n: int) -> dict:
    """The ``n``-th load's priced footprint (history, as its load event recorded it)."""
    loads = poll(lambda: (lambda e: e if len(e) >= n else None)(history(door, event="load")), f"load {n}", 60)
    return loads[0]["details"]["predicted"]


def test_the_next_price_holds_what_a_leaking_seat_outgrew_to(zoo: dict, tmp_path: Path, shim: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "leaky.gguf")
    shutil.copyfile(zoo["llama-gqa"].path, models / "steady.gguf")
    cfg = tmp_path / "f.toml"
    cfg.write_text(f"[budget]\noutgrow_margin = {BOUND}\n[server]\nsample_seconds = 0.2\n"
                   "[policy]\nidle_unload_seconds = 0\n")
    env = {"FITEVICT_CONFIG": str(cfg), "LD_PRELOAD": str(shim)}
    with front_door(tmp_path, "--models-dir", str(models), env=env) as door:
        base = door.base_url
        assert _chat(base, "steady").status_code == 200 and _chat(base, "leaky").status_code == 200
        first = _residents(base)["leaky"]
        price = first["devices"]["CPU"]["predicted_bytes"]
        assert first["price_learned"] is None and "grown" not in _load_price(door, 2)
        for i in range(2):  # 2 x LEAK_MIB MiB, never freed
            assert _chat(base, "leaky", f"{MARKER} {i}").status_code == 200
        (ev,) = poll(lambda: history(door, event="outgrew"), "the outgrew event", 60)
        learned = ev["details"]["price_learned"]
        extra = learned["extra_bytes"]["CPU"]
        print(f"outgrew: {ev['reason']}; learned {learned}")
        assert learned["priced_bytes"]["CPU"] == price and extra > BOUND  # its peak over the price it was planned at
        assert extra == ev["details"]["peak_bytes"] - price
        when = dt.datetime.fromtimestamp(ev["time"], dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        assert when in learned["label"]

        for model in ("steady", "leaky"):
            assert httpx.post(f"{base}/v1/models/{model}/unload", timeout=60).json()["unloaded"]
            assert _chat(base, model).status_code == 200  # a new seat: the leaky one priced with what it needed
        again, control = _residents(base)["leaky"], _residents(base)["steady"]
        assert again["devices"]["CPU"]["predicted_bytes"] == control["devices"]["CPU"]["predicted_bytes"] + extra
        assert control["price_learned"] is None
        assert again["price_learned"]["extra_bytes"] == {"CPU": extra}
        assert again["price_learned"]["source"].startswith("learned from the outgrowth at " + when)
        assert "+outgrowth" in again["devices"]["CPU"]["predicted_source"]
        assert _load_price(door, 4)["grown"] == {"CPU": extra}

    with front_door(tmp_path, "--models-dir", str(models), env=env) as door:  # the same store, read at start
        assert _chat(door.base_url, "steady").status_code == 200 and _chat(door.base_url, "leaky").status_code == 200
        restarted, control = _residents(door.base_url)["leaky"], _residents(door.base_url)["steady"]
        print(f"after a restart: priced {restarted['devices']['CPU']['predicted_bytes']:,} B "
              f"({restarted['price_learned']}), the control {control['devices']['CPU']['predicted_bytes']:,} B")
        assert restarted["devices"]["CPU"]["predicted_bytes"] == control["devices"]["CPU"]["predicted_bytes"] + extra
        assert restarted["price_learned"]["source"].startswith("learned from the outgrowth at " + when)
