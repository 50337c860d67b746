"""The /metrics registry (prometheus-client): requests and their waits, the budget, what residents hold, and what
fitevict did.

Three kinds of figures, each from one place:
- the request path observes its own latency, queue wait and load wait (``fitevict.server.openai``);
- gauges are set at scrape time from a fresh budget reading and the residents' views (:meth:`Metrics.collect`);
- counters and the load / release histograms follow the recorded history: :meth:`Metrics.observe_event` is
  registered on ``Supervisor.on_event``, so a metric moves exactly when an event is stored, and a count can be
  checked against ``/v1/models/history``.

Counters carry a ``reason`` label from :func:`reason_label`: a short class, never the free-text reason (which
holds numbers and would make a new series per event).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fitevict.store.records import Event

LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
RELEASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STOP_EVENTS = ("evict", "unload", "idle-unload", "recycle")


def reason_label(ev: Event) -> str:
    """The short, bounded class of an event's reason, for counter labels."""
    if ev.event == "load":  # the strategy's name, without its figures: "ram-only (ngl=0, ctx=4096)" -> "ram-only"
        return (ev.strategy or "load").split(" (")[0]
    if ev.event == "unload":  # who asked for it: nobody waiting any more, a shutdown, a reload, a client
        text = (ev.reason or "").lower()
        for needle, label in (("no one waiting", "no one waiting"), ("shutting down", "shutdown"),
                              ("another configuration", "replaced"), ("keep-alive", "keep-alive")):
            if needle in text:
                return label
        return "requested"
    if ev.event in STOP_EVENTS:
        return ev.event
    if ev.event == "crash":
        code = ev.details.get("exit_code")
        return f"exit code {code}" if code is not None else "exit code unknown"
    if ev.event == "refuse":
        plan = ev.details.get("plan") or {}
        return "largest context fits" if plan.get("largest_ctx") else "does not fit"
    if ev.event == "fail":
        text = (ev.reason or "").lower()
        for needle, label in (("no-weights", "no weights"), ("timed out", "timeout"), ("timeout", "timeout"),
                              ("stall", "stalled"),
                              ("exited", "engine exited"), ("cancel", "cancelled")):
            if needle in text:
                return label
        return "other"
    if ev.event == "leak":
        return ev.strategy or "leak"
    return ev.event


def leak_reason(ev: Event) -> str | None:
    """Why a stop's memory did not come back, or None when it did (or the event is no stop)."""
    if ev.event == "leak":
        return reason_label(ev)
    if ev.event not in (*STOP_EVENTS, "crash", "fail") or "release_verified" not in ev.details:
        return None
    if ev.details["release_verified"]:
        return None
    note = str(ev.details.get("release_note") or "")
    if note.startswith("not released within the timeout"):
        return "not released within the timeout"
    if "never measured" in note:
        return "held memory never measured"
    return "release unverified"


class Metrics:
    """The registry and every metric in it."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        # the request path (fitevict.server.openai)
        self.requests = Counter("fitevict_requests_total", "Inference requests", ["model", "endpoint", "status"],
                                registry=r)
        self.latency = Histogram("fitevict_request_seconds", "Inference latency: from holding a seat to the "
                                 "response's end (queue and load waits excluded)", ["endpoint"], registry=r)
        self.total = Histogram("fitevict_request_total_seconds", "Whole request: queue wait + load wait + inference",
                               ["endpoint"], registry=r)
        self.queue_wait = Histogram("fitevict_queue_wait_seconds", "Time a request waited in the queue (not for a "
                                    "load)", ["endpoint"], registry=r)
        self.load_wait = Histogram("fitevict_load_wait_seconds", "Time a request waited for its model to load",
                                   ["endpoint"], registry=r)
        self.prompt = Histogram("fitevict_prompt_seconds", "Prompt processing, as the engine's own timings say",
                                ["model"], registry=r)
        self.generation = Histogram("fitevict_generation_seconds", "Token generation, as the engine's own timings say",
                                    ["model"], registry=r)
        self.gen_tps = Gauge("fitevict_generation_tokens_per_second", "The last request's generation speed "
                             "(the engine's timings)", ["model"], registry=r)
        self.prompt_tps = Gauge("fitevict_prompt_tokens_per_second", "The last request's prompt speed "
                                "(the engine's timings)", ["model"], registry=r)
        # gauges, set at scrape time
        self.resident = Gauge("fitevict_resident_bytes", "Bytes held by resident models, by device and source "
                              "(predicted, allocated: engine-reported, measured: PSS, NVML, DRM fdinfo or an rpc-server's PSS, "
                              "planned: what the "
                              "planner counts)", ["model", "device", "source"], registry=r)
        self.budget = Gauge("fitevict_budget_bytes", "The most fitevict's residents may hold on a device "
                            "(source: how it was derived)", ["device", "source"], registry=r)
        self.free = Gauge("fitevict_free_bytes", "Free memory on a device now (source: meminfo MemAvailable, "
                          "NVML, engine-reported, declared)", ["device", "source"], registry=r)
        self.reserve = Gauge("fitevict_reserve_bytes", "Memory kept free for everything else on a device",
                             ["device", "source"], registry=r)
        self.total_bytes = Gauge("fitevict_device_total_bytes", "A device's total memory", ["device", "source"],
                                 registry=r)
        self.unified = Gauge("fitevict_device_unified", "1 when a device's memory is host memory (its bytes count "
                             "against the CPU budget too), 0 when it has its own (source: who said so)",
                             ["device", "source"], registry=r)
        self._history_metrics(r)
        self._by_event = {"load": self.loads, "evict": self.evictions, "unload": self.unloads,
                          "idle-unload": self.unloads, "recycle": self.unloads, "refuse": self.refusals,
                          "fail": self.failed, "crash": self.crashes, "leak": self.leaks}

    def _history_metrics(self, r: CollectorRegistry) -> None:
        """The counters and histograms moved by recorded history events and waiting requests."""
        self.loads = Counter("fitevict_loads_total", "Loads that completed, by placement strategy",
                             ["model", "reason"], registry=r)
        self.evictions = Counter("fitevict_evictions_total", "Seats stopped to make room", ["model", "reason"],
                                 registry=r)
        self.unloads = Counter("fitevict_unloads_total", "Seats stopped on request or when idle",
                               ["model", "reason"], registry=r)
        self.refusals = Counter("fitevict_refusals_total", "Loads refused: the model does not fit the budget",
                                ["model", "reason"], registry=r)
        self.failed = Counter("fitevict_failed_loads_total", "Loads that failed", ["model", "reason"], registry=r)
        self.crashes = Counter("fitevict_crashes_total", "Seats that exited on their own", ["model", "reason"],
                               registry=r)
        self.leaks = Counter("fitevict_leaks_total", "Stops whose memory was not verified to come back",
                             ["model", "reason"], registry=r)
        self.pressure = Counter("fitevict_pressure_events_total", "Times free memory fell below a device's reserve "
                                "because of other programs (or the residents), by whether idle seats were stopped",
                                ["reason"], registry=r)
        self.others = Gauge("fitevict_others_bytes", "Memory held by programs that are not fitevict's, by device "
                            "(total - free - held)", ["device"], registry=r)
        self.under_pressure = Gauge("fitevict_under_pressure", "1 while a device is under memory pressure",
                                    ["device"], registry=r)
        self.outgrew = Counter("fitevict_outgrew_total", "Seats whose reading exceeded their price by more than "
                               "budget.outgrow_margin (one outgrew event each)", ["model", "device"], registry=r)
        self.outgrowing = Gauge("fitevict_resident_outgrowing", "1 while a resident's reading exceeds its price by "
                                "more than budget.outgrow_margin (it is stopped first under memory pressure)",
                                ["model"], registry=r)
        self.reading_age = Gauge("fitevict_resident_reading_age_seconds", "Age of the reading behind a resident's "
                                 "measured bytes (the memory sampler's latest)", ["model", "device"], registry=r)
        self.waiting = Gauge("fitevict_waiting_requests", "Requests waiting for a seat, by model and priority class",
                             ["model", "class"], registry=r)
        self.wait_estimate = Gauge("fitevict_wait_estimate_seconds", "The longest wait estimated now for a waiting "
                                   "request (position, measured loads and service), by model and class",
                                   ["model", "class"], registry=r)
        self.estimate_error = Histogram("fitevict_wait_estimate_error_seconds", "A request's wait as estimated when "
                                        "it was queued, less the wait it had", ["endpoint"],
                                        buckets=(-10, -5, -2, -1, -0.5, -0.1, 0.1, 0.5, 1, 2, 5, 10), registry=r)
        self.load_seconds = Histogram("fitevict_load_seconds", "Seconds from starting an engine to its seat being "
                                      "ready", ["model", "engine"], buckets=LOAD_BUCKETS, registry=r)
        self.release_seconds = Histogram("fitevict_release_seconds", "Seconds from a seat's exit until its memory "
                                         "was verified back (measured)", ["event"], buckets=RELEASE_BUCKETS,
                                         registry=r)

    def observe_event(self, ev: Event) -> None:
        """Move the counters and histograms for one recorded history event (``Supervisor.on_event``)."""
        model = ev.model or "-"
        counter = self._by_event.get(ev.event)
        if counter is not None:
            counter.labels(model, reason_label(ev)).inc()
        leak = leak_reason(ev)
        if leak is not None and ev.event != "leak":
            self.leaks.labels(model, leak).inc()
        if ev.event == "outgrew":
            self.outgrew.labels(model, str(ev.details.get("device", "-"))).inc()
        if ev.event == "pressure":
            self.pressure.labels("stopped idle seats" if ev.details.get("stopped") else "nothing idle").inc()
        if ev.event == "load" and ev.seconds is not None:
            self.load_seconds.labels(model, ev.engine or "-").observe(ev.seconds)
        released = ev.details.get("release_seconds")
        if isinstance(released, (int, float)) and not isinstance(released, bool):
            self.release_seconds.labels(ev.event).observe(released)

    def collect(self, budget: Any, residents: list[dict], queued: list[dict] = ()) -> None:  # type: ignore[assignment]
        """Set the gauges from a budget reading (``Supervisor.budget()``), ``Supervisor.resident_views()`` and
        ``Supervisor.queued_views()``."""
        for g in (self.budget, self.free, self.reserve, self.total_bytes, self.unified, self.resident, self.others,
                  self.under_pressure, self.outgrowing, self.reading_age, self.waiting, self.wait_estimate):
            g.clear()
        longest: dict[tuple[str, str], float] = {}
        for q in queued:
            k = (q["model"], q["class"])
            self.waiting.labels(*k).inc()
            longest[k] = max(longest.get(k, 0.0), q["estimate"]["seconds"])
        for k, seconds in longest.items():
            self.wait_estimate.labels(*k).set(seconds)
        for d in budget.devices:
            self.others.labels(d.name).set(d.others_bytes)
            self.under_pressure.labels(d.name).set(1 if "pressure" in d.reserve.source else 0)
            self.budget.labels(d.name, d.budget_source).set(d.budget_bytes)
            self.free.labels(d.name, d.free.source).set(d.free.bytes)
            self.reserve.labels(d.name, d.reserve.source).set(d.reserve.bytes)
            self.total_bytes.labels(d.name, d.total.source).set(d.total.bytes)
            if d.unified_source:
                self.unified.labels(d.name, d.unified_source).set(1 if d.unified else 0)
        for v in residents:
            self.outgrowing.labels(v["key"]).set(1 if v.get("outgrew") else 0)
            for dev, d in v["devices"].items():
                if d.get("measured_age_seconds") is not None:
                    self.reading_age.labels(v["key"], dev).set(d["measured_age_seconds"])
                for figure in ("predicted", "allocated", "measured", "planned"):  # each under its own name
                    if d.get(f"{figure}_bytes") is not None:
                        self.resident.labels(v["key"], dev, figure).set(d[f"{figure}_bytes"])
