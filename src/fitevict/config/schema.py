"""The schema: one table of dotted keys, each with its parser and environment variable (uvicorn style)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from fitevict.config.records import CACHE_TYPES
from fitevict.config.records import ALLOC_MODES, EVICTION_POLICIES, FLASH_ATTN, ORPHAN_POLICIES
from fitevict.config.parsers import (Parser, alias, alias_table, arg_list, class_table, key_table, boolean, days, one_of, fraction, integer, integer_or, origin_url,
                                     path_value, positive_size, request_defaults, rpc_endpoint, seconds, secret, size,
                                     size_per_device, store_url, store_source, str_list, nonempty_text, uma_table)


# ----------------------------------------------------------------------------- the schema


@dataclass(frozen=True, slots=True)
class _Key:
    key: str  # dotted
    parse: Parser
    env: str | None = None
    env_split: str | None = None  # "," or os.pathsep: the variable holds a list
    in_file: bool = True  # False: only the environment (or an override) sets it


KEYS: tuple[_Key, ...] = (
    _Key("server.host", nonempty_text, env="FITEVICT_HOST"),
    _Key("server.port", integer(0, 65535), env="FITEVICT_PORT"),
    _Key("server.api_keys", str_list(secret, "a list of keys without whitespace"), env="FITEVICT_API_KEYS", env_split=","),
    _Key("server.admin_keys", str_list(secret, "a list of keys without whitespace"), env="FITEVICT_ADMIN_KEYS", env_split=","),
    _Key("server.cors_origins", str_list(origin_url, 'a list of origins like ["http://localhost:3000"] or ["*"]')),
    _Key("server.debug_log_prompts", boolean),
    _Key("server.max_body_bytes", positive_size),
    _Key("server.metrics_public", boolean, env="FITEVICT_METRICS_PUBLIC"),
    _Key("server.sample_seconds", seconds(positive=True)),
    _Key("server.heap_trim_seconds", seconds(positive=False)),
    _Key("server.rescan_seconds", seconds(positive=False), env="FITEVICT_RESCAN_SECONDS"),
    _Key("server.max_connections", integer_or("auto", 2), env="FITEVICT_MAX_CONNECTIONS"),
    _Key("server.read_prices_ahead", boolean, env="FITEVICT_READ_PRICES_AHEAD"),
    _Key("server.cluster_key", secret, env="FITEVICT_CLUSTER_KEY"),
    _Key("server.ray_gcs_reconnect_seconds", integer(1, 2**32 - 1), env="FITEVICT_RAY_GCS_RECONNECT_SECONDS"),
    _Key("models_dirs", str_list(path_value, "a list of directory paths"), env="FITEVICT_MODELS_DIRS", env_split=os.pathsep),
    _Key("data_dir", path_value, env="FITEVICT_DATA_DIR"),
    _Key("store_url", store_url, env="FITEVICT_STORE_URL"),
    _Key("engine.llama_server", path_value),
    _Key("engine.llama_server_env", path_value, env="FITEVICT_LLAMA_SERVER", in_file=False),
    _Key("engine.vulkan_devices", str_list(integer(0), "a list of Vulkan device indices like [0]"),
         env="FITEVICT_VULKAN_DEVICES", env_split=","),
    _Key("engine.extra_args", arg_list),
    _Key("engine.health_timeout_seconds", seconds(positive=True)),
    _Key("engine.stall_seconds", seconds(positive=True)),
    _Key("engine.stop_grace_seconds", seconds(positive=False)),
    _Key("engine.release_timeout_seconds", seconds(positive=True)),
    _Key("engine.orphans", one_of(ORPHAN_POLICIES)),
    _Key("budget.ram_limit", size(optional=True), env="FITEVICT_RAM_LIMIT"),
    _Key("budget.gpu_limit", size_per_device(optional=True), env="FITEVICT_GPU_LIMIT"),
    _Key("budget.ram_reserve", size(optional=False)),
    _Key("budget.gpu_reserve", size_per_device(optional=False)),
    _Key("budget.yield_to_others", boolean, env="FITEVICT_YIELD_TO_OTHERS"),
    _Key("budget.pressure_margin", size(optional=False)),
    _Key("budget.outgrow_margin", size(optional=False)),
    _Key("devices.rpc", str_list(rpc_endpoint, "a list of endpoints HOST:PORT"), env="FITEVICT_RPC", env_split=","),
    _Key("devices.uma", uma_table, env="FITEVICT_UMA"),
    _Key("policy.idle_unload_seconds", seconds(positive=False), env="FITEVICT_IDLE_UNLOAD_SECONDS"),
    _Key("policy.max_queue", integer(1)),
    _Key("policy.queue_timeout_seconds", seconds(positive=True)),
    _Key("policy.exclusive_fraction", fraction),
    _Key("policy.default_alloc_mode", one_of(ALLOC_MODES)),
    _Key("policy.eviction", one_of(EVICTION_POLICIES), env="FITEVICT_EVICTION"),
    _Key("policy.max_turn_seconds", seconds(positive=True)),
    _Key("policy.max_wait_seconds", seconds(positive=True)),
    _Key("policy.min_residency_seconds", seconds(positive=False)),
    _Key("policy.engine_queue_depth", integer_or("slots", 0)),
    _Key("policy.shutdown_grace_seconds", seconds(positive=False)),
    _Key("policy.shrink_ctx", boolean, env="FITEVICT_SHRINK_CTX"),
    _Key("policy.prompt_cache", boolean, env="FITEVICT_PROMPT_CACHE"),
    _Key("policy.prompt_cache_min_tokens", integer(1)),
    _Key("policy.prompt_cache_disk", size(optional=False)),
    _Key("policy.recycle_outgrown", boolean, env="FITEVICT_RECYCLE_OUTGROWN"),
    _Key("fair.classes", class_table),
    _Key("fair.default_class", nonempty_text, env="FITEVICT_DEFAULT_CLASS"),
    _Key("fair.key_max_in_flight", integer_or("none", 1)),
    _Key("fair.key_max_queue", integer_or("none", 0)),
    _Key("fair.keys", key_table),
    _Key("stores.ollama", store_source, env="FITEVICT_OLLAMA"),
    _Key("stores.hf_cache", store_source, env="FITEVICT_HF_CACHE"),
    _Key("stores.lmstudio", store_source, env="FITEVICT_LMSTUDIO"),
    _Key("logs.seats_disk", size(optional=False)),
    _Key("logs.seats_per_model", integer(1)),
    _Key("logs.history_days", days),
    _Key("logs.history_rows", integer(0)),
    _Key("logs.records_per_signature", integer(0)),
    _Key("logs.records_rows", integer(0)),
    _Key("logs.prune_seconds", seconds(positive=True)),
    _Key("aliases", alias_table),  # a table: names clients send (``*`` patterns too) -> catalog models
)
BY_KEY: dict[str, _Key] = {k.key: k for k in KEYS}
SECTIONS = ("server", "engine", "budget", "devices", "policy", "fair", "stores", "logs")
TOP_LEVEL = ("server", "engine", "budget", "devices", "policy", "fair", "stores", "logs", "models", "models_dirs",
             "data_dir", "store_url", "aliases")

MODEL_FIELDS: dict[str, Parser] = {
    "path": path_value,
    "engine": nonempty_text,  # one of the engines registered (fitevict.engines.REGISTRY): the catalog checks it
    "ctx": integer(0),
    "parallel": integer(1),
    "cache_type_k": one_of(CACHE_TYPES),
    "cache_type_v": one_of(CACHE_TYPES),
    "kv_cache_type": one_of(CACHE_TYPES),
    "flash_attn": lambda v, o: ("on" if v else "off") if isinstance(v, bool) else one_of(FLASH_ATTN)(v, o),
    "aliases": str_list(alias, "a list of names without whitespace"),
    "pin": boolean,
    "embeddings": boolean,
    "extra_args": arg_list,
    "request_defaults": request_defaults,
    "mmproj": path_value,
    "alloc_mode": one_of(ALLOC_MODES),
    "n_gpu_layers": integer(-1),
    "n_cpu_moe": integer(0),
    "base": alias,
}

#: Keys that moved: a config that sets one is refused with the new name (one name per knob).
MOVED: dict[str, str] = {"engine.seat_logs_disk": "logs.seats_disk"}

#: FITEVICT_* variables read elsewhere, which are not config keys.
OTHER_ENV: tuple[str, ...] = ("FITEVICT_CONFIG", "FITEVICT_CACHE_DIR")


def config_keys() -> tuple[str, ...]:
    """Every dotted key a config file may set, model keys as ``models.<key>.<field>``."""
    return tuple(k.key for k in KEYS if k.in_file) + tuple(f"models.<key>.{f}" for f in MODEL_FIELDS)


def env_variables() -> dict[str, str]:
    """``{FITEVICT_VAR: dotted key}`` for every variable that sets a key."""
    return {k.env: k.key for k in KEYS if k.env}
