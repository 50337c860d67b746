"""A load queued behind an eviction has its file read ahead while its victims stop (``Effects.prefetch``): emitted
by the pure scheduler before the victim's stop completes, holding no bytes against the budget (page cache)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fitevict.schedule.scheduler import SchedPolicy, Waiter

from .schedsim import World, request
from .test_scheduler import MB, ready, sched


def path(key: str) -> str:
    return f"/models/{key}.gguf"


def test_the_next_load_is_read_ahead_when_its_victim_begins_to_stop() -> None:
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB, min_residency_seconds=0)
    s.submit(Waiter(request("a", path=path("a")), 0.0, "a0"))
    assert not fx.kinds("prefetch")  # nothing to evict: its load reads the file itself
    ready(s, fx, "a")
    s.finished("a")
    s.submit(Waiter(request("b", path=path("b")), 0.0, "b0"))
    assert [c[0] for c in fx.calls[-2:]] == ["stop", "prefetch"] and fx.calls[-1] == ("prefetch", path("b"))
    assert fx.kinds("start") == [("start", "a")]  # b starts once a's stop completes; its file is read meanwhile
    s.stopped("a")
    assert fx.kinds("start")[-1] == ("start", "b") and len(fx.kinds("prefetch")) == 1


def test_a_request_without_a_file_reads_nothing_ahead() -> None:
    s, fx = sched({"a": 100 * MB, "b": 100 * MB}, 150 * MB, min_residency_seconds=0)
    s.submit(Waiter(request("a"), 0.0, "a0"))
    ready(s, fx, "a")
    s.finished("a")
    s.submit(Waiter(request("b"), 0.0, "b0"))
    assert fx.kinds("stop") and not fx.kinds("prefetch")


arrivals = st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 30, allow_nan=False)), min_size=1, max_size=30)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=arrivals, load=st.floats(0.2, 2.0), service=st.floats(0.01, 0.5))
def test_every_load_behind_an_eviction_is_read_ahead_first_and_the_budget_holds(arrivals, load, service) -> None:
    """Three models, room for one at a time: every eviction is followed, before its victim's stop completes, by a
    read ahead of the file the next load reads; nothing is lost and the byte-level budget always holds."""
    sizes = {"a": 100 * MB, "b": 80 * MB, "c": 120 * MB}
    w = World(sizes, budget_bytes=150 * MB, load_s={k: load for k in sizes}, service_s=lambda _k: service,
              policy=SchedPolicy(max_wait_seconds=5, min_residency_seconds=0.5, queue_timeout_seconds=10_000))
    for i, (k, t) in enumerate(sorted(arrivals, key=lambda x: x[1])):
        w.submit(f"r{i}", k, t, req=request(k, path=path(k)))
    w.run()
    assert all(r.done is not None and r.rejected is None for r in w.requests.values())
    assert w.peak_over <= 0  # a read ahead holds nothing against the budget
    kinds = [(what, k) for _t, what, k in w.events]
    for i, (what, _victim) in enumerate(kinds):
        if what != "evict":
            continue
        after = [e for e in kinds[i + 1:] if e[0] in ("prefetch", "gone", "load")]
        assert after[0][0] == "prefetch", kinds  # asked for before the victim's memory came back
        loaded = next(k for what2, k in after if what2 == "load")
        assert after[0][1] == path(loaded)
