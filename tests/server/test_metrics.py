"""Metrics from recorded history events: which counter moves, with which bounded reason, and what the histograms get.
The values after a real swap are checked end to end in tests/e2e/test_observability.py."""

from __future__ import annotations

from prometheus_client import generate_latest

from fitevict.server.metrics import Metrics, leak_reason, reason_label
from fitevict.store.records import Event


def _value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_each_event_moves_its_counter_once_with_a_bounded_reason() -> None:
    m = Metrics()
    events = [
        Event(time=1, event="load", model="a", engine="llama-server", seconds=2.5, strategy="ram-only (ngl=0)"),
        Event(time=2, event="evict", model="a", seconds=0.2, reason="evicted for b: needs 3 GiB of 4 GiB",
              details={"release_verified": True, "release_seconds": 0.04}),
        Event(time=3, event="refuse", model="c", reason="needs 9 GiB; 4 GiB available",
              details={"plan": {"largest_ctx": 2048}}),
        Event(time=4, event="fail", model="d", reason="llama-server exited with code 1 before it was ready"),
        Event(time=5, event="crash", model="b", details={"exit_code": -9, "release_verified": True}),
        Event(time=6, event="unload", model="b", seconds=0.1, reason="unloaded on request", details={
            "release_verified": False, "release_note": "not released within the timeout: CPU: 1 MiB came back"}),
        Event(time=7, event="unload", model="e", seconds=0.1,
              reason="no one waiting: every request for this load left before it finished",
              details={"release_verified": True, "release_seconds": 0.0}),
        Event(time=8, event="fail", model="f", reason="f: no-weights: the walk found nothing"),
    ]
    for ev in events:
        m.observe_event(ev)
    assert _value(m, "fitevict_loads_total", model="a", reason="ram-only") == 1  # without its figures
    assert _value(m, "fitevict_load_seconds_sum", model="a", engine="llama-server") == 2.5
    assert _value(m, "fitevict_evictions_total", model="a", reason="evict") == 1
    assert _value(m, "fitevict_release_seconds_sum", event="evict") == 0.04
    assert _value(m, "fitevict_release_seconds_count", event="unload") == 1  # the unverified one has no release time
    assert _value(m, "fitevict_refusals_total", model="c", reason="largest context fits") == 1
    assert _value(m, "fitevict_failed_loads_total", model="d", reason="engine exited") == 1
    assert _value(m, "fitevict_crashes_total", model="b", reason="exit code -9") == 1
    assert _value(m, "fitevict_unloads_total", model="b", reason="requested") == 1
    assert _value(m, "fitevict_unloads_total", model="e", reason="no one waiting") == 1  # a load nobody waited for
    assert _value(m, "fitevict_failed_loads_total", model="f", reason="no weights") == 1
    assert _value(m, "fitevict_leaks_total", model="b", reason="not released within the timeout") == 1
    text = generate_latest(m.registry).decode()
    assert "needs 9 GiB" not in text  # free-text reasons never become labels


def test_leak_reason_only_for_stops_whose_release_failed() -> None:
    ok = Event(time=1, event="evict", details={"release_verified": True})
    unmeasured = Event(time=1, event="unload", details={"release_verified": False,
                                                        "release_note": "unverified: held memory on CPU was never "
                                                                        "measured"})
    assert leak_reason(ok) is None and leak_reason(Event(time=1, event="load")) is None
    assert leak_reason(unmeasured) == "held memory never measured"
    assert reason_label(Event(time=1, event="refuse", details={"plan": {"largest_ctx": None}})) == "does not fit"
