"""The soak's report, from its JSONL file alone: growth per hour of each sampled series after warm-up (a least-squares
line, with the slope's standard error and the residuals' spread), every request accounted for (answered, hung up by
its client, cut by a named injected fault, or lost), faults injected and survived, and PNG plots. Writes
docs/reliability.md's ``soak`` section and docs/img/soak-*.png."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402

DOCS = Path(__file__).resolve().parent.parent / "docs"
DOC, IMG = DOCS / "reliability.md", DOCS / "img"
MiB = 2**20
# (sample field, label, divisor, unit)
SERIES = (("rss", "front door RSS", MiB, "MiB"), ("pss", "front door PSS", MiB, "MiB"),
          ("fds", "open descriptors", 1, ""), ("fds_sockets", "descriptors: sockets", 1, ""),
          ("fds_pidfds", "descriptors: pidfds (one per seat)", 1, ""), ("fds_pipes", "descriptors: pipes", 1, ""),
          ("fds_store", "descriptors: the store's files", 1, ""), ("fds_other", "descriptors: the rest", 1, ""),
          ("threads", "threads", 1, ""), ("children", "child processes", 1, ""),
          ("zombies", "zombie children", 1, ""), ("db_bytes", "database files", MiB, "MiB"),
          ("seat_logs_bytes", "seat logs", MiB, "MiB"), ("data_bytes", "data directory", MiB, "MiB"),
          # what the RSS is made of, by the door's own allocators (``/health`` ``heap.held``): kept or fragmented
          ("malloc_in_use", "malloc: bytes in use", MiB, "MiB"), ("malloc_free", "malloc: free inside its heaps", MiB,
                                                                   "MiB"),
          ("malloc_mapped_apart", "malloc: chunks mapped apart (above its mmap threshold)", MiB, "MiB"),
          ("sqlite_in_use", "SQLite: bytes it holds (part of malloc's in use)", MiB, "MiB"),
          ("outside_malloc", "anonymous, outside malloc's heaps (Python's arenas, stacks)", MiB, "MiB"),
          ("python_blocks", "Python: allocated blocks (thousands)", 1000, ""))
CUT_BY = ("seat-sigkill", "seat-sigstop")  # the faults that may cut a request of their seat's model


def read(path: Path) -> dict[str, list[dict]]:
    """The run's records by kind; a last line cut mid-write (the run killed) is left out."""
    out: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # the torn last line of a run that was killed while writing
        out.setdefault(rec["rec"], []).append(rec)
    return out


def fit(ts: list[float], ys: list[float]) -> dict:
    """A least-squares line through (hours, y): slope per hour, its standard error, the residuals' spread."""
    t, y = np.asarray(ts) / 3600.0, np.asarray(ys, dtype=float)
    if len(t) < 3 or np.ptp(t) == 0:
        return {"n": len(t), "slope": None, "se": None, "spread": None, "lo": min(ys, default=None),
                "hi": max(ys, default=None)}
    a, b = np.polyfit(t, y, 1)
    resid = y - (a * t + b)
    se = float(np.sqrt((resid ** 2).sum() / (len(t) - 2) / ((t - t.mean()) ** 2).sum()))
    return {"n": len(t), "slope": float(a), "se": se, "spread": float(resid.std()), "lo": float(y.min()),
            "hi": float(y.max())}


def account(requests: list[dict], faults: list[dict]) -> list[dict]:
    """Each request with its verdict: ``ok``, ``hung-up``, ``cut`` (by the fault it names: a seat fault of its model
    whose window, from the injection to the door's handling of it, overlaps the request) or ``lost``."""
    out = []
    for r in requests:
        verdict, by = r["outcome"], None
        if verdict == "failed":
            by = next((f for f in faults if f["fault"] in CUT_BY and f.get("model") == r["model"]
                       and r["t0"] <= f["t_end"] and r["t1"] >= f["t"]), None)
            verdict = "cut" if by else "lost"
        out.append({**r, "verdict": verdict, "cut_by": by and f"{by['fault']} of {by['model']} (pid {by['pid']})"})
    return out


def _f(x: float | None, spec: str = ".2f") -> str:
    return "unavailable" if x is None else f"{x:{spec}}"


def growth_table(samples: list[dict], t_warm: float) -> list[str]:
    after = [s for s in samples if s["t"] >= t_warm]
    lines = ["| series (after warm-up) | growth per hour | ± (std. error) | spread (residual σ) | min | max | "
             "samples |", "|---|---:|---:|---:|---:|---:|---:|"]
    for key, label, div, unit in SERIES:
        pts = [(s["t"], s[key] / div) for s in after if s.get(key) is not None]
        if not pts:
            continue  # a run that did not sample it
        f = fit([p[0] for p in pts], [p[1] for p in pts])
        u = f" {unit}" if unit else ""
        lines.append(f"| {label}{f' ({unit})' if unit else ''} | {_f(f['slope'])}{u}/h | {_f(f['se'])} | "
                     f"{_f(f['spread'])} | {_f(f['lo'])} | {_f(f['hi'])} | {f['n']} |")
    return lines


def request_table(verdicts: list[dict]) -> list[str]:
    kinds = sorted({r["kind"] for r in verdicts})
    lines = ["| request | sent | answered | hung up by the client | cut by a fault | lost |",
             "|---|---:|---:|---:|---:|---:|"]
    for k in [*kinds, None]:
        rs = [r for r in verdicts if k is None or r["kind"] == k]
        c = Counter(r["verdict"] for r in rs)
        name = "**all**" if k is None else f"`{k}`"
        lines.append(f"| {name} | {len(rs)} | {c['ok']} | {c['hung-up']} | {c['cut']} | {c['lost']} |")
    return lines


def fault_table(faults: list[dict], verdicts: list[dict]) -> list[str]:
    lines = ["| fault | injected | skipped (nothing to inject into) | survived | the seat's end in history | "
             "requests it cut |", "|---|---:|---:|---:|---|---:|"]
    for kind in sorted({f["fault"] for f in faults}):
        fs = [f for f in faults if f["fault"] == kind]
        done = [f for f in fs if "skipped" not in f]
        cut = sum(1 for r in verdicts if r["cut_by"] and r["cut_by"].startswith(kind + " "))
        ends = Counter(f.get("ended_as") or "none" for f in done if "pid" in f)
        lines.append(f"| {kind} | {len(done)} | {len(fs) - len(done)} | {sum(1 for f in done if f['survived'])} | "
                     f"{', '.join(f'{n}× {e}' for e, n in ends.most_common()) or 'n/a'} | {cut} |")
    return lines


def _series_fit(samples: list[dict], key: str, t_warm: float, div: float = 1.0) -> dict:
    pts = [(x["t"], x[key] / div) for x in samples if x["t"] >= t_warm and x.get(key) is not None]
    return fit([p[0] for p in pts], [p[1] for p in pts])


def targets(samples: list[dict], t_warm: float, lost: int, b: dict) -> str:
    """Each target against what was measured: met, or not, with the figures."""
    rss = _series_fit(samples, "rss", t_warm, MiB)

    def flat(key: str) -> str:
        f = _series_fit(samples, key, t_warm)
        if f["slope"] is None:
            return "unavailable (too few samples after warm-up)"
        drift = abs(f["slope"]) > 2 * f["se"]
        verdict = "drifting" if drift else "flat within twice its standard error"
        return f"{verdict} ({f['slope']:+.2f} ± {f['se']:.2f}/h; {f['lo']:.0f} to {f['hi']:.0f})"

    logs = max((x["seat_logs_bytes"] for x in samples), default=None)
    rss_ok = rss["slope"] is not None and rss["slope"] <= 5
    end = max((x["t"] for x in samples), default=t_warm)
    last = _series_fit(samples, "rss", max(t_warm, end - 3600), MiB)  # whether the growth levels off
    last_hour = (f" (over the last hour alone: {_f(last['slope'])} ± {_f(last['se'])} MiB/h)"
                 if end - 3600 > t_warm and last["slope"] is not None else "")
    return ("Targets: " + f"requests lost outside the faults' cuts: {lost} ({'met' if lost == 0 else 'not met'}); "
            f"front-door RSS growth after warm-up {_f(rss['slope'])} ± {_f(rss['se'])} MiB/h against ≤ 5 "
            f"({'met' if rss_ok else 'not met' if rss['slope'] is not None else 'unavailable'}){last_hour}; descriptors "
            f"{flat('fds')}; children {flat('children')}; zombies at most "
            f"{max((x['zombies'] for x in samples), default=0)}; seat logs at most "
            f"{_f(logs and logs / MiB, '.1f')} MiB against `logs.seats_disk` {b['seat_logs'] / MiB:.0f} MiB "
            f"({'within' if logs is not None and logs <= b['seat_logs'] else 'over'}).")


def descriptors_by_seats(samples: list[dict], t_warm: float) -> str:
    """Descriptors fitted to the seats resident and the time together (least squares): each seat holds some (its
    pidfd, its kept connections), so a run that ends with more seats resident than it began with drifts by the fit
    on time alone; what is left to time is the door's own drift."""
    pts = [x for x in samples if x["t"] >= t_warm and x.get("fds") is not None and x.get("seats") is not None]
    if len(pts) < 4:
        return "Descriptors against the seats resident: unavailable (too few samples after warm-up)."
    t = np.array([x["t"] for x in pts]) / 3600.0
    X = np.c_[np.ones(len(pts)), [x["seats"] for x in pts], t - t.mean()]
    y = np.array([x["fds"] for x in pts], dtype=float)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    cov = (resid @ resid) / (len(y) - 3) * np.linalg.pinv(X.T @ X)
    return (f"Descriptors fitted to the seats resident and the time together: {coef[1]:.2f} per seat resident, "
            f"{coef[2]:+.2f} ± {float(np.sqrt(cov[2, 2])):.2f}/h left to time ({len(pts)} samples after warm-up).")


def history_line(end: dict | None) -> str:
    """The door's own account of the run: its history events by kind."""
    if end is None or isinstance(end.get("history"), str) or "history" not in end:
        return ("The door's history at the end: " + (end or {}).get("history", "not read (the run has not ended)")
                + ".")
    c = Counter(e["event"] for e in end["history"])
    return ("The door's history at the end (its last 10,000 events at most): "
            + ", ".join(f"{n} {e}" for e, n in c.most_common()) + ".")


def notes(verdicts: list[dict], faults: list[dict]) -> list[str]:
    """What the clients of cut requests saw, every lost request's error, every fault not survived."""
    cut = Counter(r["error"].split(":")[0][:80] for r in verdicts if r["verdict"] == "cut")
    out = ["What the cut requests' clients saw (status and error type/code): "
           + ("; ".join(f"{n}× {e}" for e, n in cut.most_common()) or "none") + "."]
    lost = [r for r in verdicts if r["verdict"] == "lost"]
    out += [f"- lost: `{r['kind']}` of `{r['model']}` (stream {r['stream']}) at +{r['t0'] - verdicts[0]['t0']:.0f} s, "
            f"{r['t1'] - r['t0']:.1f} s: {r['error']}" for r in lost[:20]]
    if len(lost) > 20:
        out.append(f"- ... and {len(lost) - 20} more lost (the JSONL file has each).")
    bad = [f for f in faults if "skipped" not in f and not f["survived"]]
    out += [f"- not survived: {f['fault']} of {f.get('model')} (its seat {f.get('state', 'n/a')}): {f['how']}"
            for f in bad]
    stops = [f for f in faults if f.get("ended_as") not in (None, "crash", "fail")]
    drained = [f for f in stops if f.get("drained")]
    if drained:
        out.append(f"- ended as the stop the seat drained for (`draining: true`, its cause as a crash's): "
                   f"{len(drained)}× ({', '.join(sorted({str(f['ended_as']) for f in drained}))}). One: "
                   f"{drained[0]['fault']} of {drained[0]['model']} (its seat {drained[0].get('state')}): "
                   f"{drained[0]['how']}")
    raced = [f for f in stops if not f.get("drained")]
    if raced:
        seat_faults = sum(1 for f in faults if "pid" in f)
        states = Counter(str(f.get("state", "n/a")).split(",")[0] for f in raced)
        out.append(f"- handled, but recorded as `{raced[0]['ended_as']}`, not `crash`: {len(raced)} of {seat_faults} "
                   f"seat faults (the seat {', '.join(f'{st} {n}×' for st, n in states.most_common())} when hit, "
                   "another model waiting for its memory: the seat's end was recorded as that eviction)."
                   f" One: {raced[0]['fault']} of {raced[0]['model']} (its seat {raced[0].get('state')}): "
                   f"{raced[0]['how']}")
    return out


def plots(samples: list[dict], faults: list[dict], t0: float, t_warm: float, img: Path = IMG) -> list[str]:
    """docs/img/soak-*.png; [] with a line saying why when matplotlib is absent."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install -e '.[bench]', or pip install matplotlib)")
        return []
    img.mkdir(parents=True, exist_ok=True)
    groups = {"memory": ("rss", "pss"), "handles": ("fds", "threads", "children", "zombies"),
              "disk": ("db_bytes", "seat_logs_bytes", "data_bytes"),
              "heap": ("malloc_in_use", "malloc_free", "malloc_mapped_apart", "sqlite_in_use", "outside_malloc",
                       "python_blocks")}
    names = []
    for name, keys in groups.items():
        fig, ax = plt.subplots(figsize=(8, 3.2), dpi=100)
        pts = 0
        for key, label, div, unit in SERIES:
            have = [s for s in samples if s.get(key) is not None]
            if key in keys and have:
                ax.plot([(s["t"] - t0) / 60 for s in have], [s[key] / div for s in have], label=label)
                pts += len(have)
        if not pts:
            plt.close(fig)
            continue
        ax.axvspan(0, (t_warm - t0) / 60, color="0.9", label="warm-up")
        for f in faults:
            if "skipped" not in f:
                ax.axvline((f["t"] - t0) / 60, color="red" if not f["survived"] else "0.6", lw=0.5)
        ax.set_xlabel("minutes (grey lines: faults injected; red: not survived)")
        ax.set_ylabel({"handles": "count", "heap": "MiB, thousands of blocks"}.get(name, "MiB"))
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        fig.savefig(img / f"soak-{name}.png")
        plt.close(fig)
        names.append(name)
    return names


def bounds_text(b: dict) -> str:
    return (f"seat logs {b['seat_logs'] / MiB:.0f} MiB in all and {b.get('seats_per_model', '?')} per model, saved "
            f"prompts {b['prompt_cache'] / MiB:.0f} MiB, history {b['history_rows'] or 'unbounded'} rows and "
            f"{b['history_days'] or 'unbounded'} days"
            + (f", load records and peak windows {b['records_per_signature'] or 'unbounded'} per configuration and "
               f"{b['records_rows'] or 'unbounded'} in all" if "records_rows" in b else "")
            + f", pruned every {b.get('prune_seconds', 0):.0f} s")


def body(recs: dict[str, list[dict]], warmup_min: float | None, img: Path = IMG) -> str:
    meta, samples = recs["meta"][0], recs.get("sample", [])
    faults, end = recs.get("fault", []), (recs.get("end") or [None])[0]
    warm = meta["warmup_minutes"] if warmup_min is None else warmup_min
    t0 = meta["t"]
    t_warm = t0 + warm * 60
    verdicts = account(recs.get("request", []), faults)
    last = max([s["t"] for s in samples] + [r["t1"] for r in verdicts] + [t0])
    loads = [s["load1"] for s in samples]
    c = Counter(r["verdict"] for r in verdicts)
    b = meta["bounds"]
    data_max = max((s["data_bytes"] for s in samples), default=None)
    lines = [
        "## Soak (`bench/soak.py`)",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))}: `{meta['command']}`, fitevict "
        f"{meta['fitevict']}, on {meta['cpu']} ({meta['cores']} cores shared with other work; 1-minute load average "
        f"{meta['load_before'].split(' / ')[0]} before, median {_f(float(np.median(loads)) if loads else None, '.1f')}"
        f" and max {_f(max(loads, default=None), '.1f')} while it ran). "
        + (f"It ran its full {meta['minutes']:.0f} minutes" if end else
           f"**Written from a run still going (or cut short)**: {(last - t0) / 60:.1f} of its {meta['minutes']:.0f} "
           "minutes so far") + f"; the first {warm:.0f} minutes are warm-up, left out of the fits. "
        f"{meta['clients']} clients, a fault every {meta['fault_every']:.0f} s on average, "
        f"{meta['hangups'] * 100:.0f} % of streams hung up by their client; `budget.ram_limit` "
        f"{meta['ram_limit'] / MiB:.0f} MiB (1.5 times one medium model's price, so the two medium copies swap); "
        f"models {', '.join(meta['models'])}.",
        "",
        f"**Requests: {len(verdicts)} sent, {c['ok']} answered, {c['hung-up']} hung up by their client, {c['cut']} "
        f"cut by an injected fault, {c['lost']} lost.** A failed request is counted as cut only when a seat fault "
        "(SIGKILL or SIGSTOP) hit its model's seat while it was in flight (from the injection to the event that ended "
        "the seat in the door's history); any other failure is lost.",
        "",
        *request_table(verdicts),
        "",
        *fault_table(faults, verdicts),
        "",
        *notes(verdicts, faults),
        "",
        history_line(end),
        "",
        f"Growth after warm-up, sampled every {meta['sample_seconds']:.0f} s (a least-squares line over the hours; "
        "± is the slope's standard error, spread the residuals' standard deviation). Targets: front-door RSS growth "
        "≤ 5 MiB/h; descriptors and children flat (children are the seats loaded at the moment, and any zombie).",
        "",
        *growth_table(samples, t_warm),
        "",
        targets(samples, t_warm, c["lost"], b),
        "",
        descriptors_by_seats(samples, t_warm),
        "",
        f"The data directory's largest size: {_f(data_max and data_max / MiB, '.1f')} MiB; its configured bounds: "
        f"{bounds_text(b)}.",
        "",
    ]
    imgs = plots(samples, faults, t0, t_warm, img)
    lines += [f"![soak {n}](img/soak-{n}.png)" for n in imgs]
    lines += ["", f"Re-write this section from the run's file: `.venv/bin/python bench/soak.py --report FILE` "
              "(the JSONL the run appended to; `--warmup MIN` to change the warm-up)."]
    return "\n".join(lines)


def main(path: Path, warmup_min: float | None, *, doc: bool = True) -> None:
    """The section from a run's file: written into docs/reliability.md with its plots in docs/img, or (``doc``
    False) printed, its plots in a temporary folder (named), the docs untouched."""
    if doc:
        text = body(read(path), warmup_min)
        write_section("soak", text, DOC)
    else:
        img = Path(tempfile.mkdtemp(prefix="fitevict-soak-plots-"))
        text = body(read(path), warmup_min, img) + f"\n\n(plots in {img})"
    print(text)
