"""One placement on real devices, priced and then loaded: the price per device and term beside the engine's traced
buffers, for the device accuracy table (``bench/device_accuracy.py``) and the suite.

``check`` prices ``cfg`` as ``fitevict price`` does (the device rules its probe learned, compute from the engine's
own dry run of that very placement), loads the same command line under the allocator trace, and compares each
term on each device: model, context (KV and recurrent state) and output to the byte, compute within 1 %.
``rpc_servers`` starts and stops the rpc-servers an RPC placement needs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fitevict.engines.base import Unavailable
from fitevict.engines.llama_cpp.dryrun import capture_load_log, dry_run
from fitevict.engines.llama_cpp.devprobe import buffer_names, rules_for
from fitevict.engines.llama_cpp.machine import host_buffers
from fitevict.engines.llama_cpp.rpcserver import RpcServer, start_rpc_server
from fitevict.engines.process import free_port
from fitevict.pricing.buftrace import parse_exact_log
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.price import price

TERMS = ("model", "context", "output", "compute")
COMPUTE_TOLERANCE = 0.01  # compute within 1 % of the engine's own reservation; the other terms to the byte


@dataclass(frozen=True, slots=True)
class TermCheck:
    device: str
    term: str
    priced: int
    traced: int | None  # None: the engine reported no such buffer
    source: str  # the priced term's source (formula, dry-run)

    @property
    def ok(self) -> bool:
        if self.traced is None:
            return self.priced == 0
        if self.term == "compute":
            return abs(self.priced - self.traced) <= COMPUTE_TOLERANCE * max(self.traced, 1)
        return self.priced == self.traced


@dataclass(frozen=True, slots=True)
class Check:
    terms: tuple[TermCheck, ...]
    exact: bool  # every traced figure is the allocator's byte count (not the log's 2-decimal MiB)
    rules: tuple[tuple[str, str, str], ...]  # (device, buffer name, rules' source) as priced
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.exact and all(t.ok for t in self.terms)

    def failures(self) -> list[str]:
        return [f"{t.device} {t.term}: priced {t.priced}, traced {t.traced} ({t.source})"
                for t in self.terms if not t.ok] + ([] if self.exact else [f"not exact: {self.notes}"])


def check(bin_dir: Path, model: Path, cfg: LoadConfig, *, timeout_s: float = 180.0) -> Check | Unavailable:
    """Price ``cfg`` and load it: every term on every device, priced against traced (see the module doc)."""
    s = load_structure(model)
    rules, notes = rules_for(bin_dir / "llama-server", s, cfg)
    dry = dry_run(bin_dir, model, cfg, timeout_s=timeout_s)
    if isinstance(dry, Unavailable):
        return dry
    p = price(s, cfg, compute=dry.compute, context=dry.context, host=host_buffers(bin_dir / "llama-server"),
              backends=rules, buffer_names=buffer_names(rules))
    cap = capture_load_log(bin_dir, model, cfg, exact=True, timeout_s=timeout_s)
    if not cap.ok:
        return Unavailable(f"the load failed: {cap.reason}")
    log = parse_exact_log(cap.text)
    got = log.to_footprint()
    out: list[TermCheck] = []
    names = sorted({d.name for d in p.footprint.devices} | {d.name for d in got.devices})
    for dev in names:
        want, seen = p.footprint.device(dev), got.device(dev)
        for term in TERMS:
            pt = getattr(want, term) if want else None
            st = getattr(seen, term) if seen else None
            traced = st.bytes if st is not None and st.bytes is not None and st.source != "unavailable" else None
            out.append(TermCheck(dev, term, pt.bytes or 0 if pt is not None else 0, traced,
                                 pt.source if pt is not None else "not priced"))
    return Check(tuple(out), log.precision_bytes == 0, p.device_rules, (*notes, *log.notes))


@contextlib.contextmanager
def rpc_servers(bin_dir: Path, n: int, *, timeout_s: float = 30.0) -> Iterator[tuple[str, ...]]:
    """``n`` rpc-servers on loopback (``rpcserver.start_rpc_server``), each serving its CPU (``-t 1``), for the time
    of the block; their endpoints. Each is stopped (process group) at the end, whatever happened."""
    binary = bin_dir / "ggml-rpc-server"
    if not binary.is_file():
        raise FileNotFoundError(f"no ggml-rpc-server in {bin_dir}: the engine was built without RPC "
                                "(fitevict engine install llama.cpp builds it)")
    servers: list[RpcServer] = []
    try:
        for _ in range(n):
            servers.append(start_rpc_server(binary, free_port(), timeout=timeout_s))
        yield tuple(s.endpoint for s in servers)
    finally:
        for server in servers:
            server.stop()
