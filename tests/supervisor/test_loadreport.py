"""The load report: hits, misses, the split of a load's seconds, and the notes where no saving happened."""

from __future__ import annotations

import json

from fitevict.engines.llama_cpp.server import LlamaServerEngine
from fitevict.store.records import Event
from fitevict.supervisor.loadreport import HEADER, LoadReport, load_report, reloaded, report_headers

adapter_load_seconds = LlamaServerEngine.adapter_seconds

# lines as the pinned llama-server writes them (-lv 4), M.s.ms.us timestamps
LOG = """0.00.029.750 I load_tensors:   CPU_Mapped model buffer size =     0.92 MiB
0.00.030.928 I llama_adapter_lora_init: loading lora adapter from 'a/sql.gguf' ...
0.00.031.419 I llama_adapter_lora_init_impl: loaded 20 tensors from lora file
0.00.031.508 I llama_adapter_lora_init: loading lora adapter from 'a/poem.gguf' ...
0.01.002.874 I llama_adapter_lora_init_impl: loaded 20 tensors from lora file
0.01.034.982 I sched_reserve:        CPU compute buffer size =     2.73 MiB
"""

ARGS = dict(resident_bytes={"CPU": (5_000_000, "measured")}, budget_bytes={"CPU": 8_000_000_000},
            budget_source={"CPU": "derived: limit (config ram_limit)"})


def test_adapter_seconds_come_from_the_engine_log_timestamps() -> None:
    assert abs(adapter_load_seconds(LOG) - (1.002874 - 0.030928)) < 1e-9
    assert adapter_load_seconds(LOG.splitlines()[0]) is None


def test_a_load_splits_base_and_adapter_seconds_and_says_nothing_was_saved() -> None:
    r = load_report(model="b:sql", base="b", adapter="/m/b.adapters/sql.gguf", seat_loras=("x", "y"), loaded=True,
                    load_seconds=2.5, adapter_seconds=0.5, evicted=("old",), **ARGS)
    assert (r.was_cached, r.base_hit, r.adapter_hit) == (False, False, False)
    assert r.base_load_seconds == 2.0 and r.adapter_load_seconds == 0.5 and r.adapter == "sql.gguf"
    assert any("not resident" in n for n in r.notes) and any("evicted old" in n for n in r.notes)
    assert r.activate_seconds is None and any("activate_seconds unavailable, because" in n for n in r.notes)


def test_a_hit_loads_nothing_and_the_base_notes_its_zero_scales() -> None:
    hit = load_report(model="b:sql", base="b", adapter="x", seat_loras=("x", "y"), loaded=False, load_seconds=3.0,
                      adapter_seconds=None, evicted=(), **ARGS)
    assert (hit.base_hit, hit.adapter_hit, hit.base_load_seconds, hit.adapter_load_seconds) == (True, True, None, None)
    base = load_report(model="b", base="b", adapter=None, seat_loras=("x", "y"), loaded=False, load_seconds=3.0,
                       adapter_seconds=None, evicted=(), **ARGS)
    assert base.adapter_hit is None and any("scale 0" in n for n in base.notes)
    doc = json.loads(report_headers({"load_report": base})[HEADER])
    assert doc["base_hit"] is True and doc["budget_bytes"] == {"CPU": 8_000_000_000}
    assert doc["resident_bytes_after"] == {"CPU": 5_000_000} and doc["resident_source"] == {"CPU": "measured"}
    assert report_headers({}) == {} and isinstance(base, LoadReport)


def test_a_transformers_seat_fills_activate_seconds_from_its_answer() -> None:
    from fitevict.engines.transformers.seat import FOOTPRINT_LINE
    from fitevict.supervisor.loadreport import seat_adapter_seconds, with_activation

    r = load_report(model="h:sql", base="h", adapter="/m/h.adapters/sql", seat_loras=("/m/h.adapters/poem", "/m/h.adapters/sql"),
                    loaded=False, load_seconds=1.0, adapter_seconds=None, evicted=(), engine="transformers", **ARGS)
    assert (r.base_hit, r.adapter_hit, r.adapter, r.activate_seconds) == (True, True, "sql", None)
    assert not any("llama-server" in n for n in r.notes)
    seat = b'{"adapter":"sql","scale":1.0,"switched":true,"activate_seconds":0.00042}'
    doc = json.loads(report_headers({"load_report": r}, seat)[HEADER])
    assert doc["activate_seconds"] == 0.00042
    assert any("made adapter sql active" in n and "switching" in n for n in doc["notes"])
    assert not any(n.startswith("activate_seconds unavailable") for n in doc["notes"])
    assert with_activation(r, None) is r  # no answer header: the note says why it is unavailable
    base = load_report(model="h", base="h", adapter=None, seat_loras=("a",), loaded=False, load_seconds=1.0,
                       adapter_seconds=None, evicted=(), engine="transformers", **ARGS)
    assert any("adapter(s) disabled" in n for n in base.notes)
    llama = load_report(model="b:sql", base="b", adapter="x", seat_loras=("x",), loaded=False, load_seconds=1.0,
                        adapter_seconds=None, evicted=(), **ARGS)
    assert with_activation(llama, seat) is llama  # llama-server applies adapters inside the request
    # a transformers seat's adapter seconds: its own account, in the footprint document it logs
    log = FOOTPRINT_LINE + json.dumps({"adapters": [{"load_seconds": 0.25}, {"load_seconds": 0.5}]}) + "\n"
    assert seat_adapter_seconds("transformers", log) == 0.75
    assert seat_adapter_seconds("transformers", FOOTPRINT_LINE + "{}\n") is None
    assert seat_adapter_seconds("llama-server", LOG) == adapter_load_seconds(LOG)


def test_a_hit_report_is_kept_once_per_model_and_seat_however_often_the_residents_change() -> None:
    """The memo of hit reports holds the last one of each model on its seat: residents whose bytes move at every
    reading replace it, never add to it, and an unchanged hit is the same report."""
    from types import SimpleNamespace

    from fitevict.pricing.loadconfig import LoadConfig
    from fitevict.supervisor import loadreport

    class Seat(SimpleNamespace):
        def bytes_on(self, dev: str) -> int:
            return self.held

        def source_on(self, dev: str) -> str:
            return "measured"

    seat = Seat(key="m", id="s1", engine="llama-server", config=LoadConfig(), load_seconds=1.5, held=1)
    sup = SimpleNamespace(seats={"m": seat}, last_budget=None)
    entry = SimpleNamespace(key="m", path="/m.gguf", kind="gguf")
    loadreport._hits.clear()
    loadreport._headers.clear()
    first = loadreport.hit_report(sup, entry, seat)
    assert loadreport.hit_report(sup, entry, seat) is first  # nothing changed: the same report
    for n in range(2, 100):
        seat.held = n * 1_000_000  # a new reading at every hit
        report = loadreport.hit_report(sup, entry, seat)
        assert report.resident_bytes_after["CPU"] == n * 1_000_000
    assert len(loadreport._hits) == 1 and len(loadreport._headers) == 1


def test_a_reload_for_a_larger_context_says_why_for_its_own_request_only() -> None:
    r = load_report(model="m", base="m", adapter=None, seat_loras=(), loaded=True, load_seconds=1.0,
                    adapter_seconds=None, evicted=(), **ARGS)
    stop = Event(time=1.0, event="unload", model="m", request_id="r2",
                 reason="replaced: m is asked for under another configuration (reloaded for ctx: resident 2048 < "
                        "asked 4096)")
    got = reloaded(r, (stop,), "m", "r2")
    assert got.reloaded_for == "reloaded for ctx: resident 2048 < asked 4096"
    assert any(n.startswith("reloaded for ctx: resident 2048 < asked 4096") for n in got.notes)
    assert json.loads(got.header())["reloaded_for"] == got.reloaded_for
    assert reloaded(r, (stop,), "m", "r3") is r and reloaded(r, (stop,), "m", None) is r  # another request's load


def test_a_loads_report_is_built_only_when_its_header_is_asked_for_and_names_every_eviction() -> None:
    """A request that waited for a load gets its report as something to build, not built: the header is made once
    the request went to the engine (``report_headers``, from the relay's ``on_sent``). Built then, it names the seats
    evicted for the request whether their stops were recorded by then or still under way when it got its seat."""
    import asyncio
    from types import SimpleNamespace

    from fitevict.pricing.loadconfig import LoadConfig
    from fitevict.supervisor.loadreport import deferred_report

    built: list[str] = []

    class Sup(SimpleNamespace):
        @property
        def recent_events(self):  # read only when the report is built
            built.append("events read")
            return (Event(time=1.0, event="evict", model="a", request_id="r1"),
                    Event(time=1.0, event="evict", model="x", request_id="r0"))

    class Seat(SimpleNamespace):
        def bytes_on(self, dev: str) -> int:
            return 1

        def source_on(self, dev: str) -> str:
            return "measured"

    seat = Seat(key="b", id="s2", engine="llama-server", config=LoadConfig(), load_seconds=1.5, ready_at=10.0,
                log_path="/nonexistent.log")
    sup = Sup(seats={"b": seat}, last_budget=None)
    entry = SimpleNamespace(key="b", path="/b.gguf", kind="gguf")
    timing: dict = {"load_report": asyncio.run(deferred_report(sup, entry, seat, 9.0, "r1", evicting=("c", "a")))}
    assert built == [] and callable(timing["load_report"])  # nothing built before the request is forwarded
    header = report_headers(timing)[HEADER]
    assert built and isinstance(timing["load_report"], LoadReport)
    assert json.loads(header)["evicted"] == ["a", "c"] == list(timing["load_report"].evicted)
