"""An RPC device's rpc-server measured through a filled context, beside the device's price.

``fill_rpc_seat`` starts a ``ggml-rpc-server`` on loopback (``rpcserver.start_rpc_server``, ``-t 1``), reads its PSS
idle (``host.devmem.RpcServerReader``, the reader the supervisor measures an RPC device with), starts a seat whose
devices are that server's (as a seat starts: ``LlamaServerEngine.launch_spec``, with the allocator trace
preloaded), fills every slot's context (``fill.fill``: a prompt of ``n_ctx_seq - 32`` tokens, 32 generated) twice and
reads the server's growth over its idle baseline after each, then stops the seat and reads what the server kept. A
server only grows while a seat is on it (its buffers live until the seat frees them, and freed heap pages stay
resident), so the reading after the last fill is the peak. The second fill is the one a server that has served a
while shows: the server receives each input whole into a heap vector, and glibc serves a request from the heap (whose
pages stay) only once it is no larger than its mmap threshold, which grows to the largest chunk freed, so the first
fill's largest mask, larger than any message before it, is mapped and unmapped, and the next fill's stays on the
heap. Beside it: the buffers the allocator trace saw on the device, to the byte.

``predict_rpc`` prices the same seat's RPC device as ``fitevict price`` does, with the rpc-server's own parts
(``pricing/rpcserver``), for ``bench/rpc_filled.py`` and its test to put beside the growth.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from fitevict.engines.base import Unavailable
from fitevict.engines.llama_cpp.buftrace import buftrace_library, preload_env
from fitevict.engines.llama_cpp.fill import fill, healthy
from fitevict.engines.llama_cpp.rpcserver import BINARY, start_rpc_server
from fitevict.engines.llama_cpp.server import LlamaServerEngine
from fitevict.engines.process import free_port, stop_group
from fitevict.host.devmem import RpcServerReader
from fitevict.pricing.buftrace import parse_exact_log
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.kv import resolve_context
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.process import ProcessTerm

@dataclass(frozen=True, slots=True)
class RpcFilled:
    """One seat on one rpc-server, measured through a filled context."""

    endpoint: str
    idle: int  # measured: the server's committed PSS before the seat
    loaded: int  # measured: its growth over idle once the seat answered /health
    first: int  # measured: its growth over idle once every slot's context was filled the first time
    filled: int  # measured: the same after a second fill (the peak: see the module doc)
    kept: int  # measured: its growth over idle after the seat stopped (freed heap pages it keeps)
    traced: dict[str, int]  # the allocator trace's bytes on the device, per term (model, context, compute, output)
    tokens: tuple[tuple[int, int], ...]  # per slot: (prompt tokens evaluated, tokens predicted)
    source: str  # how the growth was read

    @property
    def traced_total(self) -> int:
        return sum(self.traced.values())


def _traced(text: str, device: str) -> dict[str, int]:
    d = parse_exact_log(text).to_footprint().device(device)
    if d is None:
        return {}
    return {t: getattr(d, t).bytes or 0 for t in ("model", "context", "compute", "output") if getattr(d, t)}


def fill_rpc_seat(bin_dir: Path, model: Path, cfg: LoadConfig, log_dir: Path, *,
                  timeout_s: float = 900.0) -> RpcFilled:
    """Seat ``model`` under ``cfg`` (its devices ``RPC0``; ``cfg.rpc`` is replaced by the server started here) on a
    fresh rpc-server and measure that server through a filled context (see the module doc)."""
    lib = buftrace_library()
    if isinstance(lib, Unavailable):
        raise RuntimeError(lib.reason)
    server = start_rpc_server(bin_dir / BINARY, free_port(), log_dir / "rpc-server.log")
    try:
        reader = RpcServerReader.of("RPC0", server.endpoint, 0, server.pid)
        idle = reader.baseline
        if idle is None:
            raise RuntimeError(f"the rpc-server's PSS could not be read: {reader.reason}")
        seat_cfg = cfg.with_(rpc=(server.endpoint,))
        rc = resolve_context(load_structure(model), seat_cfg)
        spec = LlamaServerEngine(bin_dir / "llama-server").launch_spec(model, seat_cfg, free_port())
        log_path = log_dir / "seat.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(list(spec.argv), env=preload_env(lib, dict(spec.env)), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            why = healthy(proc, f"http://127.0.0.1:{spec.port}", timeout_s)
            if why:
                raise RuntimeError(f"{model.name} on {server.endpoint}: {why}; its log: {log_path}")
            loaded = reader.held_by(frozenset({proc.pid}))
            tokens = fill(f"http://127.0.0.1:{spec.port}", rc.n_parallel, rc.n_ctx_seq, timeout_s=timeout_s)
            first = reader.held_by(frozenset({proc.pid}))
            tokens = fill(f"http://127.0.0.1:{spec.port}", rc.n_parallel, rc.n_ctx_seq, timeout_s=timeout_s)
            filled = reader.held_by(frozenset({proc.pid}))
        finally:
            served = log_path.stat().st_size  # what follows is the stop freeing every buffer
            stop_group(proc)
        kept = reader.held_by(frozenset())
    finally:
        server.stop()
    if filled.bytes is None or loaded.bytes is None or first.bytes is None:
        raise RuntimeError(f"the rpc-server's growth could not be read: {filled.source}")
    return RpcFilled(server.endpoint, idle, loaded.bytes, first.bytes, filled.bytes, kept.bytes or 0,
                     _traced(log_path.read_text(errors="replace")[:served], "RPC0"), tokens, filled.source)


@dataclass(frozen=True, slots=True)
class RpcPrice:
    """An RPC device's price as ``fitevict price`` makes it, with its rpc-server's parts."""

    buffers: dict[str, int]  # the priced engine buffers on the device, per term
    terms: tuple[ProcessTerm, ...]  # the rpc-server's parts (pricing/rpcserver)
    total: int  # what the device is priced at: buffers and the server's parts

    @property
    def buffers_total(self) -> int:
        return sum(self.buffers.values())


def predict_rpc(bin_dir: Path, model: Path, cfg: LoadConfig) -> RpcPrice:
    """``model`` under ``cfg`` (devices ``RPC0``) priced on an rpc-server of this build started for the purpose:
    the device rules its probe learned, compute from the engine's own dry run of the placement, the server's parts
    by rule. The price does not depend on which endpoint serves the device."""
    from fitevict.engines.llama_cpp.devcheck import rpc_servers
    from fitevict.engines.llama_cpp.devprobe import buffer_names, rules_for
    from fitevict.engines.llama_cpp.dryrun import dry_run
    from fitevict.engines.llama_cpp.machine import host_buffers
    from fitevict.pricing.placement import place
    from fitevict.pricing.price import price
    from fitevict.pricing.rpcserver import rpc_server_parts, with_rpc_servers

    s = load_structure(model)
    with rpc_servers(bin_dir, 1) as eps:
        priced_cfg = cfg.with_(rpc=eps)
        rules, notes = rules_for(bin_dir / "llama-server", s, priced_cfg)
        dry = dry_run(bin_dir, model, priced_cfg)
    if isinstance(dry, Unavailable):
        raise RuntimeError(f"no dry run of {model.name} on RPC0: {dry.reason}")
    host = host_buffers(bin_dir / "llama-server")
    p = price(s, priced_cfg, compute=dry.compute, context=dry.context, host=host, backends=rules,
              buffer_names=buffer_names(rules))
    parts = rpc_server_parts(s, priced_cfg, place(s, priced_cfg, host, rules, buffer_names(rules)))
    fp = with_rpc_servers(p.footprint, parts)
    dev = fp.device("RPC0")
    if dev is None:
        raise RuntimeError(f"{model.name} under {cfg.to_json()} puts nothing on RPC0 ({notes})")
    buffers = {t: getattr(dev, t).bytes or 0 for t in ("model", "context", "compute", "output") if getattr(dev, t)}
    return RpcPrice(buffers, parts["RPC0"], fp.bytes_on("RPC0"))
