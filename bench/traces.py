"""The models and the traces the trace replay runs.

Models: the demo zoo (``fitevict.zoo.write_zoo``, what ``fitevict demo-models DIR`` writes), each asked for
as the door asks (``request.ask.ask`` for a request's load contract), priced by
``fitevict.pricing.price.price(load_structure(path), cfg)`` (what ``PriceBook.footprint`` does when no load
was measured yet and no dry run was made), with load and release seconds as measured per model by
``bench/seat_lifecycle.py`` (its table in docs/benchmarks.md).

Traces (each from its own seeded ``random.Random``):
- ``zipf``: open-loop Poisson arrivals; each names a model drawn from a Zipf law over the zoo in a seeded
  popularity order;
- ``adversarial``: closed-loop clients, each asking for the models of a list round-robin (client ``i``
  begins at model ``i mod len``), its next request sent when the previous is answered;
- ``bursty``: bursts of requests for one model at a time, the bursts' starts Poisson, overlapping.

``mixed_specs``: a declared set of models of mixed sizes (0.4 to 15 GiB, the sizes of common quantized models)
whose reload times differ beyond their size: two engines, each with its own declared start time and read rate.
Nothing in it is measured; the zipf trace runs over it as over the zoo.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.pricing.loadconfig import LoadConfig
from fitevict import planner as pl
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.price import price
from fitevict.request.ask import ask
from fitevict.request.catalog import Catalog
from fitevict.request.contract import Contract
from fitevict.prices.book import PriceBook

from tracesim import ModelSpec, Req, Trace
from fitevict.engines.llama_cpp.machine import host_buffers

HERE = host_buffers()  # this machine's extra host buffers (its probe, else the rule table): as its engine places

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"


class MissingMeasurement(LookupError):
    pass


def measured_seconds(doc: Path = DOC) -> tuple[dict[str, tuple[float, float]], str]:
    """{model: (load seconds, release seconds)} from the seat-lifecycle table of ``doc``, and the line that
    says when and where they were measured. Release seconds = the seat's exit plus its release time."""
    text = doc.read_text()
    m = re.search(r"<!-- seat_lifecycle:start -->(.*?)<!-- seat_lifecycle:end -->", text, re.S)
    if m is None:
        raise MissingMeasurement(f"{doc} has no seat_lifecycle section; run bench/seat_lifecycle.py first")
    section = m.group(1)
    header = next((ln for ln in section.splitlines() if ln.startswith("| model |")), None)
    if header is None:
        raise MissingMeasurement(f"{doc}: the seat_lifecycle section has no table; run bench/seat_lifecycle.py")
    cols = [c.strip() for c in header.strip("|").split("|")]
    i_load, i_exit, i_rel = cols.index("load s"), cols.index("exit ms"), cols.index("release ms")
    out: dict[str, tuple[float, float]] = {}
    for ln in section.splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")]
        if not ln.startswith("| ") or cells[0] in ("model",) or set(cells[0]) <= {"-"} or len(cells) != len(cols):
            continue
        out[cells[0]] = (float(cells[i_load]), (float(cells[i_exit]) + float(cells[i_rel])) / 1000)
    when = next((ln.strip() for ln in section.splitlines() if ln.startswith("Measured")), "measured")
    return out, f"measured by bench/seat_lifecycle.py ({when.split(':')[0]})"


def zoo_specs(zoo_dir: Path, contract: Contract, *, only: Sequence[str] | None = None,
              default_alloc_mode: str = "max-gpu", doc: Path = DOC) -> dict[str, ModelSpec]:
    """The zoo's models in ``zoo_dir`` as the simulator needs them (see the module docstring)."""
    times, time_source = measured_seconds(doc)
    book = PriceBook(None, zoo_dir, default_alloc_mode)  # type: ignore[arg-type]  # requests only: no store read
    out: dict[str, ModelSpec] = {}
    for entry in Catalog.scan([zoo_dir]).entries():
        if only is not None and entry.key not in only:
            continue
        if entry.key not in times:
            raise MissingMeasurement(f"{entry.key}: no load time in the seat_lifecycle table of {doc}; "
                                     f"rerun bench/seat_lifecycle.py over this zoo")
        req = ask(entry, contract, book).request
        path = Path(req.path)
        cfg = req.config.with_(n_gpu_layers=0, n_cpu_moe=0, devices=())  # the rung a host-only budget offers
        fp = price(load_structure(path), cfg, host=HERE).footprint
        load_s, release_s = times[entry.key]
        out[entry.key] = ModelSpec(
            key=entry.key, request=req, config=cfg, footprint=fp, bytes={HOST: fp.bytes_on(HOST)},
            bytes_source=fp.host_source, load_seconds=load_s, release_seconds=release_s, time_source=time_source)
    return out


GiB = 2**30
MIXED_ENGINES = {  # engine: (start seconds, read GiB/s), declared
    "gguf": (0.5, 2.0),  # a llama-server seat reading a GGUF from the page cache
    "hf": (6.0, 0.5),  # a transformers seat: imports, then reading and converting safetensors
}
MIXED_MODELS = (  # (key, GiB, engine), declared
    ("qwen-0.5b-q8", 0.5, "gguf"), ("llama-1b-q8", 1.3, "gguf"), ("llama-3b-q4", 2.0, "gguf"),
    ("qwen-7b-q4", 4.4, "gguf"), ("llama-8b-q4", 4.9, "gguf"), ("llama-8b-q8", 8.5, "gguf"),
    ("qwen-14b-q6", 12.1, "gguf"), ("mistral-24b-q4", 14.3, "gguf"), ("embed-small-hf", 0.4, "hf"),
    ("phi-mini-hf", 7.6, "hf"), ("whisper-hf", 3.1, "hf"), ("rerank-hf", 1.1, "hf"),
)


def mixed_specs() -> dict[str, ModelSpec]:
    """``MIXED_MODELS`` as the simulator needs them: host bytes declared, load seconds = the engine's start plus
    the bytes at its read rate, release 0.2 s. Every figure is declared (see the module docstring)."""
    out: dict[str, ModelSpec] = {}
    for key, gib, engine in MIXED_MODELS:
        n = int(gib * GiB)
        start, rate = MIXED_ENGINES[engine]
        cfg = LoadConfig(n_ctx=4096, n_parallel=1)
        fp = Footprint((DeviceFootprint(HOST, Term(n, "declared"), Term(0, "declared")),), host_mapped_bytes=n)
        out[key] = ModelSpec(
            key=key, request=pl.PlanRequest(key, cfg, "max-gpu"), config=cfg, footprint=fp, bytes={HOST: n},
            bytes_source="declared", load_seconds=round(start + gib / rate, 2), release_seconds=0.2,
            time_source="declared (start + bytes / read rate per engine)")
    return out


def zipf_trace(keys: Sequence[str], *, n: int, rate: float, service: float, s: float, seed: int) -> Trace:
    rng = random.Random(seed)
    order = list(keys)
    rng.shuffle(order)
    weights = [1 / (i + 1) ** s for i in range(len(order))]
    t, out = 0.0, []
    for key in rng.choices(order, weights, k=n):
        t += rng.expovariate(rate)
        out.append(Req(t, key, service))
    return Trace("zipf", arrivals=tuple(out), about=(
        f"{n} requests, Poisson arrivals {rate:g}/s, Zipf s={s:g} over {len(order)} models in the popularity order "
        f"{', '.join(order)}; service {service:g} s each; seed {seed}"))


def adversarial_trace(keys: Sequence[str], *, clients: int, per_client: int, service: float,
                      think: float = 0.0) -> Trace:
    seqs = tuple(tuple(keys[(i + j) % len(keys)] for j in range(per_client)) for i in range(clients))
    return Trace("adversarial", clients=seqs, service=service, think=think, about=(
        f"{clients} closed-loop clients x {per_client} requests, each round-robin over {', '.join(keys)} "
        f"(client i begins at model i mod {len(keys)}); service {service:g} s, think {think:g} s"))


def bursty_trace(keys: Sequence[str], *, bursts: int, size: tuple[int, int], gap: float, spacing: float,
                 service: float, seed: int) -> Trace:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(bursts):
        t += rng.expovariate(1 / gap)
        key, u = rng.choice(list(keys)), t
        for _ in range(rng.randint(*size)):
            u += rng.expovariate(1 / spacing)
            out.append(Req(u, key, service))
    out.sort(key=lambda r: r.t)
    return Trace("bursty", arrivals=tuple(out), about=(
        f"{bursts} bursts over {len(keys)} models ({', '.join(keys)}), burst starts Poisson (mean gap {gap:g} s), "
        f"{size[0]}-{size[1]} requests each, {spacing:g} s apart on average; service {service:g} s; seed {seed}"))


def total_bytes(models: Mapping[str, ModelSpec], keys: Sequence[str] | None = None) -> int:
    return sum(sum(m.bytes.values()) for k, m in models.items() if keys is None or k in keys)
