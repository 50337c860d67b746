"""Loads resume at the reading that finds memory calm again, with real processes: a request that waits through memory
pressure from another program (it would fit once the seat in use goes, and the test holds that seat's request in
flight) is placed and served as soon as the hog exits, beside that seat, not when its own wait for the seat's turn to
end (``policy.max_wait_seconds``) runs out."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from _frontdoor import history, poll
from _pressure import HOG_CODE, HeldStream, chat, metric, pressure_door, residents

from fitevict.host.procmem import read_meminfo
from fitevict.units import GiB, MiB, format_size

pytestmark = pytest.mark.e2e

ROOM = 3 * GiB  # what fitevict may fill when the test starts: free memory above the reserve
CTX = 131072  # the held seat's context: a KV cache of its own that the waiting load would fit in once the seat goes
MARGIN = 64 * MiB  # budget.pressure_margin
NEED = 64 * MiB  # more than llama-gqa needs at its default context


class Ask:
    """One chat sent in a thread: ``done`` is set once it was answered (``response``) or failed (``error``)."""

    def __init__(self, base: str, model: str) -> None:
        self.response: httpx.Response | None = None
        self.error: str | None = None
        self.done = threading.Event()
        threading.Thread(target=self._send, args=(base, model), daemon=True).start()

    def _send(self, base: str, model: str) -> None:
        try:
            self.response = chat(base, model)
        except Exception as e:  # noqa: BLE001 (reported by the test)
            self.error = repr(e)
        finally:
            self.done.set()

    def said(self) -> str:
        return self.error or (f"{self.response.status_code} {self.response.text}" if self.response else "no answer")


def _waiting(base: str) -> dict[str, int]:
    return httpx.get(base + "/v1/models/residents", timeout=30).json()["waiting"]


def _why(base: str) -> str:
    """What the door says about a wait: the queue, the pressure, free memory and the plan a dry run makes now."""
    plan = httpx.post(base + "/v1/models/llama-gqa/plan", timeout=60).json().get("plan", {})
    return (f"waiting {_waiting(base)}, under pressure {metric(base, 'fitevict_under_pressure', 'device')}, "
            f"free {metric(base, 'fitevict_free_bytes', 'device')}, reserve {metric(base, 'fitevict_reserve_bytes', 'device')}; "
            f"a plan now: {plan.get('action')}: {plan.get('reason')}")


@pytest.mark.timeout(300)  # under 30 s alone
def test_a_request_waiting_through_pressure_is_served_once_it_clears(zoo: dict, tmp_path: Path) -> None:
    # its turn and wait bounds far beyond the test: a request that waited for them would never be served in time
    with pressure_door(zoo, tmp_path, ROOM, budget=f"pressure_margin = {MARGIN}\n",
                       policy="max_wait_seconds = 600\nmax_turn_seconds = 600\n") as (door, reserve):
        base = door.base_url
        busy = HeldStream(base, "med-a", ctx=CTX)
        assert busy.serving.wait(300) and busy.alive() is None, busy.alive()
        busy.assert_on_its_seat()
        own = poll(lambda: (residents(base)["med-a"]["host_pss"] or {}).get("committed_bytes"), "med-a's reading", 60)
        # free memory pushed this far below the reserve: under pressure, and llama-gqa still fits once med-a goes
        below = (own - MARGIN - NEED) // 2
        assert below >= 64 * MiB, f"med-a holds {format_size(own)} of its own at ctx {CTX}: too little to wait in"
        hog = subprocess.Popen([sys.executable, "-c", HOG_CODE, str(read_meminfo().available_bytes - reserve + below)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            hog.stdout.readline(), hog.stdout.readline()  # started, and every page touched
            poll(lambda: metric(base, "fitevict_under_pressure", "device") == {"CPU": 1.0},
                 f"pressure (the hog took {format_size(below)} more than the room left)", 60)
            ask = Ask(base, "llama-gqa")
            poll(lambda: ask.done.is_set() or _waiting(base) == {"llama-gqa": 1}, "llama-gqa waiting", 60)
            assert not ask.done.is_set(), f"llama-gqa did not wait (free {format_size(below)} below the reserve, " \
                                          f"med-a holding {format_size(own)}): {ask.said()}"
            assert metric(base, "fitevict_under_pressure", "device") == {"CPU": 1.0}  # it waits on the pressure's plan
        finally:
            hog.stdin.close()
            hog.wait(30)
        # the reading that finds the host calm places it at once: served while med-a still serves the held stream,
        # which its turn (600 s) would have had to end for, and could not while the stream is held
        assert ask.done.wait(120), f"llama-gqa still waits after the hog exited: {_why(base)}"
        assert ask.response is not None and ask.response.status_code == 200, ask.said()
        busy.assert_on_its_seat()
        assert [e["model"] for e in history(door, event="load")] == ["llama-gqa", "med-a"]  # newest first
        assert not history(door, event="evict")  # nothing was stopped for it
        waited = [line["queue_wait_s"] for line in door.await_requests(model="llama-gqa")]
        print(f"med-a holds {format_size(own)}; free memory pushed {format_size(below)} below the reserve; "
              f"llama-gqa waited {waited} s in the queue")
        busy.let_go()
