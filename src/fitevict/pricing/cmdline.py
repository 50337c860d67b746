"""Read a llama-server command line into (model path, LoadConfig), in the pinned build's flag spelling.

Flags that do not change memory (``--port``, ``--host``, ``-t``, ...) are skipped; flags fitevict does not
know are skipped with a warning. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitevict.pricing.gguf import PricingError
from fitevict.pricing.loadconfig import CACHE_TYPES, LoadConfig

_VALUE_FLAGS_IGNORED = frozenset({
    "--port", "--host", "-t", "--threads", "-tb", "--threads-batch", "-a", "--alias", "--api-key", "-lv",
    "--verbosity", "--log-verbosity", "--log-file", "--temp", "--seed", "-s", "--chat-template", "--jinja-file",
    "--timeout", "--threads-http", "-n", "--n-predict", "--cache-ram", "--slot-save-path", "--lazy-mode", "-lzm",
    "--fit-target", "-fitt", "--fit-ctx", "-fitc", "--reasoning-budget", "--mmproj", "-mm",
})
_BOOL_FLAGS_IGNORED = frozenset({
    "--jinja", "--no-warmup", "--metrics", "--no-webui", "--cont-batching", "-cb", "--no-cont-batching", "-v",
    "--verbose", "--log-disable", "--embedding", "--embeddings",
})


@dataclass(frozen=True, slots=True)
class ServerCommand:
    model: str
    config: LoadConfig
    warnings: tuple[str, ...] = ()


def _int(flag: str, v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise PricingError(f"{flag} {v!r} is not a whole number") from None


def parse_server_argv(argv: list[str] | tuple[str, ...]) -> ServerCommand:
    """Parse ``llama-server -m X.gguf -c 4096 ...`` (the program name itself is optional)."""
    args = list(argv)
    if args and (args[0].endswith("llama-server") or args[0].endswith("llama-server.exe")):
        args = args[1:]
    model = ""
    kw: dict[str, object] = {}
    warnings: list[str] = []
    i = 0

    def value(flag: str) -> str:
        nonlocal i
        if i + 1 >= len(args):
            raise PricingError(f"{flag} needs a value")
        i += 1
        return args[i]

    while i < len(args):
        a = args[i]
        flag, eq, inline = a.partition("=")
        if eq and flag.startswith("--"):
            args[i:i + 1] = [flag, inline]
            a = flag
        if a in ("-m", "--model"):
            model = value(a)
        elif a in ("-c", "--ctx-size"):
            kw["n_ctx"] = _int(a, value(a))
        elif a in ("-np", "--parallel"):
            n = _int(a, value(a))
            kw["n_parallel"] = None if n < 0 else n
        elif a in ("-ngl", "--gpu-layers", "--n-gpu-layers"):
            v = value(a)
            kw["n_gpu_layers"] = -1 if v in ("all", "auto") else max(_int(a, v), -1)
        elif a in ("-ncmoe", "--n-cpu-moe"):
            kw["n_cpu_moe"] = _int(a, value(a))
        elif a in ("-cmoe", "--cpu-moe"):
            kw["n_cpu_moe"] = 1 << 30
        elif a in ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v"):
            t = value(a).lower()
            if t not in CACHE_TYPES:
                raise PricingError(f"{a} {t!r} is not a cache type; allowed: {', '.join(CACHE_TYPES)}")
            kw["cache_type_k" if a in ("-ctk", "--cache-type-k") else "cache_type_v"] = t
        elif a in ("-fa", "--flash-attn"):
            v = value(a)
            if v not in ("on", "off", "auto"):
                raise PricingError(f"{a} {v!r}: use on, off or auto")
            kw["flash_attn"] = v
        elif a in ("-b", "--batch-size"):
            kw["n_batch"] = _int(a, value(a))
        elif a in ("-ub", "--ubatch-size"):
            kw["n_ubatch"] = _int(a, value(a))
        elif a in ("-lm", "--load-mode"):
            v = value(a)
            if v not in ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio"):
                raise PricingError(f"{a} {v!r}: use auto, none, mmap, mlock, mmap+mlock or dio")
            kw["mmap"] = v in ("auto", "mmap", "mmap+mlock")
        elif a in ("-kvu", "--kv-unified"):
            kw["kv_unified"] = True
        elif a in ("-no-kvu", "--no-kv-unified"):
            kw["kv_unified"] = False
        elif a == "--swa-full":
            kw["swa_full"] = True
        elif a in ("-dev", "--device"):
            v = value(a)
            kw["devices"] = () if v == "none" else tuple(d for d in v.split(",") if d)
        elif a in _VALUE_FLAGS_IGNORED:
            value(a)
        elif a in _BOOL_FLAGS_IGNORED:
            pass
        elif a.startswith("-"):
            if i + 1 < len(args) and not args[i + 1].startswith("-"):
                warnings.append(f"{a} {args[i + 1]}: not a memory flag fitevict knows; ignored")
                i += 1
            else:
                warnings.append(f"{a}: not a memory flag fitevict knows; ignored")
        elif not model:
            model = a
        else:
            warnings.append(f"{a}: unexpected argument; ignored")
        i += 1
    if not model:
        raise PricingError("the command line has no -m MODEL.gguf")
    if "devices" not in kw and kw.get("n_gpu_layers", 0) != 0:
        warnings.append("no -dev: priced for the CPU only; pass -dev CUDA0 (...) to price GPU placement")
    return ServerCommand(model, LoadConfig(**kw), tuple(warnings))  # type: ignore[arg-type]
