"""The typed, frozen configuration records and the vocabularies their fields take."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fitevict import paths
from fitevict.units import MiB, GiB


ALLOC_MODES: tuple[str, ...] = ("gpu-only", "max-gpu", "max-ram", "ram-only", "explicit")
ORPHAN_POLICIES: tuple[str, ...] = ("stop", "adopt")
# the names of the registered eviction policies (``planner.eviction.POLICIES``: GreedyDual-Size, least recently used)
EVICTION_POLICIES: tuple[str, ...] = ("cost", "lru")
FLASH_ATTN: tuple[str, ...] = ("on", "off", "auto")
CACHE_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")  # -ctk / -ctv
STORE_SCHEMES: tuple[str, ...] = ("sqlite", "postgresql")
REDACTED = "<redacted>"


class ConfigError(ValueError):
    """An invalid configuration. The message is meant for users as is (no traceback needed)."""


# ----------------------------------------------------------------------------- the typed records


def _empty_mapping() -> Mapping[str, Any]:
    return MappingProxyType({})



@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080  # 0 = any free port
    api_keys: tuple[str, ...] = ()  # user keys: inference
    admin_keys: tuple[str, ...] = ()  # admin keys: inference + load/unload/plan
    cors_origins: tuple[str, ...] = ()  # () = CORS off
    debug_log_prompts: bool = False
    max_body_bytes: int = 16 * MiB
    metrics_public: bool = False  # True: /metrics answers without a key even when keys are configured
    sample_seconds: float = 1.0  # how often the memory sampler reads each seat and the host while serving
    heap_trim_seconds: float = 60.0  # how often the door gives malloc's free pages back to the kernel; 0: never
    rescan_seconds: float = 0.0  # rescan the models directories this often while serving (0: only on SIGHUP)
    read_prices_ahead: bool = True  # after start-up and each rescan, read every model's price in the background
    cluster_key: str | None = None  # on a Ray cluster: the key every node's door admits (None: a random one)
    max_connections: int | None = None  # client connections held at once; None ("auto"): from RLIMIT_NOFILE
    # on a Ray cluster: how long Ray's GCS may stay unreachable before Ray ends the front door's driver and the node
    # agents it starts (Ray's gcs_rpc_server_reconnect_timeout_s, 60 s by default)
    ray_gcs_reconnect_seconds: int = 600

    @property
    def auth_enabled(self) -> bool:
        """True when any key is configured; then every request needs one."""
        return bool(self.api_keys or self.admin_keys)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    llama_server: Path | None = None  # from the config file (or an override): lookup step 1
    llama_server_env: Path | None = None  # from FITEVICT_LLAMA_SERVER: lookup step 2
    # the Vulkan devices seats may use, by the engine's index (GGML_VK_VISIBLE_DEVICES in the seat's environment):
    # names CPU-type devices such as lavapipe, which ggml-vulkan skips unless named; () = the engine's default
    vulkan_devices: tuple[int, ...] = ()
    extra_args: tuple[str, ...] = ()
    health_timeout_seconds: float = 120.0
    stall_seconds: float = 30.0
    stop_grace_seconds: float = 10.0
    release_timeout_seconds: float = 30.0
    orphans: str = "stop"  # one of ORPHAN_POLICIES


@dataclass(frozen=True, slots=True)
class LogsConfig:
    """What fitevict keeps on disk of what happened: seat logs (``data_dir/seats``) and the store's history."""

    seats_disk: int = 256 * MiB  # all seat logs together; the oldest pruned first, never a running seat's
    seats_per_model: int = 5  # a model's newest seat logs kept; older ones pruned (a running seat's never)
    history_days: float = 90.0  # history events and load records older than this are pruned; 0 = kept for ever
    history_rows: int = 1_000_000  # at most this many history events (the oldest pruned first); 0 = no bound
    records_per_signature: int = 16  # load records and seat peak windows kept per configuration; 0 = no bound
    records_rows: int = 100_000  # at most this many load records, peak windows, and entries of each cache; 0 = none
    prune_seconds: float = 3600.0  # how often the store is pruned and its write-ahead log checkpointed


GPU_RESERVE = 512 * MiB  # kept free on each device that ``budget.gpu_reserve`` does not name


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    ram_limit: int | None = None  # bytes; None = the machine's
    # bytes on each device (a size), or per device by the engine's names ({"Vulkan0": ..., "RPC0": ...}: a device not
    # named has no limit); None = the device's
    gpu_limit: int | Mapping[str, int] | None = None
    ram_reserve: int = 1 * GiB
    gpu_reserve: int | Mapping[str, int] = GPU_RESERVE  # the same forms; a device not named keeps GPU_RESERVE
    yield_to_others: bool = True  # stop idle seats when other programs take the reserve (fitevict.pressure)
    pressure_margin: int = 256 * MiB  # hysteresis: under pressure below reserve, calm again at reserve + margin
    # a seat whose reading exceeds its price by more than this is outgrowing it (fitevict.pressure.outgrowth). From
    # the measured noise: a healthy filled seat reads at most 56 MiB over its price (-1.25 % of the 4.5 GB life-size
    # 8B), 4 MiB on the demo models; 64 MiB is above both
    outgrow_margin: int = 64 * MiB


@dataclass(frozen=True, slots=True)
class DevicesConfig:
    """The devices seats may use beside those the engine build finds itself (``llama-server --list-devices``)."""

    # rpc-server endpoints (HOST:PORT), in order: the engine names their devices RPC0, RPC1, ... and a seat placed on
    # any of them is started with all of them (``--rpc``), so that every seat names them alike
    rpc: tuple[str, ...] = ()
    # declared: device name -> whether its memory is host memory (a unified-memory device: an APU, Apple, lavapipe).
    # Overrides what the engine and the machine say (fitevict.engines.llama_cpp.census)
    uma: Mapping[str, bool] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    idle_unload_seconds: float = 1800.0  # 0 = never unload for idleness
    max_queue: int = 64  # waiting requests per model
    queue_timeout_seconds: float = 300.0
    exclusive_fraction: float = 1.0  # in (0, 1]; 1: no load is exclusive (docs/benchmarks.md, trace replay)
    default_alloc_mode: str = "max-gpu"  # one of ALLOC_MODES
    eviction: str = "cost"  # one of EVICTION_POLICIES: GreedyDual-Size ("cost") or least recently used ("lru")
    max_turn_seconds: float = 30.0  # a seat's turn: serves what arrives for it this long while others wait
    max_wait_seconds: float = 10.0  # ... or until another model's oldest request has waited this long
    min_residency_seconds: float = 1.0  # never evicted this soon after its load
    engine_queue_depth: int | None = None  # handed to a seat beyond its slots (None: one batch); the rest wait here
    shutdown_grace_seconds: float = 10.0  # SIGTERM: in-flight requests get this long, then are cut
    shrink_ctx: bool = False  # load with the largest context that fits when the asked one does not, if the request fits
    prompt_cache: bool = True  # llama-server seats: save long prompts' KV before a stop, restore it on the next load
    prompt_cache_min_tokens: int = 1024  # a slot's prompt is saved only from this many tokens
    prompt_cache_disk: int = 4 * GiB  # saved prompts kept on disk, all models together (never past free disk - 1 GiB)
    # a seat outgrowing its price is drained and loaded again (off: the pressure rule stops it first when memory is
    # short, and a growth a restart does not cure, a filled context, is priced by what it outgrew to)
    recycle_outgrown: bool = False


def _default_classes() -> Mapping[str, float]:
    return MappingProxyType({"interactive": 4.0, "batch": 1.0})


@dataclass(frozen=True, slots=True)
class KeyConfig:
    """One ``[fair.keys.<name>]`` entry: an API key (a user key) and what it is given. ``None``: the ``[fair]``
    default."""

    name: str
    key: str  # the secret itself
    klass: str | None = None  # its priority class (TOML: class); None: fair.default_class
    classes: tuple[str, ...] = ()  # the classes its requests may ask for above its own (x-fitevict-priority)
    weight: float = 1.0  # its share against the other keys of its class
    max_in_flight: int | None = None  # None: fair.key_max_in_flight
    max_queue: int | None = None  # None: fair.key_max_queue


@dataclass(frozen=True, slots=True)
class FairConfig:
    """Fairness between clients (docs/scheduling.md): priority classes with weights, and per-key caps."""

    classes: Mapping[str, float] = field(default_factory=_default_classes)  # name -> weight; the heavier goes first
    default_class: str = "interactive"  # a request's class when neither its key nor the request names one
    key_max_in_flight: int | None = None  # per key, requests handed to seats at once (None: no cap)
    key_max_queue: int | None = None  # per key, requests waiting at once (None: no cap; policy.max_queue per model)
    keys: Mapping[str, KeyConfig] = field(default_factory=_empty_mapping)  # [fair.keys.<name>]


@dataclass(frozen=True, slots=True)
class StoresConfig:
    """The model stores read beside ``models_dirs`` (fitevict.sources): ``True`` reads a store at its own default
    location when that folder exists, ``False`` leaves it out, a path reads the store there."""

    ollama: bool | Path = True  # $OLLAMA_MODELS, else ~/.ollama/models
    hf_cache: bool | Path = True  # $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub
    lmstudio: bool | Path = True  # ~/.lmstudio/models (older installs: ~/.cache/lm-studio/models)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One ``[models.<key>]`` entry. ``None`` means "not set": the engine default or the global policy."""

    key: str
    path: Path | None = None  # GGUF file, split's first shard, or a directory
    engine: str | None = None  # None = by files: llama-server for GGUF, transformers for HF dirs
    ctx: int | None = None  # -c; 0 = the model's training context
    parallel: int | None = None  # -np
    cache_type_k: str | None = None  # -ctk
    cache_type_v: str | None = None  # -ctv
    flash_attn: str | None = None  # on | off | auto
    aliases: tuple[str, ...] = ()
    pin: bool = False
    embeddings: bool = False
    extra_args: tuple[str, ...] = ()
    request_defaults: Mapping[str, Any] = field(default_factory=_empty_mapping)
    mmproj: Path | None = None  # projector file; None = the one found beside the model
    alloc_mode: str | None = None  # None = policy.default_alloc_mode
    n_gpu_layers: int | None = None  # -ngl, for alloc_mode explicit
    n_cpu_moe: int | None = None  # --n-cpu-moe, for alloc_mode explicit
    base: str | None = None  # for a LoRA adapter (path = the adapter): the key of the model it adapts

    def to_json(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    devices: DevicesConfig = field(default_factory=DevicesConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    fair: FairConfig = field(default_factory=FairConfig)
    stores: StoresConfig = field(default_factory=StoresConfig)
    logs: LogsConfig = field(default_factory=LogsConfig)
    models: Mapping[str, ModelConfig] = field(default_factory=_empty_mapping)
    models_dirs: tuple[Path, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=_empty_mapping)  # [aliases]: client names -> catalog models
    data_dir: Path = field(default_factory=paths.data_dir)
    store_url: str = ""
    config_path: Path | None = None  # the TOML file read, if any
    origins: Mapping[str, str] = field(default_factory=_empty_mapping)  # dotted key -> where it was set
    notes: tuple[str, ...] = ()  # things ignored, e.g. FITEVICT_* variables that are no setting

    def to_json(self) -> dict[str, Any]:
        """The effective configuration as JSON-able data, with keys and store passwords redacted."""
        server = {f.name: _jsonable(getattr(self.server, f.name)) for f in fields(self.server)}
        server["api_keys"] = [REDACTED] * len(self.server.api_keys)
        server["admin_keys"] = [REDACTED] * len(self.server.admin_keys)
        server["cluster_key"] = REDACTED if self.server.cluster_key else None
        return {
            "config_path": _jsonable(self.config_path),
            "server": server,
            "engine": {f.name: _jsonable(getattr(self.engine, f.name)) for f in fields(self.engine)},
            "budget": {f.name: _jsonable(getattr(self.budget, f.name)) for f in fields(self.budget)},
            "devices": {f.name: _jsonable(getattr(self.devices, f.name)) for f in fields(self.devices)},
            "policy": {f.name: getattr(self.policy, f.name) for f in fields(self.policy)},
            "fair": {"classes": dict(self.fair.classes), "default_class": self.fair.default_class,
                     "key_max_in_flight": self.fair.key_max_in_flight, "key_max_queue": self.fair.key_max_queue,
                     "keys": {n: {**_jsonable({f.name: getattr(k, f.name) for f in fields(k)}), "key": REDACTED}
                              for n, k in self.fair.keys.items()}},
            "stores": {f.name: _jsonable(getattr(self.stores, f.name)) for f in fields(self.stores)},
            "logs": {f.name: getattr(self.logs, f.name) for f in fields(self.logs)},
            "models_dirs": [str(p) for p in self.models_dirs],
            "data_dir": str(self.data_dir),
            "store_url": redact_url(self.store_url),
            "models": {k: m.to_json() for k, m in self.models.items()},
            "aliases": dict(self.aliases),
        }


def _jsonable(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


def redact_url(url: str) -> str:
    """``postgresql://user:secret@host/db`` -> ``postgresql://user:<redacted>@host/db``."""
    return re.sub(r"^([a-z0-9+]+://[^:/@]*):[^@]*@", rf"\1:{REDACTED}@", url, flags=re.I)


def default(section: type, name: str) -> Any:
    """The one default of a knob: the field default of its config section (``default(PolicyConfig, "eviction")``).
    Records elsewhere that carry the same knob (the planner's and the scheduler's policies, the budget) take their
    defaults from here, so no two copies drift apart."""
    for f in fields(section):
        if f.name == name:
            return f.default
    raise KeyError(f"{section.__name__} has no field {name!r}")
