"""The dashboard's bars from figures: widths are bytes over the bar's scale, every segment says its figure and
source, a GPU card stacks the residents' GPU bytes, and a figure never measured is shown as unavailable."""

from __future__ import annotations

import re

from fitevict.budget import Budget
from fitevict.server.dashboard_view import device_card, plan_verdict
from fitevict.units import GiB, MiB


def resident(key: str, cpu: int | None, gpu: int | None) -> dict:
    dev = lambda m, p: {"measured_bytes": m, "measured_source": "measured" if m is not None else  # noqa: E731
                        "unavailable, because it was not measured yet", "predicted_bytes": p,
                        "predicted_source": "formula+dry-run"}
    return {"key": key, "devices": {"CPU": dev(cpu, 100 * MiB), "CUDA0": dev(gpu, 3 * GiB)}}


def segments(html: str, kind: str, device: str) -> tuple[int, list[tuple[str, int, float, str]]]:
    bar = re.search(rf'data-device="{device}" data-kind="{kind}" data-scale="(\d+)">(.*?)</div><span', html)
    assert bar, html
    segs = re.findall(r'class="seg ([^"]+)"(?: data-model="([^"]*)")? data-bytes="(\d+)" style="width:([\d.]+)%[^"]*" '
                      r'title="([^"]*)"', bar.group(2))
    return int(bar.group(1)), [(model or cls, int(n), float(w), title) for cls, model, n, w, title in segs]


def test_gpu_bars_stack_measured_bytes_over_the_budget() -> None:
    budget = Budget.declared({"CPU": {"total": "16GiB"}, "CUDA0": {"total": "24GiB", "reserve": "1GiB",
                                                                   "held": "6GiB", "free": "10GiB"}})
    gpu = budget.device("CUDA0")
    html = device_card(gpu, [resident("a", 200 * MiB, 4 * GiB), resident("b", None, None)], admin=False)
    scale, segs = segments(html, "measured", "CUDA0")
    assert scale == gpu.budget_bytes
    by = {name: (n, w, title) for name, n, w, title in segs}
    assert by["a"][0] == 4 * GiB and abs(by["a"][1] - 100 * 4 * GiB / scale) < 1e-3
    assert "measured 4.00 GiB (measured)" in by["a"][2] and "predicted 3.00 GiB (formula+dry-run)" in by["a"][2]
    assert "b" not in by and "b: unavailable" in html  # never measured: named, not drawn as 0
    assert by["room"][0] == scale - 4 * GiB
    _scale, predicted = segments(html, "predicted", "CUDA0")
    assert [(n, b) for n, b, _w, _t in predicted][:2] == [("a", 3 * GiB), ("b", 3 * GiB)]
    total, machine = segments(html, "machine", "CUDA0")
    assert total == 24 * GiB and sum(n for _n, n, _w, _t in machine) == total
    assert {name for name, *_ in machine} == {"others", "held", "reserve", "free"}


def test_plan_verdicts_in_a_few_words() -> None:
    base = {"evict": [], "wait_for": [], "largest_ctx": None}
    assert plan_verdict({**base, "action": "load"}) == ("fits", "fits")
    assert plan_verdict({**base, "action": "hit"}) == ("resident", "hit")
    evict = {**base, "action": "ram", "evict": [{"key": "x", "bytes": {"CPU": 300 * MiB}, "reason": "r"}]}
    assert plan_verdict(evict) == ("evicts x (300 MiB)", "evict")
    assert plan_verdict({**base, "action": "refuse", "largest_ctx": 3840}) == (
        "refused; largest ctx that fits: 3840", "refuse")


def test_a_resident_outgrowing_its_price_is_marked_and_its_event_shown() -> None:
    from fitevict.server.dashboard_view import residents_table, timeline
    from fitevict.store.records import Event

    cpu = {"measured_bytes": 70 * MiB, "measured_source": "measured: PSS", "predicted_bytes": 40 * MiB,
           "predicted_source": "formula"}
    row = {"key": "leaky", "state": "ready", "placement": "100% CPU", "devices": {"CPU": cpu}, "ctx": 4096,
           "in_flight": 0, "last_used": 1.0, "unload_at": None}
    outgrew = {"device": "CPU", "reading_bytes": 70 * MiB, "price_bytes": 40 * MiB, "bound_bytes": 16 * MiB,
               "growth_bytes_per_second": 2 * MiB}
    html = residents_table([{**row, "outgrew": outgrew}, {**row, "key": "healthy", "outgrew": None}], {}, False, 2.0)
    marked = re.findall(r'<tr class="resident" data-model="(\w+)">.*?</tr>', html)
    assert marked == ["leaky", "healthy"]
    leaky, healthy = html.split('data-model="healthy"')
    assert 'class="miss outgrew"' in leaky and "70.0 MiB against 40.0 MiB priced" in leaky
    assert "outgrew" not in healthy
    ev = Event(time=3.0, event="outgrew", model="leaky", engine="llama-server", reason="leaky outgrew its price",
               host_bytes=70 * MiB, predicted_bytes=46 * MiB,
               details={**outgrew, "source": "measured: the sampler's"})
    assert "read 70.0 MiB of 40.0 MiB priced" in timeline([ev])
