"""The transformers seat: a child process that loads one HF model and serves it on loopback.

``python -m fitevict.engines.transformers.seat MODEL_DIR --port N [--dtype ...] [--quant ...] [--device-map ...]
[--adapter PEFT_DIR ...]``

torch, transformers and diffusers are imported only inside that process; this package's ``__init__`` (the argv
builder and parser shared by the engine (``TransformersEngine``) and the seat) imports none of them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fitevict.pricing.hf_price import DTYPES, QUANTS, HfLoadConfig

FOOTPRINT_LINE = "FITEVICT_SEAT_FOOTPRINT "  # the seat logs its /footprint JSON after this prefix
FAILED_LINE = "FITEVICT_SEAT_FAILED "  # a failed load's reason, as JSON, after this prefix
TEARDOWN_LINE = "FITEVICT_SEAT_TEARDOWN "  # the leak breaker's report, as JSON, after this prefix
STOPPING_LINE = "FITEVICT_SEAT_STOPPING "  # why the seat began its teardown: "SIGTERM received", "/unload asked"
STARTED_LINE = "generation started: "  # a generation begins (the runner's lock held): its prompt's tokens
STOPPED_LINE = "generation stopped: "  # a generation ended early: why, after how many tokens
EXIT_NO_WEIGHTS = 3


@dataclass(frozen=True, slots=True)
class SeatArgs:
    model: Path
    port: int
    cfg: HfLoadConfig
    name: str
    test_keep: str | None = None


def seat_argv(a: SeatArgs) -> list[str]:
    """The seat's arguments (after ``python -m fitevict.engines.transformers.seat``): one builder, parsed by
    parse_seat_argv."""
    c = a.cfg
    out = [str(a.model), "--port", str(a.port), "--name", a.name, "-c", str(c.n_ctx), "--dtype", c.dtype,
           "--quant", c.quant, "--device-map", c.device_map]
    if c.bnb4_double_quant:
        out.append("--double-quant")
    for dev, b in c.max_memory:
        out += ["--max-memory", f"{dev}={b}"]
    if c.embeddings:
        out.append("--embeddings")
    for folder in c.adapters:
        out += ["--adapter", folder]
    if a.test_keep:
        out += ["--test-keep-tensor", a.test_keep]
    return out


def parse_seat_argv(argv: Sequence[str]) -> SeatArgs:
    p = argparse.ArgumentParser(prog="python -m fitevict.engines.transformers.seat")
    p.add_argument("model", type=Path)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", default="")
    p.add_argument("-c", "--ctx-size", type=int, default=4096)
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--quant", choices=QUANTS, default="none")
    p.add_argument("--double-quant", action="store_true")
    p.add_argument("--device-map", default="cpu")
    p.add_argument("--max-memory", action="append", default=[], metavar="GPU=BYTES")
    p.add_argument("--embeddings", action="store_true")
    p.add_argument("--adapter", action="append", default=[], metavar="DIR",
                   help="a PEFT adapter folder to load at start (repeatable); a request's lora ids index them")
    p.add_argument("--test-keep-tensor", default=None,
                   help="testing only: keep a reference to this tensor past teardown, a deliberate leak")
    ns = p.parse_args(list(argv))
    mm = tuple((k, int(v)) for k, _, v in (x.partition("=") for x in ns.max_memory))
    cfg = HfLoadConfig(n_ctx=ns.ctx_size, dtype=ns.dtype, quant=ns.quant, bnb4_double_quant=ns.double_quant,
                       device_map=ns.device_map, max_memory=mm, embeddings=ns.embeddings,
                       adapters=tuple(ns.adapter))
    return SeatArgs(ns.model, ns.port, cfg, ns.name or ns.model.name, ns.test_keep_tensor)
