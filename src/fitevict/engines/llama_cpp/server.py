"""The llama-server engine: a LoadConfig becomes an argv, and the load log becomes a measured Footprint.

fitevict is the fit authority, so every seat starts with ``--fit off``; the placement comes from
the planner. The server's host prompt cache (``--cache-ram``, 8192 MiB by default in the pinned
build) would grow host memory past what was priced, so seats start with ``-cram 0`` unless the
model's extra args set it.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

from fitevict.pricing.flags import switch_args, value_args
from fitevict.engines.base import EngineBase, LaunchSpec, Traits
from fitevict.engines.llama_cpp.install import SERVER as BINARY
from fitevict.engines.llama_cpp.slotfile import read_tokens
from fitevict.pricing.footprint import Footprint
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.lora import is_lora_gguf

_STAMP = r"^\s*(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) \S "
_LORA_START = re.compile(_STAMP + r"llama_adapter_lora_init: loading lora adapter")
_LORA_DONE = re.compile(_STAMP + r"llama_adapter_lora_init_impl: loaded \d+ tensors from lora file")


def _stamp_seconds(m: re.Match[str]) -> float:
    """A log line's timestamp (minutes.seconds.milliseconds.microseconds) in seconds."""
    return int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6


_FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


@lru_cache(maxsize=8)
def _probe_flags(binary: str, mtime_ns: int) -> frozenset[str]:
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    return frozenset(m.group(1) for m in _FLAG.finditer(text))


def supported_flags(binary: Path) -> frozenset[str]:
    """The flags ``binary --help`` lists, probed once per binary file; none when there is no binary (its seat's
    start is refused naming it: ``seat.processes.Processes.check_build``)."""
    try:
        mtime_ns = binary.stat().st_mtime_ns
    except FileNotFoundError:
        return frozenset()
    return _probe_flags(str(binary), mtime_ns)


def split_args(cfg: LoadConfig) -> list[str]:
    """``-ts W0,W1,...`` when the configuration fixes each GPU's share of the layers (see placement.layer_devices);
    nothing for one device or llama.cpp's default."""
    if not cfg.tensor_split or len(cfg.devices) < 2:
        return []
    return ["-ts", ",".join(str(int(w)) if float(w).is_integer() else repr(float(w)) for w in cfg.tensor_split)]


def override_args(cfg: LoadConfig) -> list[str]:
    """``-ot PATTERN=BUFT`` per override, in order (after ``--n-cpu-moe``, whose rules llama.cpp then checks first)."""
    return [x for pattern, buft in cfg.tensor_overrides for x in ("-ot", f"{pattern}={buft}")]


def load_args(model: str | Path, cfg: LoadConfig, extra_args: Sequence[str] = (),
              mmproj: str | Path | None = None) -> list[str]:
    """The llama-server arguments that decide what a load costs, in the pinned build's spelling (no binary, no
    port). The ONE builder: a seat's argv and the engine's dry run both start from it, so a dry run prices the
    very command line the seat runs. ``extra_args`` are flags LoadConfig does not carry (``--pooling mean``);
    ``mmproj`` is the model's projector (kept in RAM, ``--no-mmproj-offload``, when the seat uses no GPU).

    ``-np`` is given only when ``n_parallel`` is set (absent: the engine's 4 unified slots), ``-kvu``/``-no-kvu``
    only when both it and ``-np`` are."""
    a = ["-m", str(model), "-c", str(cfg.n_ctx)]
    if cfg.n_parallel is not None:
        a += ["-np", str(cfg.n_parallel)]
        if cfg.kv_unified is not None:
            a += ["-kvu"] if cfg.kv_unified else ["-no-kvu"]
    a += value_args(cfg)  # -ctk -ctv -fa -b -ub, from the one flag table
    if cfg.rpc:  # before -dev: the engine registers RPC devices as it reads --rpc, and -dev names them
        a += ["--rpc", ",".join(cfg.rpc)]
    a += ["-dev", ",".join(cfg.devices) if cfg.devices else "none"]
    if cfg.devices:
        a += ["-ngl", str(cfg.n_gpu_layers)]
        if not cfg.kv_offload:
            a.append("-nkvo")
    if cfg.n_cpu_moe:
        a += ["--n-cpu-moe", str(cfg.n_cpu_moe)]
    a += override_args(cfg)
    a += split_args(cfg)
    if cfg.embeddings:
        a += ["--embeddings", *pooling_args(model, extra_args)]
    if not cfg.mmap:
        a += ["-lm", "none"]
    a += switch_args(cfg)  # --swa-full, -nr
    a += lora_args(cfg)
    if mmproj is not None:  # the catalog's projector: priced by pricing.projector
        a += ["--mmproj", str(mmproj)]
        if not cfg.devices:
            a.append("--no-mmproj-offload")  # a RAM-only seat keeps its projector in RAM too
    return [*a, *extra_args]


POOLING_NONE = 0  # llama_pooling_type: LLAMA_POOLING_TYPE_NONE
POOLING_RANK = 4  # llama_pooling_type: LLAMA_POOLING_TYPE_RANK (a reranker's classifier head)
DEFAULT_POOLING = "mean"  # an embeddings seat of a model that declares no pooling (a generative model)


def pooling_args(model: str | Path, extra_args: Sequence[str] = ()) -> list[str]:
    """``--pooling mean`` for an embeddings seat of a model whose file declares no pooling (or 'none'): the
    pinned build's OpenAI embeddings route refuses pooling 'none' ("not OAI compatible"). Nothing when the
    file declares one (a BERT-style embedder keeps its CLS or mean) or the model's extra args choose one. A
    reranker's rank pooling is named on the command line: the pinned build serves ``/rerank`` only when
    ``--pooling rank`` (or ``--reranking``) was given, whatever the file declares."""
    if "--pooling" in extra_args:
        return []
    from fitevict.pricing.gguf import PricingError, load_structure

    try:
        declared = load_structure(model).pooling_type
    except PricingError:
        return []  # an unreadable file: the engine itself refuses it, with its own words
    if declared == POOLING_RANK:
        return ["--pooling", "rank"]
    return ["--pooling", DEFAULT_POOLING] if declared in (None, POOLING_NONE) else []


def lora_args(cfg: LoadConfig) -> list[str]:
    """One ``--lora A,B,...`` (the pinned build warns on a repeated flag) loaded at scale 0
    (``--lora-init-without-apply``): a request applies them through its ``lora`` field (id = the position here)."""
    if not cfg.loras:
        return []
    if bad := [f for f in cfg.loras if "," in f]:
        raise ValueError(f"LoRA adapter path {bad[0]!r} contains a comma, which llama-server's --lora list cannot "
                         "carry; rename the file or its folder")
    return ["--lora", ",".join(cfg.loras), "--lora-init-without-apply"]


SHUTDOWN_MARK = "cleaning up before exit"  # llama-server's log once its SIGTERM/SIGINT handler ended its task loop


BIND_FAILED = "couldn't bind HTTP server socket"  # llama-server's words when its port was taken


class LlamaServerEngine(EngineBase):
    name = "llama-server"
    pricer = "fitevict.engines.llama_cpp.pricer:PRICER"
    traits = Traits(file_kinds=("gguf",), dry_run=True, repacks=True, keeps_prompts=True, memory_flags_priced=True,
                    engine_args=True, overhead="calibrated", adapters="scale-0", adapter_kinds=("lora",),
                    process_marks=(BINARY,))

    def __init__(self, binary: Path) -> None:
        self.binary = Path(binary)
        self.flags = supported_flags(self.binary)

    @classmethod
    def reranks(cls, extra_args: Sequence[str], pooling: Callable[[], int | None]) -> bool:
        """A reranker: its arguments ask for rank pooling (``--reranking``, ``--pooling rank``) or its GGUF
        declares it (``pooling_args`` then names it on the command line)."""
        args = list(extra_args)
        if "--reranking" in args or "--rerank" in args or any(
                a == "--pooling" and b == "rank" for a, b in zip(args, args[1:])):
            return True
        return pooling() == POOLING_RANK

    @classmethod
    def for_binary(cls, binary: Path) -> "LlamaServerEngine":
        return cls(binary)

    @classmethod
    def model_of(cls, argv: Sequence[str]) -> Path | None:
        """The file after ``-m``."""
        args = list(argv)
        return Path(args[args.index("-m") + 1]) if "-m" in args[:-1] else None

    @classmethod
    def bind_failed(cls, log_text: str) -> bool:
        return BIND_FAILED in log_text

    @classmethod
    def saved_prompt(cls, path: Path) -> list[int]:
        """The tokens in a saved slot's header (``slotfile.read_tokens``)."""
        return read_tokens(path)

    @classmethod
    def adapter_kind(cls, path: Path) -> str | None:
        """A GGUF LoRA adapter (general.type = adapter, adapter.type = lora)."""
        return "lora" if Path(path).is_file() and is_lora_gguf(path) else None

    @classmethod
    def adapter_seconds(cls, log_text: str) -> float | None:
        """Seconds the engine spent loading LoRA adapters at start (its log's timestamps, from the first
        "loading lora adapter" to the last "loaded N tensors from lora file"); None when the log has no adapter."""
        start = done = None
        for line in log_text.splitlines():
            if start is None and (m := _LORA_START.match(line)):
                start = _stamp_seconds(m)
            elif m := _LORA_DONE.match(line):
                done = _stamp_seconds(m)
        return done - start if start is not None and done is not None and done >= start else None

    @classmethod
    def shutting_down(cls, log_text: str) -> str | None:
        """The last line in which llama-server said it was shutting down: its signal handler (SIGTERM or SIGINT)
        ends its task loop and it logs "cleaning up before exit..."; with a stream in flight it may then hang. Its
        handler may also hang before it logs a word (it takes the task queue's lock, which the thread it interrupted
        may hold): the stuck-seat watch then finds it inside that handler (``seat.frozen``)."""
        said = [line.strip() for line in log_text.splitlines() if SHUTDOWN_MARK in line]
        return said[-1] if said else None

    def _has(self, flag: str) -> bool:
        return flag in self.flags

    def launch_spec(self, model_path: Path, config: LoadConfig, port: int, *,
                    extra_args: Sequence[str] = (), embeddings: bool = False,
                    mmproj: Path | None = None, slot_save_path: Path | None = None) -> LaunchSpec:
        c = config
        notes: list[str] = []
        if embeddings and not c.embeddings:
            notes.append("--embeddings from the model's settings, but the LoadConfig was priced without it; "
                         "its output buffer is larger than priced")
            c = c.with_(embeddings=True)
        argv: list[str] = [str(self.binary), *load_args(model_path, c, mmproj=mmproj), "--host", "127.0.0.1",
                           "--port", str(port)]
        if self._has("--fit"):
            argv += ["--fit", "off"]  # fitevict is the fit authority: the placement is the planner's
        env = dict(os.environ)
        # CUDA's ordinals in PCI order, as NVML's: the budget's CUDA0 (NVML) is then the seat's CUDA0
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        if not c.devices:
            env["CUDA_VISIBLE_DEVICES"] = ""  # RAM-only: no CUDA device may be touched
        if self._has("--cache-ram") and not ({"-cram", "--cache-ram"} & set(extra_args)):
            argv += ["-cram", "0"]
            notes.append("host prompt cache disabled (-cram 0) so host memory stays as priced")
        if slot_save_path is not None and self._has("--slot-save-path"):
            argv += ["--slot-save-path", str(slot_save_path)]  # the prompt cache kept across swaps (kvkeep)
        if self._has("--no-webui"):
            argv.append("--no-webui")
        if self._has("--log-verbosity"):
            # buffer sizes, KV cells and print_info lines are logged at level 4 only in the pinned build
            argv += ["-lv", "4"]
        argv += list(extra_args)
        return LaunchSpec(tuple(argv), env, port, "/health", tuple(notes))

    def measured_footprint(self, log_text: str) -> Footprint | None:
        from fitevict.pricing.logparse import parse_load_log

        return parse_load_log(log_text).to_footprint()
