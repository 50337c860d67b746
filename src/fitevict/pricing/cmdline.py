"""Read a llama-server command line into (model path, LoadConfig), in the pinned build's flag spelling.

Tensor overrides keep their command-line order: ``-ot`` (comma lists split as common/arg.cpp does), ``-cmoe``,
``--n-cpu-ffn``, and ``--n-cpu-moe`` (a count when it comes first, spelled out per layer after another rule).
``--pooling`` changes only the graph: it is handed to the dry run (``dry_run_args``).

Flags that do not change memory (``--port``, ``--host``, ``-t``, ...) are skipped; flags fitevict does not
know are skipped with a warning. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fitevict.pricing.flags import SWITCHES, Switch, ValueFlag
from fitevict.pricing.flags import flag as flag_spec
from fitevict.pricing.gguf import PricingError
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.placement import CPU_BUFT, FFN_DENSE_REGEX, FFN_EXPS_REGEX

_VALUE_FLAGS_IGNORED = frozenset({
    "--port", "--host", "-t", "--threads", "-tb", "--threads-batch", "-a", "--alias", "--api-key", "-lv",
    "--verbosity", "--log-verbosity", "--log-file", "--temp", "--seed", "-s", "--chat-template", "--jinja-file",
    "--timeout", "--threads-http", "-n", "--n-predict", "--cache-ram", "--slot-save-path", "--lazy-mode", "-lzm",
    "--fit-target", "-fitt", "--fit-ctx", "-fitc", "--reasoning-budget", "--mmproj", "-mm",
})
_BOOL_FLAGS_IGNORED = frozenset({
    "--jinja", "--no-warmup", "--metrics", "--no-webui", "--cont-batching", "-cb", "--no-cont-batching", "-v",
    "--verbose", "--log-disable", "--lora-init-without-apply",
})
# flags LoadConfig does not carry that change only the compute graph: passed on to the dry run as they are
_GRAPH_VALUE_FLAGS = frozenset({"--pooling"})
POOLING_TYPES = ("none", "mean", "cls", "last", "rank")
MAX_EXPANDED_LAYERS = 4096  # --n-cpu-moe / --n-cpu-ffn after an -ot are spelled out one rule per layer


@dataclass(frozen=True, slots=True)
class ServerCommand:
    model: str
    config: LoadConfig
    warnings: tuple[str, ...] = ()
    dry_run_args: tuple[str, ...] = ()  # graph-only flags (``--pooling mean``) the dry run must see too


def parse_overrides(value: str) -> list[tuple[str, str]]:
    """One ``-ot`` value: ``PATTERN=BUFT[,PATTERN=BUFT...]``, split as common/arg.cpp does (at ',' then the first
    '='). Which buffer types exist is checked when the configuration is priced (it depends on ``-dev``)."""
    out: list[tuple[str, str]] = []
    for item in value.split(","):
        pattern, eq, buft = item.partition("=")
        if not eq:
            raise PricingError(f"-ot {value!r}: {item!r} has no '='; write PATTERN=BUFFER_TYPE, e.g. exps=CPU")
        out.append((pattern, buft))
    return out


def _per_layer_rules(flag: str, n: int, regex: str) -> list[tuple[str, str]]:
    """common.h llm_add_n_cpu_ffn_overrides: one CPU rule ``blk\\.i<regex>`` per layer i < n."""
    if n > MAX_EXPANDED_LAYERS:
        raise PricingError(f"{flag} {n}: after an -ot rule it is spelled out per layer, and {n} layers exceed "
                           f"{MAX_EXPANDED_LAYERS}; give the number of layers the model has, or put {flag} first")
    return [(f"blk\\.{i}{regex}", CPU_BUFT) for i in range(n)]


def _int(flag: str, v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise PricingError(f"{flag} {v!r} is not a whole number") from None


def _split(flag: str, v: str) -> tuple[float, ...]:
    """``-ts 3,1`` (or ``3/1``): each device's share of the offloaded layers."""
    try:
        shares = tuple(float(x) for x in v.replace("/", ",").split(",") if x)
    except ValueError:
        raise PricingError(f"{flag} {v!r}: give one number per device, e.g. {flag} 3,1") from None
    if not shares or any(x < 0 for x in shares):
        raise PricingError(f"{flag} {v!r}: give one share >= 0 per device, e.g. {flag} 3,1")
    return shares


def _endpoints(flag: str, v: str) -> tuple[str, ...]:
    """``--rpc 127.0.0.1:50052,host:50053``: each rpc-server endpoint, in order (a port is required)."""
    out = tuple(e.strip() for e in v.split(",") if e.strip())
    bad = [e for e in out if not re.fullmatch(r"\[?[^\s,\[\]]+\]?:\d{1,5}", e)]
    if not out or bad:
        raise PricingError(f"{flag} {v!r}: give HOST:PORT[,HOST:PORT...], e.g. {flag} 127.0.0.1:50052")
    return out


NO_REPACK_FLAGS = next(s.names for s in SWITCHES if s.field == "repack")


def absorb_memory_flags(cfg: "LoadConfig", args: tuple[str, ...] | list[str]) -> tuple["LoadConfig", tuple[str, ...]]:
    """Flags among a model's or the engine's extra arguments that LoadConfig carries (``-nr``): they move into
    ``cfg``, so they are priced and spelt once by the argv builder; every other flag passes through as given."""
    rest: list[str] = []
    for a in args:
        if a in NO_REPACK_FLAGS:
            cfg = cfg.with_(repack=False)
        else:
            rest.append(a)
    return cfg, tuple(rest)


_RULE_FLAGS = frozenset({"-ncmoe", "--n-cpu-moe", "-cmoe", "--cpu-moe", "-ncffn", "--n-cpu-ffn", "-ot",
                         "--override-tensor"})


def _rules_of(a: str, v: str) -> list[tuple[str, str] | tuple[str, int]]:
    """The tensor-override rules one flag adds, in order; ``("ncmoe", N)`` marks where a --n-cpu-moe put its own."""
    if a in ("-cmoe", "--cpu-moe"):
        return [(FFN_EXPS_REGEX, CPU_BUFT)]
    if a in ("-ot", "--override-tensor"):
        return list(parse_overrides(v))
    n = _int(a, v)
    if n < 0:
        raise PricingError(f"{a} {n}: use 0 or more layers")
    return [("ncmoe", n)] if a in ("-ncmoe", "--n-cpu-moe") else list(_per_layer_rules(a, n, FFN_DENSE_REGEX))


def _placement_rules(rules: list[tuple[str, str] | tuple[str, int]]) -> dict[str, object]:
    """LoadConfig's n_cpu_moe and tensor_overrides from the rules in command-line order: a leading --n-cpu-moe stays
    a count (its rules come first anyway); one after other rules is spelled out per layer."""
    kw: dict[str, object] = {}
    lead = 0
    while lead < len(rules) and rules[lead][0] == "ncmoe":
        lead += 1
    if lead:
        kw["n_cpu_moe"] = max(int(r[1]) for r in rules[:lead])
    overrides: list[tuple[str, str]] = []
    for r in rules[lead:]:
        if r[0] == "ncmoe":
            overrides.extend(_per_layer_rules("--n-cpu-moe", int(r[1]), FFN_EXPS_REGEX))
        else:
            overrides.append((str(r[0]), str(r[1])))
    if overrides:
        kw["tensor_overrides"] = tuple(overrides)
    return kw


def _skipped(a: str, nxt: str | None, warnings: list[str]) -> int:
    """A flag that does not change memory: how many values it takes with it (an unknown one is named)."""
    if a in _VALUE_FLAGS_IGNORED:
        if nxt is None:
            raise PricingError(f"{a} needs a value")
        return 1
    if a in _BOOL_FLAGS_IGNORED:
        return 0
    if nxt is not None and not nxt.startswith("-"):
        warnings.append(f"{a} {nxt}: not a memory flag fitevict knows; ignored")
        return 1
    warnings.append(f"{a}: not a memory flag fitevict knows; ignored")
    return 0


# llama-server's flags without a value that set one LoadConfig field (beside the flag table's own switches)
_SWITCH_FIELDS: dict[str, tuple[str, bool]] = {
    "--embedding": ("embeddings", True), "--embeddings": ("embeddings", True),
    "-kvu": ("kv_unified", True), "--kv-unified": ("kv_unified", True),
    "-no-kvu": ("kv_unified", False), "--no-kv-unified": ("kv_unified", False),
    "-nkvo": ("kv_offload", False), "--no-kv-offload": ("kv_offload", False),
    "-kvo": ("kv_offload", True), "--kv-offload": ("kv_offload", True),
}


def parse_server_argv(argv: list[str] | tuple[str, ...]) -> ServerCommand:
    """Parse ``llama-server -m X.gguf -c 4096 ...`` (the program name itself is optional)."""
    args = list(argv)
    if args and (args[0].endswith("llama-server") or args[0].endswith("llama-server.exe")):
        args = args[1:]
    model = ""
    kw: dict[str, object] = {}
    warnings: list[str] = []
    graph_args: list[str] = []
    # tensor overrides in command-line order; ("ncmoe", N) marks where a --n-cpu-moe put its rules
    rules: list[tuple[str, str] | tuple[str, int]] = []
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
        elif a in _SWITCH_FIELDS:  # flags without a value that set one LoadConfig field
            kw[_SWITCH_FIELDS[a][0]] = _SWITCH_FIELDS[a][1]
        elif a in _RULE_FLAGS:
            rules.extend(_rules_of(a, value(a) if a not in ("-cmoe", "--cpu-moe") else ""))
        elif a in ("--lora", "--lora-scaled"):  # FNAME[,FNAME...] / FNAME:SCALE[,...]: each adapter's LoRA buffer
            files = [f.rsplit(":", 1)[0] if a == "--lora-scaled" else f for f in value(a).split(",") if f]
            kw["loras"] = (*kw.get("loras", ()), *files)  # type: ignore[misc]
        elif a in _GRAPH_VALUE_FLAGS:
            v = value(a)
            if a == "--pooling" and v not in POOLING_TYPES:
                raise PricingError(f"{a} {v!r}: use one of {', '.join(POOLING_TYPES)}")
            graph_args += [a, v]
        elif isinstance(spec := flag_spec(a), ValueFlag):  # -ctk -ctv -fa -b -ub: the one flag table
            kw[spec.field] = spec.parse(a, value(a))
        elif isinstance(spec, Switch):  # --swa-full, -nr
            kw[spec.field] = spec.value
        elif a in ("-lm", "--load-mode"):
            v = value(a)
            if v not in ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio"):
                raise PricingError(f"{a} {v!r}: use auto, none, mmap, mlock, mmap+mlock or dio")
            kw["mmap"] = v in ("auto", "mmap", "mmap+mlock")
        elif a in ("-ts", "--tensor-split"):
            kw["tensor_split"] = _split(a, value(a))
        elif a in ("-dev", "--device"):
            v = value(a)
            kw["devices"] = () if v == "none" else tuple(d for d in v.split(",") if d)
        elif a == "--rpc":  # SERVERS: comma-separated HOST:PORT; the engine names their devices RPC0, RPC1, ...
            kw["rpc"] = (*kw.get("rpc", ()), *_endpoints(a, value(a)))  # type: ignore[misc]
        elif a.startswith("-"):
            i += _skipped(a, args[i + 1] if i + 1 < len(args) else None, warnings)
        elif not model:
            model = a
        else:
            warnings.append(f"{a}: unexpected argument; ignored")
        i += 1
    if not model:
        raise PricingError("the command line has no -m MODEL.gguf")
    kw.update(_placement_rules(rules))
    if "devices" not in kw and kw.get("n_gpu_layers", 0) != 0:
        warnings.append("no -dev: priced for the CPU only; pass -dev CUDA0 (...) to price GPU placement")
    return ServerCommand(model, LoadConfig(**kw), tuple(warnings), tuple(graph_args))  # type: ignore[arg-type]
