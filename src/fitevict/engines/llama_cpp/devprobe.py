"""Ask the engine what a device backend does with weights, under the allocator trace: its buffer names, its
alignment and padding, its host buffer type, and which weights it cannot run (``pricing/backends``).

``probe_backend`` loads three one-layer llama models (``llama_cpp/probe.write_model``) with every layer on the device
(``-dev DEV -ngl 99 -lm none``, ``-ot output_norm=CPU`` so the host buffer holds two tensors) and stops the engine
once its weights are allocated. From the traced buffers:

- the device's buffer type name (``Vulkan0``; ``RPC0[HOST:PORT]``) and its alignment: the smallest power of two
  that pads the offloaded F32 tensors (n_embd 513 and 516: row sizes that tell 4 from 8, 16, 32, ...) to the
  traced size;
- its host buffer type (``Vulkan_Host``; none where the host weights land in plain ``CPU``), that buffer's
  alignment and the bytes each allocation adds: the two models' host buffers solve for both;
- the padding of quantized rows: a Q8_0 weight of 544 columns (not a multiple of 512) takes its own size, or more.

``probe_model`` learns which weights of one model the device cannot run: it loads the model the same way; when
the host holds more than the input layer, one load per weight name (that name alone on the device, every other
weight ``-ot``-ed to the CPU) shows which names the device turns away. The answer is kept per weight kind, which
holds the model's own dimensions the loader's op test reads (``pricing/backends.op_context``): a pure mamba2 whose
state size differs from a hybrid's is asked again, not answered from the hybrid's loads. Both answers are stored per
engine build and device (``cache_dir()/probe/device-*.json``, with their source) and read back by ``learned_rules``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from gguf import GGMLQuantizationType as QT

from fitevict.engines.base import Unavailable
from fitevict.engines.llama_cpp.buftrace import buftrace_library, preload_env
from fitevict.engines.llama_cpp.machine import machine_key
from fitevict.engines.llama_cpp.probe import Case, write_model
from fitevict.engines.process import free_port
from fitevict.paths import cache_dir
from fitevict.pricing.backends import BackendRules, Kind, family, op_context, weight_kind
from fitevict.pricing.ggml_types import pad
from fitevict.pricing.gguf import GgufStructure, load_structure
from fitevict.pricing.hostbufs import NO_EXTRAS
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.placement import place

# 2: weight kinds carry their model's op context (pricing/backends.op_context); 3: a turned-away weight is found
# by the CPU buffer it lands in, each name by the device bytes it leaves
VERSION = 3
_ALLOC = re.compile(r"fitevict-buftrace: alloc (\S+) (\d+)\s*$")
_DONE = ("llama_context: constructing", "failed to load model", "llama_init_from_model")
_ALIGNMENTS = tuple(2 ** i for i in range(2, 17))
_VK_ENV = "GGML_VK_VISIBLE_DEVICES"


def _key(binary: Path, device: str, rpc: Sequence[str]) -> str:
    """What the answers are true of: the engine build on this CPU, the device (an RPC device by its endpoint) and
    which Vulkan devices the environment shows the engine."""
    where = f"{device}@{rpc[int(device[3:])]}" if family(device) == "RPC" and device[3:].isdigit() and \
        int(device[3:]) < len(rpc) else device
    return f"{machine_key(binary)}|{where}|{_VK_ENV}={os.environ.get(_VK_ENV, '')}"


def _path(key: str) -> Path:
    return cache_dir() / "probe" / f"device-{hashlib.sha256(key.encode()).hexdigest()[:20]}-v{VERSION}.json"


def learned_rules(binary: Path | None, devices: Sequence[str], rpc: Sequence[str] = ()) -> dict[str, BackendRules]:
    """The stored probe answers for ``devices`` on this engine build (a device never probed is left out)."""
    out: dict[str, BackendRules] = {}
    if binary is None:
        return out
    for d in devices:
        key = _key(binary, d, rpc)
        try:
            doc = json.loads(_path(key).read_text())
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as err:
            raise OSError(f"the stored device probe {_path(key)} cannot be read ({err}); delete it to probe again") \
                from err
        if doc.get("key") == key:
            out[d] = BackendRules.from_json(doc["rules"])
    return out


def _store(binary: Path, device: str, rpc: Sequence[str], rules: BackendRules) -> None:
    key = _key(binary, device, rpc)
    out = _path(key)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, "engine": str(binary), "device": device, "rpc": list(rpc),
                               "rules": rules.to_json()}, indent=2))
    os.replace(tmp, out)


def _load(binary: Path, model: Path, device: str, rpc: Sequence[str], lib: Path,
          extra: Sequence[str] = (), timeout_s: float = 120.0) -> list[tuple[str, int]]:
    """(buffer type, bytes) of every non-empty buffer the engine allocated before its context, in order."""
    from fitevict.engines.llama_cpp.dryrun import follow_process

    argv = [str(binary), "-m", str(model), *(["--rpc", ",".join(rpc)] if rpc else []), "-dev", device,
            "-ngl", "99", "-lm", "none", "-c", "256", "-np", "1", "-fit", "off", "--no-warmup", "-lv", "4",
            "--host", "127.0.0.1", "--port", str(free_port()), *extra]
    lines, verdict, _ = follow_process(argv, timeout_s, lambda line, _p: "" if any(m in line for m in _DONE) else None,
                                       env=preload_env(lib))
    if verdict != "" or any("failed to load model" in line for line in lines):
        tail = " | ".join(line.strip() for line in lines[-4:] if line.strip())
        raise RuntimeError(f"{binary.name} on {device} did not place {model.name}'s weights ({verdict}): {tail}")
    return [(m.group(1), int(m.group(2))) for line in lines if (m := _ALLOC.search(line)) and int(m.group(2))]


def _host_side(name: str) -> bool:
    return name.startswith("CPU") or name.endswith("_Host")


def _solve_host(seen: Sequence[tuple[int, Sequence[int]]]) -> tuple[int, int] | None:
    """(alignment, bytes added) that give each traced host buffer from its tensors' sizes: the largest alignment
    that explains them with nothing negative added, so the least added (Vulkan_Host pads to the device's map
    alignment, 64 on lavapipe, then adds 32 bytes per allocation "like the CPU buffer type"; read as 32-aligned it
    would seem to add 64)."""
    for a in sorted(_ALIGNMENTS, reverse=True):
        extras = {traced - sum(pad(n, a) for n in sizes) for traced, sizes in seen}
        if len(extras) == 1 and (e := extras.pop()) >= 0:
            return a, e
    return None


def probe_backend(binary: Path, device: str, rpc: Sequence[str] = (), *, store: bool = True) -> BackendRules | Unavailable:
    """Learn ``device``'s buffer name, alignment, padding and host buffer type from the engine (see the module doc)."""
    lib = buftrace_library()
    if isinstance(lib, Unavailable):
        return lib
    dev_sizes: list[tuple[int, list[int]]] = []
    host_seen: list[tuple[int, list[int]]] = []
    host_name: str | None = None
    dev_name = device
    try:
        with tempfile.TemporaryDirectory(prefix="fitevict-devprobe-") as tmp:
            for k in (513, 516):
                path = Path(tmp) / f"f32-{k}.gguf"
                write_model(Case(QT.F32, k, 512), path)
                s = load_structure(path)
                bufs = _load(binary, path, device, rpc, lib, ("-nr", "-ot", r"output_norm\.weight=CPU"))
                host = [(n, b) for n, b in bufs if _host_side(n)]
                dev = [(n, b) for n, b in bufs if not _host_side(n)]
                if not dev:
                    return Unavailable(f"{device} took no weight of the probe model (buffers: {bufs})")
                dev_name = dev[0][0]
                on_dev = [t.nbytes for t in s.tensors if t.name not in ("token_embd.weight", "output_norm.weight")]
                dev_sizes.append((dev[0][1], on_dev))  # the weights' buffer: the device's first allocation
                named = [(n, b) for n, b in host if n != "CPU"]
                if named:  # the device's host buffer type holds token_embd and output_norm
                    host_name = named[0][0]
                    host_seen.append((named[0][1], [s.tensor("token_embd.weight").nbytes,  # type: ignore[union-attr]
                                                    s.tensor("output_norm.weight").nbytes]))  # type: ignore[union-attr]
            align = next((a for a in _ALIGNMENTS if all(sum(pad(n, a) for n in sz) == t for t, sz in dev_sizes)), None)
            if align is None:
                return Unavailable(f"{device}'s buffers {dev_sizes} follow no alignment of 4..65536 bytes")
            host_rule = _solve_host(host_seen) if host_name else (32, 0)
            if host_rule is None:
                return Unavailable(f"{host_name}'s buffers {host_seen} follow no alignment and fixed addition")
            qpath = Path(tmp) / "q8_0-544.gguf"
            write_model(Case(QT.Q8_0, 544, 512), qpath)
            qs = load_structure(qpath)
            qdev = next(b for n, b in _load(binary, qpath, device, rpc, lib, ("-nr",)) if not _host_side(n))
            row_padding = _row_padding(qs, qdev, align)
    except (OSError, RuntimeError, ValueError) as err:
        return Unavailable(f"the device probe of {device} failed: {err}")
    rules = BackendRules(family(device), align, row_padding, host_name, host_rule[0], host_rule[1], source="probe",
                         detail=f"engine {machine_key(binary)}, device {device} ({dev_name})")
    if store:
        _store(binary, device, rpc, rules)
    return rules


def _row_padding(s: GgufStructure, traced: int, align: int) -> int:
    """The quantized row padding (elements; 0: none) under which the probe model's device buffer is ``traced``
    bytes: a padded weight allocates one row's worth more (``MATRIX_ROW_PADDING - ne0 % MATRIX_ROW_PADDING``)."""
    for p in (0, 64, 128, 256, 512, 1024):
        rules = BackendRules("probe", align, p)
        if sum(rules.alloc(t.ggml_type, t.shape, t.nbytes) for t in s.tensors if t.name != "token_embd.weight") \
                == traced:
            return p
    return 0


def buffer_names(rules: Mapping[str, BackendRules]) -> dict[str, str]:
    """Each probed device's buffer type name, as its probe saw it (RPC: ``RPC0[HOST:PORT]``)."""
    out = {}
    for d, r in rules.items():
        m = re.search(r"\(([^()]+)\)$", r.detail)
        if m:
            out[d] = m.group(1)
    return out


def probe_model(binary: Path, s: GgufStructure, device: str, rpc: Sequence[str], rules: BackendRules,
                *, store: bool = True) -> BackendRules | Unavailable:
    """``rules`` with the weight kinds of model ``s`` that ``device`` runs and rejects, learned from the engine
    (see the module doc); kinds already known are not asked again."""
    cfg = LoadConfig(n_ctx=256, n_parallel=1, devices=(device,), n_gpu_layers=-1, mmap=False, rpc=tuple(rpc),
                     repack=False)
    blank = replace(rules, rejects=(), accepts=())
    pl = place(s, cfg, NO_EXTRAS, {device: blank}, buffer_names({device: rules}))
    on_dev = [t for t in s.tensors if dict(pl.tensor_buffer).get(t.name) not in (None, "CPU", "CPU_Mapped")
              and pl.device_of_buffer(dict(pl.tensor_buffer)[t.name]) == device]
    kinds = {weight_kind(t.name, t.ggml_type.name, t.shape, op_context(s)) for t in on_dev}
    if kinds <= set(rules.accepts) | set(rules.rejects):
        return rules
    lib = buftrace_library()
    if isinstance(lib, Unavailable):
        return lib
    want_cpu = sum(b.bytes for b in pl.buffers if b.name == "CPU")
    try:
        bufs = _load(binary, Path(s.path), device, rpc, lib, ("-nr",))
        rejects: set[Kind] = set()
        if _cpu_bytes(bufs) > want_cpu:  # some weights meant for the device stayed in host memory: which names
            rejects = _isolate(binary, s, device, rpc, lib, on_dev, _device_bytes(bufs))
    except (OSError, RuntimeError) as err:
        return Unavailable(f"the weight probe of {Path(s.path).name} on {device} failed: {err}")
    out = replace(rules, rejects=tuple(sorted(set(rules.rejects) | rejects)),
                  accepts=tuple(sorted((set(rules.accepts) | kinds) - rejects)))
    if store:
        _store(binary, device, rpc, out)
    return out


def _cpu_bytes(bufs: Sequence[tuple[str, int]]) -> int:
    """The bytes of the engine's plain ``CPU`` buffers: where a weight the device turns away is put (the device's
    host buffer, ``Vulkan_Host``, holds the input layer, the weights sent to the CPU by ``-ot`` and the loader's
    upload staging)."""
    return sum(b for n, b in bufs if n == "CPU")


def _device_bytes(bufs: Sequence[tuple[str, int]]) -> int:
    return sum(b for n, b in bufs if not _host_side(n))


def _isolate(binary: Path, s: GgufStructure, device: str, rpc: Sequence[str], lib: Path,
             on_dev: Sequence[object], dev: int) -> set[Kind]:
    """The kinds whose weights the device turns away, one weight name at a time: that name sent to the CPU
    (``-ot NAME=CPU``) leaves the device's ``dev`` bytes as they were when the device had already turned it away,
    and takes its bytes off when the device had taken it."""
    by_suffix: dict[str, set[Kind]] = {}
    for t in on_dev:
        k = weight_kind(t.name, t.ggml_type.name, t.shape, op_context(s))  # type: ignore[attr-defined]
        by_suffix.setdefault(k[0], set()).add(k)
    out: set[Kind] = set()
    for suffix, ks in sorted(by_suffix.items()):
        this = rf"^(blk\.\d+\.)?{re.escape(suffix)}$"
        if _device_bytes(_load(binary, Path(s.path), device, rpc, lib, ("-nr", "-ot", f"{this}=CPU"))) == dev:
            out |= ks
    return out


__all__ = ["buffer_names", "learned_rules", "probe_backend", "probe_model"]


def rules_for(binary: Path | None, s: GgufStructure, cfg: LoadConfig,
              probe: bool = True) -> tuple[dict[str, BackendRules], list[str]]:
    """Each device of ``cfg`` with its learned rules for model ``s``: stored answers, else (``probe``) the engine
    is asked now and the answer stored; a device it cannot be asked about is left to its family's rule, and why is
    said in the notes."""
    notes: list[str] = []
    if binary is None or not cfg.devices:
        return {}, notes
    known = learned_rules(binary, cfg.devices, cfg.rpc)
    for d in cfg.devices:
        r: BackendRules | Unavailable | None = known.get(d)
        if r is None and probe:
            r = probe_backend(binary, d, cfg.rpc)
        if isinstance(r, BackendRules) and probe:
            r = probe_model(binary, s, d, cfg.rpc, r)
        if isinstance(r, Unavailable):
            notes.append(f"{d}: its backend's rules are its family's, not probed: {r.reason}")
        elif r is not None:
            known[d] = r
    return known, notes
