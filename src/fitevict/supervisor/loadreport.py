"""The load report: what serving one request cost in loading, as data.

Built from the supervisor's state; the seconds an adapter's load took come from the seat's own log, which the report
reads (off the event loop where it is awaited). The decisions in it are pure functions of those figures.

Admission is per base: a request for the adapter ``B:X`` is served by ``B``'s seat, which starts with every
adapter of ``B`` (GGUF at scale 0 on llama-server, PEFT on a transformers seat) and applies ``X`` per request. So a report says whether the base was
already resident (``base_hit``), whether the adapter was already loaded on it (``adapter_hit``), and how the
seconds of a load split between the base and its adapters (the engine's own log timestamps). Wherever a saving
did not happen, ``notes`` says so rather than claim one.

It goes in the history (a ``load`` event's ``details["load_report"]``), in the response header
``x-fitevict-load-report`` (compact JSON) and, as a forecast, in the plan dry run (``base_hit``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

from fitevict.engines import engine_class, traits
from fitevict.planner import RELOADED_FOR_CTX
from fitevict.request.contract import ADAPTER_KINDS
from fitevict.seat.running import log_text

HEADER = "x-fitevict-load-report"
SHRUNK_HEADER = "x-fitevict-ctx-shrunk"  # "<asked>-><loaded>": policy.shrink_ctx loaded a smaller context
SHRUNK = "ctx shrunk"

@dataclass(frozen=True, slots=True)
class LoadReport:
    model: str  # as requested: "B" or "B:X"
    base: str  # the seat's model
    adapter: str | None  # the adapter's file name, None for the base itself
    was_cached: bool  # the seat was resident and ready when the request came
    base_hit: bool  # the base was resident: nothing of it was loaded for this request
    adapter_hit: bool | None  # the adapter was already loaded on the resident seat; None: no adapter asked for
    base_load_seconds: float | None  # None: nothing loaded for this request
    adapter_load_seconds: float | None
    activate_seconds: float | None  # a transformers seat's measured switch; None on llama-server (inside the request)
    evicted: tuple[str, ...]  # seats stopped to make room for this request's load
    resident_bytes_after: Mapping[str, int]  # per budget device, every seat together
    resident_source: Mapping[str, str]  # per device: the seats' sources joined (SeatState.source_on)
    budget_bytes: Mapping[str, int]  # per budget device
    budget_source: Mapping[str, str]
    adapters_on_seat: int
    notes: tuple[str, ...] = ()
    # a saved prompt restored for this request (kvkeep.Restored.to_json): measured tokens and seconds, the estimate
    kv_restore: Mapping[str, Any] | None = None
    # why the seat was loaded again for this request while the model was resident (``reloaded for ctx: resident N <
    # asked M``, the planner's words); None: it was not resident, or it served the request as it was
    reloaded_for: str | None = None

    def to_json(self) -> dict:
        d = {f: getattr(self, f) for f in _FIELDS}  # flat: no deep copy on the hot path
        d["evicted"] = list(self.evicted)
        d["notes"] = list(self.notes)
        d["resident_bytes_after"] = dict(self.resident_bytes_after)
        d["resident_source"] = dict(self.resident_source)
        d["budget_bytes"] = dict(self.budget_bytes)
        d["budget_source"] = dict(self.budget_source)
        d["kv_restore"] = dict(self.kv_restore) if self.kv_restore is not None else None
        return d

    def header(self) -> str:
        """Compact JSON for the response header (ASCII only: file names are escaped)."""
        return json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=True)


_FIELDS = tuple(f.name for f in fields(LoadReport))


def load_report(*, model: str, base: str, adapter: str | None, seat_loras: tuple[str, ...], loaded: bool,
                load_seconds: float | None, adapter_seconds: float | None, evicted: tuple[str, ...],
                resident_bytes: Mapping[str, tuple[int, str]], budget_bytes: Mapping[str, int],
                budget_source: Mapping[str, str], engine: str = "llama-server") -> LoadReport:
    """The report for one request. ``loaded``: the seat was started for this request (it waited for the load);
    ``load_seconds``: that load's wall time (start to ready), of which ``adapter_seconds`` went to the adapters
    (``seat_adapter_seconds``); ``adapter``: the requested adapter file or folder (None for the base);
    ``engine``: the seat's engine family, whose way of applying adapters the notes describe."""
    notes: list[str] = []
    name = Path(adapter).name if adapter else None
    took = f" in {load_seconds:.3f} s" if load_seconds is not None else ""
    if loaded:
        base_s = None if load_seconds is None else max(0.0, load_seconds - (adapter_seconds or 0.0))
        if seat_loras:
            notes.append(f"the base was not resident: loaded it with all {len(seat_loras)} adapter(s) of {base} "
                         f"in one start{took}; later requests for any of them are hits")
            if adapter_seconds is None:
                notes.append("adapter load seconds unavailable, because the seat reported no adapter load times; "
                             "they are inside base_load_seconds")
        else:
            notes.append(f"the base was not resident: loaded {base}{took}")
        if evicted:
            notes.append(f"evicted {', '.join(evicted)} to make room")
        adapter_s = adapter_seconds if seat_loras else None
        hit, ahit = False, (False if adapter else None)
    else:
        base_s = adapter_s = None
        hit = True
        ahit = (adapter in seat_loras) if adapter else None
    switched = traits(engine).adapters == "switched"  # the seat switches its active adapter and times the switch
    if adapter is None and seat_loras:
        notes.append(f"the base itself: the seat runs it with its {len(seat_loras)} adapter(s) disabled"
                     if switched else f"the base itself: all {len(seat_loras)} adapter(s) sent at scale 0 ({engine} "
                     "applies them when a request omits them)")
    activate = None
    if switched and seat_loras:
        notes.append(_ACTIVATE_PENDING)
    elif adapter:
        notes.append(f"activate_seconds unavailable, because {engine} applies an adapter inside the request "
                     "(a graph re-reservation when the scales change), which is part of the request's own time")
    return LoadReport(model=model, base=base, adapter=name, was_cached=not loaded, base_hit=hit, adapter_hit=ahit,
                      base_load_seconds=base_s, adapter_load_seconds=adapter_s, activate_seconds=activate,
                      evicted=tuple(evicted), resident_bytes_after={d: n for d, (n, _) in resident_bytes.items()},
                      resident_source={d: src for d, (_, src) in resident_bytes.items()},
                      budget_bytes=dict(budget_bytes), budget_source=dict(budget_source),
                      adapters_on_seat=len(seat_loras), notes=tuple(notes))


_ACTIVATE_PENDING = ("activate_seconds unavailable, because the seat did not answer with its x-fitevict-adapter "
                     "header (it measures the switch while it serves the request)")


def with_activation(report: LoadReport, seat_header: bytes | None) -> LoadReport:
    """``report`` with what the transformers seat measured activating the request's adapter (or disabling its
    adapters for the base): its ``x-fitevict-adapter`` answer header. Unchanged without one."""
    if seat_header is None or _ACTIVATE_PENDING not in report.notes:
        return report
    act = json.loads(seat_header)
    what = f"adapter {act['adapter']}" if act.get("adapter") else "the base (adapters disabled)"
    note = (f"activate_seconds: the seat made {what} active in {act['activate_seconds']:.6f} s, "
            f"{'switching from the previous request' if act.get('switched') else 'already active: no switch'}")
    return replace(report, activate_seconds=float(act["activate_seconds"]),
                   notes=tuple(note if n == _ACTIVATE_PENDING else n for n in report.notes))


def seat_adapter_seconds(engine: str, log_text: str) -> float | None:
    """Seconds a seat's start spent loading its adapters, by the engine's own account (its log)."""
    return engine_class(engine).adapter_seconds(log_text)


def resident_bytes(seats) -> dict[str, tuple[int, str]]:
    """What every seat is counted at now, per budget device, with the source: the seats' distinct sources
    (``SeatState.source_on``: planned, measured, engine-reported or predicted) joined."""
    out: dict[str, tuple[int, set[str]]] = {}
    for s in seats:
        for dev in ("CPU", *s.config.devices):
            n, srcs = out.get(dev, (0, set()))
            out[dev] = (n + s.bytes_on(dev), srcs | {s.source_on(dev)})
    return {d: (n, " + ".join(sorted(srcs))) for d, (n, srcs) in out.items()}


def budget_figures(budget) -> tuple[dict[str, int], dict[str, str]]:
    """Per device: the residents' budget and where it came from; empty when no budget was read yet."""
    if budget is None:
        return {}, {"all": "unavailable, because no plan has read the budget yet"}
    return ({d.name: d.budget_bytes for d in budget.devices},
            {d.name: f"{d.budget_source} ({d.total.source})" for d in budget.devices})


def request_report(sup, entry, seat, arrived: float, request_id: str | None, *, evicting: tuple[str, ...] = (),
                   adapter_log: str | None = None) -> LoadReport:
    """The report for a request for ``entry`` that ``sup`` (the supervisor's parts) handed ``seat``; ``arrived``:
    when it came (the supervisor's clock). Pure over the supervisor's state and what is passed, so that it can be
    built after the request went to the engine (``deferred_report``). ``evicting``: the seats whose eviction for
    this request was still under way when it got its seat (their events not recorded yet); ``adapter_log``: the
    seat's log, read off the event loop, when it loaded adapters for it."""
    loaded = seat.ready_at is not None and seat.ready_at >= arrived
    if not loaded:
        return hit_report(sup, entry, seat)
    adapter_s = seat_adapter_seconds(seat.engine, adapter_log) if adapter_log is not None else None
    recorded = tuple(e.model for e in sup.recent_events if e.event == "evict" and e.request_id == request_id
                     ) if request_id else ()
    evicted = tuple(dict.fromkeys((*recorded, *evicting)))  # a stop recorded since is named once
    report = _report(sup, entry, seat, loaded=True, adapter_s=adapter_s, evicted=evicted)
    return reloaded(report, sup.recent_events, seat.key, request_id)


async def deferred_report(sup, entry, seat, arrived: float, request_id: str | None, *,
                          evicting: tuple[str, ...] = ()) -> Callable[[], LoadReport]:
    """``request_report``, to be built when its header is first asked for (``report_headers``: once the request
    went to the engine), not before the request is forwarded. Only a seat that loaded adapters for this request has
    its log read first (off the event loop): the seconds they took are in it."""
    adapter_log = None
    if seat.config.loras and seat.ready_at is not None and seat.ready_at >= arrived:
        adapter_log = await asyncio.to_thread(log_text, Path(seat.log_path))
    return partial(request_report, sup, entry, seat, arrived, request_id, evicting=evicting, adapter_log=adapter_log)


def reloaded(report: LoadReport, events, key: str, request_id: str | None) -> LoadReport:
    """``report`` with why the resident seat of ``key`` was replaced for request ``request_id`` when a larger
    context was asked (its stop's reason names it: ``planner.mismatch``); unchanged for any other load."""
    for e in reversed(events) if request_id else ():
        if (e.event == "unload" and e.model == key and e.request_id == request_id
                and RELOADED_FOR_CTX in (e.reason or "")):
            why = e.reason[e.reason.index(RELOADED_FOR_CTX):].rstrip(")")
            return replace(report, reloaded_for=why, notes=(*report.notes, f"{why}: the resident seat was stopped "
                                                             "and the model loaded again at the larger context"))
    return report


# the last hit report (and its header text) of each model on each seat, with what it was made of; the budget
# reading is compared by identity. One per (model, seat): a report that no longer matches is replaced, not kept.
_hits: dict[tuple[str, str], tuple[tuple, object, LoadReport]] = {}
_headers: dict[int, tuple[LoadReport, str]] = {}


def hit_report(sup, entry, seat) -> LoadReport:
    """The report of a request that the resident seat took at once: nothing loaded, nothing evicted (no log to
    read, no event to scan), so it can be built after the request went to the engine. Memoized: between two hits
    it changes only when the residents' bytes, the budget reading or the seat do."""
    residents = resident_bytes(sup.seats.values())
    made_of = (seat.id, seat.engine, seat.config.loras, seat.load_seconds, tuple(residents.items()))
    got = _hits.get(which := (entry.key, seat.key))
    if got is not None and got[0] == made_of and got[1] is sup.last_budget:
        return got[2]
    report = _report(sup, entry, seat, loaded=False, adapter_s=None, evicted=(), residents=residents)
    if got is not None:
        _headers.pop(id(got[2]), None)
    if len(_hits) > 256:  # models that came and went
        _hits.clear()
        _headers.clear()
    _hits[which] = (made_of, sup.last_budget, report)
    _headers[id(report)] = (report, report.header())
    return report


def _header(report: LoadReport) -> str:
    got = _headers.get(id(report))
    return got[1] if got is not None and got[0] is report else report.header()


def _report(sup, entry, seat, *, loaded: bool, adapter_s: float | None, evicted: tuple[str, ...],
            residents: Mapping[str, tuple[int, str]] | None = None) -> LoadReport:
    budget, source = budget_figures(sup.last_budget)
    return load_report(model=entry.key, base=seat.key,
                       adapter=str(entry.path) if entry.kind in ADAPTER_KINDS else None,
                       seat_loras=seat.config.loras, loaded=loaded, load_seconds=seat.load_seconds,
                       adapter_seconds=adapter_s, evicted=evicted,
                       resident_bytes=residents if residents is not None else resident_bytes(sup.seats.values()),
                       budget_bytes=budget, budget_source=source, engine=seat.engine)


def seat_load_report(seat, plan, last_budget, seats, events=(), request_id: str | None = None) -> LoadReport:
    """The report a seat's ``load`` event carries: the base loaded (with every adapter it has), nothing hit;
    the adapters' seconds from the seat log, which the load has just finished writing; the budget of the last plan
    (``last_budget``) and what the running ``seats`` hold; why it was loaded again (``reloaded``: the recent
    ``events``, the request ``request_id`` it was loaded for)."""
    try:
        adapter_s = (seat_adapter_seconds(seat.engine, Path(seat.log_path).read_text(errors="replace"))
                     if seat.config.loras else None)
    except OSError:
        adapter_s = None
    budget, source = budget_figures(last_budget)
    report = load_report(model=seat.key, base=seat.key, adapter=None, seat_loras=seat.config.loras, loaded=True,
                         load_seconds=seat.load_seconds, adapter_seconds=adapter_s,
                         evicted=tuple(e.key for e in plan.evict),
                         resident_bytes=resident_bytes(seats.values()), budget_bytes=budget, budget_source=source,
                         engine=seat.engine)
    return reloaded(report, events, seat.key, request_id)


def report_headers(timing: Mapping, seat_header: bytes | None = None) -> dict[str, str]:
    """The response header carrying the request's load report, if the supervisor made one (a hit's report is
    made here, when it is first asked for: after the request went to the engine); ``seat_header``: a
    transformers seat's ``x-fitevict-adapter`` answer, whose activation the report then carries."""
    report = timing.get("load_report")
    if callable(report):
        report = timing["load_report"] = report()
    if isinstance(report, LoadReport) and timing.get("kv_restore") is not None and report.kv_restore is None:
        report = timing["load_report"] = replace(report, kv_restore=timing["kv_restore"])
    return _load_headers(timing, report, seat_header) | wait_headers(timing)


WAIT_HEADER = "x-fitevict-wait-estimate"


def wait_headers(timing: Mapping) -> dict[str, str]:
    """The wait stated when the request was queued (``schedule.estimate``), in seconds, beside the wait it had."""
    est = timing.get("wait_estimate")
    if est is None:
        return {}
    waited = timing.get("queue_s", 0.0) + timing.get("load_s", 0.0)
    return {WAIT_HEADER: f"{est.seconds:.3f}", "x-fitevict-waited": f"{waited:.3f}"}


def _load_headers(timing: Mapping, report: Any, seat_header: bytes | None) -> dict[str, str]:
    shrunk = timing.get("ctx_shrunk")
    if isinstance(report, LoadReport) and shrunk is not None and not any(n.startswith(SHRUNK) for n in report.notes):
        report = timing["load_report"] = replace(report, notes=(*report.notes, shrunk_note(shrunk)))
    if shrunk is not None:
        extra = {SHRUNK_HEADER: f"{shrunk['asked_ctx']}->{shrunk['loaded_ctx']}"}
        return ({HEADER: _header(with_activation(report, seat_header))} if isinstance(report, LoadReport) else {}) | extra
    return {HEADER: _header(with_activation(report, seat_header))} if isinstance(report, LoadReport) else {}


def shrunk_note(shrunk: Mapping) -> str:
    need = shrunk.get("need") or {}
    return (f"{SHRUNK}: ctx {shrunk['asked_ctx']} does not fit; loaded at ctx {shrunk['loaded_ctx']}, the largest "
            f"that fits, which holds this request ({need.get('why', 'its tokens counted')}); policy.shrink_ctx")


def plan_hits(entry, plan) -> dict:
    """What the plan dry run says about sharing: the seat (base) a request for ``entry`` goes to, and whether it
    would be a base hit (and an adapter hit: the resident seat loaded the adapter), loading nothing."""
    hit = plan.action == "hit"
    out: dict = {"base": entry.base or entry.key, "base_hit": hit}
    if entry.base is not None:
        out["adapter_hit"] = hit  # a hit needs a seat that loaded this adapter (its "loras" is a fixed field)
    return out
