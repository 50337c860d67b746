"""What a resident looks like from outside: one view per seat, for the API, the dashboard, ``ps`` and metrics."""

from __future__ import annotations

from fitevict.pricing.footprint import HOST
from fitevict.seat.measure import mem_json
from fitevict.supervisor.ports import Ports


def resident_views(parts: Ports) -> list[dict]:
    out = []
    now = parts.clock()
    carried = {r.key: r.carries for r in parts.scheduler.residents(now)}  # the binary's shared pages, once
    for s in parts.seats.values():
        record = parts.scheduler.seats.get(s.key)
        devices = [HOST, *s.config.devices]
        per_dev = {d: s.figures(d, now, carried.get(s.key, 0)) for d in devices}
        gpu = sum(s.bytes_on(d) for d in s.config.devices)
        host = s.bytes_on(HOST, carried.get(s.key, 0))
        total = gpu + host
        placement = (f"{100 * host / total:.0f}%/{100 * gpu / total:.0f}% CPU/GPU" if gpu and total
                     else "100% CPU")
        due = parts.scheduler.idle_due_at(record) if record is not None else None
        out.append({
            "key": s.key, "engine": s.engine, "state": str(s.state),
            "phase": record.status.value if record is not None else None, "placement": placement,
            **({"split": s.split} if s.split else {}),
            "devices": per_dev, "ctx": s.config.n_ctx,
            # its devices whose memory is host memory: their bytes count against the host budget too
            "unified": list(s.shared), "config": s.config.to_json(),
            "in_flight": record.in_flight if record is not None else 0,
            "waiting": parts.scheduler.waiting(s.key),
            "last_used": record.last_used if record is not None else None, "loaded_at": s.ready_at,
            "load_seconds": s.load_seconds, "pid": s.pid, "port": s.port, "unload_at": due,
            # GreedyDual-Size: H, and L (the floor H falls back to): H - L is what evicting it costs, comparable
            # between machines (each has its own L)
            "greedy_dual": ({"priority": record.priority, "floor": parts.scheduler.inflation,
                             "reload_seconds": record.reload_seconds} if record is not None else None),
            "host_pss": mem_json(s.host_mem),
            "measured_at": s.read_at, "readings": s.readings,
            # its reading exceeded its price by more than budget.outgrow_margin: the figures, else None
            "outgrew": s.outgrew,
            # what an earlier seat of this file and configuration outgrew to here, in its price (``pricing.grown``)
            "price_learned": ({"extra_bytes": dict(s.predicted.grown), "source": s.predicted.grown_from}
                              if s.predicted.grown else None),
            "engine_timings": s.timings.to_json(),
        })
    return out


def queued_views(parts: Ports) -> list[dict]:
    """Every request waiting for a seat, in the queue's order: its model, client, class, how long it has waited and
    the wait estimated for it now (``schedule.estimate``), for ``ps``, the dashboard and ``/metrics``."""
    now = parts.clock()
    sched = parts.scheduler
    return [{"model": w.key, "request_id": w.request_id, "client": w.share.client, "class": w.share.klass,
             "waited_seconds": round(now - w.arrived, 3), "estimate": sched.estimate(w).to_json()}
            for w in sched.queue]
