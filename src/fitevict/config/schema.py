"""The schema: one table of dotted keys, each with its parser and environment variable (uvicorn style)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from fitevict.config.records import CACHE_TYPES
from fitevict.config.records import ALLOC_MODES, ENGINES, EVICTION_POLICIES, FLASH_ATTN, ORPHAN_POLICIES
from fitevict.config.parsers import (Parser, _alias, _args, _bool, _choice, _fraction, _int, _int_or, _origin_url,
                                     _path, _positive_size, _request_defaults, _seconds, _secret, _size, _store_url,
                                     _store_source, _str_list, _text)


# ----------------------------------------------------------------------------- the schema


@dataclass(frozen=True, slots=True)
class _Key:
    key: str  # dotted
    parse: Parser
    env: str | None = None
    env_split: str | None = None  # "," or os.pathsep: the variable holds a list
    in_file: bool = True  # False: only the environment (or an override) sets it


_KEYS: tuple[_Key, ...] = (
    _Key("server.host", _text, env="FITEVICT_HOST"),
    _Key("server.port", _int(0, 65535), env="FITEVICT_PORT"),
    _Key("server.api_keys", _str_list(_secret, "a list of keys without whitespace"), env="FITEVICT_API_KEYS", env_split=","),
    _Key("server.admin_keys", _str_list(_secret, "a list of keys without whitespace"), env="FITEVICT_ADMIN_KEYS", env_split=","),
    _Key("server.cors_origins", _str_list(_origin_url, 'a list of origins like ["http://localhost:3000"] or ["*"]')),
    _Key("server.debug_log_prompts", _bool),
    _Key("server.max_body_bytes", _positive_size),
    _Key("server.metrics_public", _bool, env="FITEVICT_METRICS_PUBLIC"),
    _Key("server.sample_seconds", _seconds(positive=True)),
    _Key("server.rescan_seconds", _seconds(positive=False), env="FITEVICT_RESCAN_SECONDS"),
    _Key("server.cluster_key", _secret, env="FITEVICT_CLUSTER_KEY"),
    _Key("models_dirs", _str_list(_path, "a list of directory paths"), env="FITEVICT_MODELS_DIRS", env_split=os.pathsep),
    _Key("data_dir", _path, env="FITEVICT_DATA_DIR"),
    _Key("store_url", _store_url, env="FITEVICT_STORE_URL"),
    _Key("engine.llama_server", _path),
    _Key("engine.llama_server_env", _path, env="FITEVICT_LLAMA_SERVER", in_file=False),
    _Key("engine.extra_args", _args),
    _Key("engine.health_timeout_seconds", _seconds(positive=True)),
    _Key("engine.stall_seconds", _seconds(positive=True)),
    _Key("engine.stop_grace_seconds", _seconds(positive=False)),
    _Key("engine.release_timeout_seconds", _seconds(positive=True)),
    _Key("engine.orphans", _choice(ORPHAN_POLICIES)),
    _Key("budget.ram_limit", _size(optional=True), env="FITEVICT_RAM_LIMIT"),
    _Key("budget.gpu_limit", _size(optional=True), env="FITEVICT_GPU_LIMIT"),
    _Key("budget.ram_reserve", _size(optional=False)),
    _Key("budget.gpu_reserve", _size(optional=False)),
    _Key("budget.yield_to_others", _bool, env="FITEVICT_YIELD_TO_OTHERS"),
    _Key("budget.pressure_margin", _size(optional=False)),
    _Key("policy.idle_unload_seconds", _seconds(positive=False), env="FITEVICT_IDLE_UNLOAD_SECONDS"),
    _Key("policy.max_queue", _int(1)),
    _Key("policy.queue_timeout_seconds", _seconds(positive=True)),
    _Key("policy.exclusive_fraction", _fraction),
    _Key("policy.default_alloc_mode", _choice(ALLOC_MODES)),
    _Key("policy.eviction", _choice(EVICTION_POLICIES), env="FITEVICT_EVICTION"),
    _Key("policy.max_turn_seconds", _seconds(positive=True)),
    _Key("policy.max_wait_seconds", _seconds(positive=True)),
    _Key("policy.min_residency_seconds", _seconds(positive=False)),
    _Key("policy.engine_queue_depth", _int_or("slots", 0)),
    _Key("policy.shutdown_grace_seconds", _seconds(positive=False)),
    _Key("policy.shrink_ctx", _bool, env="FITEVICT_SHRINK_CTX"),
    _Key("policy.prompt_cache", _bool, env="FITEVICT_PROMPT_CACHE"),
    _Key("policy.prompt_cache_min_tokens", _int(1)),
    _Key("policy.prompt_cache_disk", _size(optional=False)),
    _Key("stores.ollama", _store_source, env="FITEVICT_OLLAMA"),
    _Key("stores.hf_cache", _store_source, env="FITEVICT_HF_CACHE"),
    _Key("stores.lmstudio", _store_source, env="FITEVICT_LMSTUDIO"),
)
_BY_KEY: dict[str, _Key] = {k.key: k for k in _KEYS}
_SECTIONS = ("server", "engine", "budget", "policy", "stores")
_TOP_LEVEL = ("server", "engine", "budget", "policy", "stores", "models", "models_dirs", "data_dir", "store_url")

_MODEL_FIELDS: dict[str, Parser] = {
    "path": _path,
    "engine": _choice(ENGINES),
    "ctx": _int(0),
    "parallel": _int(1),
    "cache_type_k": _choice(CACHE_TYPES),
    "cache_type_v": _choice(CACHE_TYPES),
    "kv_cache_type": _choice(CACHE_TYPES),
    "flash_attn": lambda v, o: ("on" if v else "off") if isinstance(v, bool) else _choice(FLASH_ATTN)(v, o),
    "aliases": _str_list(_alias, "a list of names without whitespace"),
    "pin": _bool,
    "embeddings": _bool,
    "extra_args": _args,
    "request_defaults": _request_defaults,
    "mmproj": _path,
    "alloc_mode": _choice(ALLOC_MODES),
    "n_gpu_layers": _int(-1),
    "n_cpu_moe": _int(0),
    "base": _alias,
}

#: FITEVICT_* variables read elsewhere, which are not config keys.
OTHER_ENV: tuple[str, ...] = ("FITEVICT_CONFIG", "FITEVICT_CACHE_DIR")


def config_keys() -> tuple[str, ...]:
    """Every dotted key a config file may set, model keys as ``models.<key>.<field>``."""
    return tuple(k.key for k in _KEYS if k.in_file) + tuple(f"models.<key>.{f}" for f in _MODEL_FIELDS)


def env_variables() -> dict[str, str]:
    """``{FITEVICT_VAR: dotted key}`` for every variable that sets a key."""
    return {k.env: k.key for k in _KEYS if k.env}
