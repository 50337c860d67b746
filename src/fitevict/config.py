"""One typed, frozen configuration, built once and validated with errors that name the key.

Layers, later wins: built-in defaults < TOML file < ``FITEVICT_*`` environment variables < explicit
overrides (a dict of dotted keys the CLI builds from its flags). Every value is checked against its
form; an error names the dotted key (``budget.ram_reserve``, ``models.qwen.ctx``), the value, where
it came from (file, variable, override) and what is allowed. Unknown keys are errors with close
matches. docs/config.md is the reference of every key.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fitevict import paths
from fitevict.pricing.loadconfig import CACHE_TYPES
from fitevict.units import MiB, GiB, SizeError, parse_size

ALLOC_MODES: tuple[str, ...] = ("gpu-only", "max-gpu", "max-ram", "ram-only", "explicit")
ORPHAN_POLICIES: tuple[str, ...] = ("stop", "adopt")
EVICTION_POLICIES: tuple[str, ...] = ("cost", "lru")  # GreedyDual-Size, or least recently used
ENGINES: tuple[str, ...] = ("llama-server", "transformers", "vllm")
FLASH_ATTN: tuple[str, ...] = ("on", "off", "auto")
STORE_SCHEMES: tuple[str, ...] = ("sqlite", "postgresql")
REDACTED = "<redacted>"


class ConfigError(ValueError):
    """An invalid configuration. The message is meant for users as is (no traceback needed)."""


# ----------------------------------------------------------------------------- the typed records


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

    @property
    def auth_enabled(self) -> bool:
        """True when any key is configured; then every request needs one."""
        return bool(self.api_keys or self.admin_keys)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    llama_server: Path | None = None  # from the config file (or an override): lookup step 1
    llama_server_env: Path | None = None  # from FITEVICT_LLAMA_SERVER: lookup step 2
    extra_args: tuple[str, ...] = ()
    health_timeout_seconds: float = 120.0
    stall_seconds: float = 30.0
    stop_grace_seconds: float = 10.0
    release_timeout_seconds: float = 30.0
    orphans: str = "stop"  # one of ORPHAN_POLICIES


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    ram_limit: int | None = None  # bytes; None = the machine's
    gpu_limit: int | None = None  # bytes per GPU; None = the device's
    ram_reserve: int = 1 * GiB
    gpu_reserve: int = 512 * MiB


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    idle_unload_seconds: float = 1800.0  # 0 = never unload for idleness
    max_queue: int = 64  # waiting requests per model
    queue_timeout_seconds: float = 300.0
    exclusive_fraction: float = 0.5  # in (0, 1]
    default_alloc_mode: str = "max-gpu"  # one of ALLOC_MODES
    eviction: str = "cost"  # one of EVICTION_POLICIES: GreedyDual-Size ("cost") or least recently used ("lru")
    max_turn_seconds: float = 30.0  # a seat's turn: serves what arrives for it this long while others wait
    max_wait_seconds: float = 10.0  # ... or until another model's oldest request has waited this long
    min_residency_seconds: float = 1.0  # never evicted this soon after its load
    engine_queue_depth: int = 1  # requests handed to a seat beyond its slots (the rest wait in fitevict)
    shutdown_grace_seconds: float = 10.0  # SIGTERM: in-flight requests get this long, then are cut


def _empty_mapping() -> Mapping[str, Any]:
    return MappingProxyType({})


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

    def to_json(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    models: Mapping[str, ModelConfig] = field(default_factory=_empty_mapping)
    models_dirs: tuple[Path, ...] = ()
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
        return {
            "config_path": _jsonable(self.config_path),
            "server": server,
            "engine": {f.name: _jsonable(getattr(self.engine, f.name)) for f in fields(self.engine)},
            "budget": {f.name: getattr(self.budget, f.name) for f in fields(self.budget)},
            "policy": {f.name: getattr(self.policy, f.name) for f in fields(self.policy)},
            "models_dirs": [str(p) for p in self.models_dirs],
            "data_dir": str(self.data_dir),
            "store_url": redact_url(self.store_url),
            "models": {k: m.to_json() for k, m in self.models.items()},
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


# ----------------------------------------------------------------------------- value parsers


class _Bad(Exception):
    """A value of the wrong form; the message says what is expected."""


@dataclass(frozen=True, slots=True)
class _Origin:
    text: str  # "config file /x.toml", "environment variable FITEVICT_PORT", "override"
    textual: bool  # the value is a string to be read (env), not a typed TOML value
    base: Path | None  # relative paths are taken from here (the config file's folder); None = cwd


Parser = Callable[[Any, _Origin], Any]


def _int(lo: int, hi: int | None = None) -> Parser:
    form = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"

    def parse(v: Any, o: _Origin) -> int:
        if isinstance(v, str) and o.textual:
            try:
                v = int(v.strip())
            except ValueError:
                raise _Bad(form) from None
        if isinstance(v, bool) or not isinstance(v, int):
            raise _Bad(form)
        if v < lo or (hi is not None and v > hi):
            raise _Bad(form)
        return v

    return parse


def _seconds(*, positive: bool) -> Parser:
    form = "a number of seconds > 0" if positive else "a number of seconds >= 0"

    def parse(v: Any, o: _Origin) -> float:
        if isinstance(v, str) and o.textual:
            try:
                v = float(v.strip())
            except ValueError:
                raise _Bad(form) from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise _Bad(form)
        if v < 0 or (positive and v == 0) or v == float("inf"):
            raise _Bad(form)
        return float(v)

    return parse


def _fraction(v: Any, o: _Origin) -> float:
    form = "a number in (0, 1], e.g. 0.5"
    if isinstance(v, str) and o.textual:
        try:
            v = float(v.strip())
        except ValueError:
            raise _Bad(form) from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise _Bad(form)
    return float(v)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(v: Any, o: _Origin) -> bool:
    if isinstance(v, str) and o.textual and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    if not isinstance(v, bool):
        raise _Bad("true or false")
    return v


def _choice(choices: tuple[str, ...], *, optional: bool = False) -> Parser:
    form = "one of " + ", ".join(choices)

    def parse(v: Any, o: _Origin) -> str | None:
        if v is None and optional:
            return None
        if not isinstance(v, str) or v.strip() not in choices:
            raise _Bad(form)
        return v.strip()

    return parse


def _text(v: Any, o: _Origin) -> str:
    if not isinstance(v, str) or not v.strip():
        raise _Bad("a non-empty string")
    return v.strip()


def _size(*, optional: bool) -> Parser:
    form = "a size like 600MiB, 24GiB or 1073741824" + (" (or none for no limit)" if optional else "")

    def parse(v: Any, o: _Origin) -> int | None:
        if optional and (v is None or (isinstance(v, str) and v.strip().lower() in {"none", "off"})):
            return None
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise _Bad(form)
        if isinstance(v, int) and v < 0:
            raise _Bad(form + "; it must not be negative")
        try:
            return parse_size(v)
        except SizeError:
            raise _Bad(form) from None

    return parse


def _positive_size(v: Any, o: _Origin) -> int:
    n = _size(optional=False)(v, o)
    if n == 0:
        raise _Bad("a size > 0, like 16MiB")
    return n


def _str_list(item: Parser = _text, form: str = "a list of non-empty strings") -> Parser:
    def parse(v: Any, o: _Origin) -> tuple[Any, ...]:
        if isinstance(v, str) or not isinstance(v, (list, tuple)):
            raise _Bad(form)
        out = []
        for i, x in enumerate(v):
            try:
                out.append(item(x, o))
            except _Bad as e:
                raise _Bad(f"{form}; item {i} ({x!r}) should be {e}") from None
        return tuple(out)

    return parse


def _args(v: Any, o: _Origin) -> tuple[str, ...]:
    if isinstance(v, str) or not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise _Bad('a list of strings, one argument each, e.g. ["--threads", "8"]')
    return tuple(v)


def _secret(v: Any, o: _Origin) -> str:
    if not isinstance(v, str) or not v or any(c.isspace() for c in v):
        raise _Bad("a non-empty key without whitespace")
    return v


def _origin_url(v: Any, o: _Origin) -> str:
    if not isinstance(v, str) or not (v == "*" or re.fullmatch(r"https?://[^/\s]+", v)):
        raise _Bad('"*" or an origin like http://localhost:3000 (scheme://host[:port], no path)')
    return v


def _path(v: Any, o: _Origin) -> Path:
    if not isinstance(v, (str, os.PathLike)) or not str(v).strip():
        raise _Bad("a path")
    p = Path(str(v).strip()).expanduser()
    if not p.is_absolute():
        p = (o.base or Path.cwd()) / p
    return p


def _optional_path(v: Any, o: _Origin) -> Path | None:
    return None if v is None else _path(v, o)


def _store_url(v: Any, o: _Origin) -> str:
    form = "a URL like sqlite:////abs/path/fitevict.db or postgresql://user@host/db"
    if not isinstance(v, str) or "://" not in v:
        raise _Bad(form)
    scheme = v.split("://", 1)[0].split("+", 1)[0].lower()
    if scheme not in STORE_SCHEMES:
        raise _Bad(form)
    return v


def _request_defaults(v: Any, o: _Origin) -> Mapping[str, Any]:
    form = "a table of request fields, e.g. { temperature = 0.7, top_p = 0.9 }"
    if not isinstance(v, Mapping):
        raise _Bad(form)
    if "model" in v:
        raise _Bad(form + "; 'model' cannot have a default")
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        raise _Bad(form + " holding only JSON values (no dates or times)") from None
    return MappingProxyType(dict(v))


_KEY_RE = re.compile(r"[^\s/\\]+")


def _alias(v: Any, o: _Origin) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"\S+", v):
        raise _Bad("a non-empty name without whitespace")
    return v


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
    _Key("policy.idle_unload_seconds", _seconds(positive=False), env="FITEVICT_IDLE_UNLOAD_SECONDS"),
    _Key("policy.max_queue", _int(1)),
    _Key("policy.queue_timeout_seconds", _seconds(positive=True)),
    _Key("policy.exclusive_fraction", _fraction),
    _Key("policy.default_alloc_mode", _choice(ALLOC_MODES)),
    _Key("policy.eviction", _choice(EVICTION_POLICIES), env="FITEVICT_EVICTION"),
    _Key("policy.max_turn_seconds", _seconds(positive=True)),
    _Key("policy.max_wait_seconds", _seconds(positive=True)),
    _Key("policy.min_residency_seconds", _seconds(positive=False)),
    _Key("policy.engine_queue_depth", _int(0)),
    _Key("policy.shutdown_grace_seconds", _seconds(positive=False)),
)
_BY_KEY: dict[str, _Key] = {k.key: k for k in _KEYS}
_SECTIONS = ("server", "engine", "budget", "policy")
_TOP_LEVEL = ("server", "engine", "budget", "policy", "models", "models_dirs", "data_dir", "store_url")

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
}

#: FITEVICT_* variables read elsewhere, which are not config keys.
OTHER_ENV: tuple[str, ...] = ("FITEVICT_CONFIG", "FITEVICT_CACHE_DIR")


def config_keys() -> tuple[str, ...]:
    """Every dotted key a config file may set, model keys as ``models.<key>.<field>``."""
    return tuple(k.key for k in _KEYS if k.in_file) + tuple(f"models.<key>.{f}" for f in _MODEL_FIELDS)


def env_variables() -> dict[str, str]:
    """``{FITEVICT_VAR: dotted key}`` for every variable that sets a key."""
    return {k.env: k.key for k in _KEYS if k.env}


# ----------------------------------------------------------------------------- loading


def default_config_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/fitevict/config.toml``, else ``~/.config/fitevict/config.toml``."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "fitevict" / "config.toml"


def _did_you_mean(word: str, options: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, list(options), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else f"; known keys: {', '.join(options)}"


def _read_toml(path: Path, how: str) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} ({how}) does not exist; create it or point at another") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} ({how}) is a directory; name the TOML file") from None
    except PermissionError as e:
        raise ConfigError(f"config file {path} ({how}) cannot be read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None


_Raw = dict[str, tuple[Any, _Origin]]  # dotted key -> (raw value, origin)


def _flatten_file(data: dict[str, Any], origin: _Origin, raw: _Raw, models: dict[str, _Raw]) -> None:
    """Check a parsed TOML document's keys and record its values by dotted key."""
    for top, value in data.items():
        if top not in _TOP_LEVEL:
            raise ConfigError(f"{top}: unknown key in {origin.text}" + _did_you_mean(top, _TOP_LEVEL))
        if top in _SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{top} = {value!r} in {origin.text}: expected a table [{top}]")
            names = [k.key.split(".", 1)[1] for k in _KEYS if k.key.startswith(top + ".") and k.in_file]
            for name, v in value.items():
                if name not in names:
                    raise ConfigError(f"{top}.{name}: unknown key in {origin.text}" + _did_you_mean(name, names))
                raw[f"{top}.{name}"] = (v, origin)
        elif top == "models":
            if not isinstance(value, dict):
                raise ConfigError(f"models = {value!r} in {origin.text}: expected tables [models.<key>]")
            for key, table in value.items():
                if not isinstance(table, dict):
                    raise ConfigError(
                        f"models.{key} = {table!r} in {origin.text}: expected a table [models.{key}] "
                        f'with at least path = "..." or settings for a discovered model'
                    )
                entry = models.setdefault(key, {})
                for name, v in table.items():
                    _check_model_field(key, name, origin)
                    entry[name] = (v, origin)
        else:
            raw[top] = (value, origin)


def _check_model_field(key: str, name: str, origin: _Origin) -> None:
    if name not in _MODEL_FIELDS:
        raise ConfigError(f"models.{key}.{name}: unknown key in {origin.text}" + _did_you_mean(name, tuple(_MODEL_FIELDS)))


def _from_env(env: Mapping[str, str], raw: _Raw) -> list[str]:
    notes = []
    for k in _KEYS:
        if k.env is None or not env.get(k.env, "").strip():
            continue  # unset or empty: not set
        text = env[k.env]
        origin = _Origin(f"environment variable {k.env}", textual=True, base=None)
        value: Any = [p.strip() for p in text.split(k.env_split) if p.strip()] if k.env_split else text.strip()
        raw[k.key] = (value, origin)
    known = set(env_variables()) | set(OTHER_ENV)
    for name in sorted(env):
        if name.startswith("FITEVICT_") and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.7)
            hint = f" (did you mean {close[0]}?)" if close else ""
            notes.append(f"environment variable {name} is not a fitevict setting{hint}; ignored")
    return notes


def _from_overrides(overrides: Mapping[str, object], raw: _Raw, models: dict[str, _Raw]) -> None:
    origin = _Origin("override", textual=True, base=None)
    settable = [k.key for k in _KEYS]
    for dotted, value in overrides.items():
        if dotted.startswith("models.") and dotted.count(".") >= 2:
            key, name = dotted[len("models."):].rsplit(".", 1)
            _check_model_field(key, name, origin)
            models.setdefault(key, {})[name] = (value, origin)
        elif dotted in _BY_KEY:
            raw[dotted] = (value, origin)
        else:
            raise ConfigError(f"{dotted}: unknown key in override" + _did_you_mean(dotted, settable))


def _parse(key: str, value: Any, origin: _Origin, parser: Parser) -> Any:
    try:
        return parser(value, origin)
    except _Bad as e:
        raise ConfigError(f"{key} = {value!r} (from {origin.text}): expected {e}") from None


def _build_model(key: str, raw: _Raw) -> ModelConfig:
    if not _KEY_RE.fullmatch(key):
        origin = next(iter(raw.values()))[1].text if raw else "config"
        raise ConfigError(f"models.{key!r} (from {origin}): a model key must be non-empty, without whitespace or slashes")
    got = {name: _parse(f"models.{key}.{name}", v, o, _MODEL_FIELDS[name]) for name, (v, o) in raw.items()}
    kv = got.pop("kv_cache_type", None)
    got.setdefault("cache_type_k", kv)
    got.setdefault("cache_type_v", kv)
    mode = got.get("alloc_mode")
    if mode == "explicit" and got.get("n_gpu_layers") is None:
        raise ConfigError(
            f"models.{key}.alloc_mode = 'explicit' needs models.{key}.n_gpu_layers "
            "(-1 = all layers, 0 = none, N = the first N)"
        )
    return ModelConfig(key=key, **got)


def _check_aliases(models: Mapping[str, ModelConfig]) -> None:
    owner: dict[str, str] = {}
    for k in models:
        if k.lower() in owner:
            raise ConfigError(f"models.{k}: the same key as {owner[k.lower()][len('the key of '):]} up to case; "
                              "keys match case-insensitively, so rename one")
        owner[k.lower()] = f"the key of models.{k}"
    for key, m in models.items():
        for alias in m.aliases:
            low = alias.lower()
            if low == key.lower():
                continue
            if low in owner:
                raise ConfigError(f"models.{key}.aliases: alias {alias!r} is already {owner[low]}; rename one of them")
            owner[low] = f"an alias of models.{key}"


def load_config(
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Config:
    """Build the configuration: defaults < TOML file < FITEVICT_* variables < overrides.

    The file is ``path`` if given, else ``$FITEVICT_CONFIG``, else ``default_config_path()`` when it exists.
    Raises ``ConfigError`` naming the key, the value, its origin and the allowed form.
    """
    env = os.environ if env is None else env
    raw: _Raw = {}
    models_raw: dict[str, _Raw] = {}
    config_path: Path | None = None
    if path is not None:
        config_path, how = Path(path).expanduser(), "given"
    elif env.get("FITEVICT_CONFIG", "").strip():
        config_path, how = Path(env["FITEVICT_CONFIG"].strip()).expanduser(), "from FITEVICT_CONFIG"
    elif default_config_path(env).is_file():
        config_path, how = default_config_path(env), "the default location"
    if config_path is not None:
        config_path = config_path.absolute()
        data = _read_toml(config_path, how)
        _flatten_file(data, _Origin(f"config file {config_path}", textual=False, base=config_path.parent), raw, models_raw)
    notes = _from_env(env, raw)
    if overrides:
        _from_overrides(overrides, raw, models_raw)

    values = {k: _parse(k, v, o, _BY_KEY[k].parse) for k, (v, o) in raw.items()}

    def section(cls: type, name: str) -> Any:
        prefix = name + "."
        return cls(**{k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)})

    policy: PolicyConfig = section(PolicyConfig, "policy")
    models = {key: _build_model(key, r) for key, r in models_raw.items()}
    _check_aliases(models)
    data_dir: Path = values.get("data_dir") or paths.data_dir()
    store_url = values.get("store_url") or f"sqlite:///{data_dir / 'fitevict.db'}"
    origins = {k: o.text for k, (_, o) in raw.items()}
    for key, r in models_raw.items():
        origins.update({f"models.{key}.{n}": o.text for n, (_, o) in r.items()})
    return Config(
        server=section(ServerConfig, "server"),
        engine=section(EngineConfig, "engine"),
        budget=section(BudgetConfig, "budget"),
        policy=policy,
        models=MappingProxyType(models),
        models_dirs=values.get("models_dirs", ()),
        data_dir=data_dir,
        store_url=store_url,
        config_path=config_path,
        origins=MappingProxyType(origins),
        notes=tuple(notes),
    )
