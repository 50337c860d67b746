"""Loading: defaults < TOML file < FITEVICT_* variables < overrides, into one frozen Config."""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from fitevict import paths
from fitevict.config.records import (BudgetConfig, Config, ConfigError, DevicesConfig, EngineConfig, FairConfig,
                                     LogsConfig, ModelConfig, PolicyConfig, ServerConfig, StoresConfig)
from fitevict.config.schema import MOVED, OTHER_ENV, BY_KEY, KEYS, MODEL_FIELDS, SECTIONS, TOP_LEVEL, env_variables
from fitevict.config.parsers import Parser, BadValue, KEY_RE, Origin


# ----------------------------------------------------------------------------- loading


def default_config_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/fitevict/config.toml``, else ``~/.config/fitevict/config.toml``."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "fitevict" / "config.toml"


def _check_moved(dotted: str, origin: str) -> None:
    """A key that moved is refused with its new name (one name per knob, never two that both work)."""
    if dotted in MOVED:
        raise ConfigError(f"{dotted} (in {origin}) is now {MOVED[dotted]}: rename it there, value unchanged")


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


_Raw = dict[str, tuple[Any, Origin]]  # dotted key -> (raw value, origin)


def _flatten_file(data: dict[str, Any], origin: Origin, raw: _Raw, models: dict[str, _Raw]) -> None:
    """Check a parsed TOML document's keys and record its values by dotted key."""
    for top, value in data.items():
        if top not in TOP_LEVEL:
            raise ConfigError(f"{top}: unknown key in {origin.text}" + _did_you_mean(top, TOP_LEVEL))
        if top in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{top} = {value!r} in {origin.text}: expected a table [{top}]")
            names = [k.key.split(".", 1)[1] for k in KEYS if k.key.startswith(top + ".") and k.in_file]
            for name, v in value.items():
                _check_moved(f"{top}.{name}", origin.text)
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


def _check_model_field(key: str, name: str, origin: Origin) -> None:
    if name not in MODEL_FIELDS:
        raise ConfigError(f"models.{key}.{name}: unknown key in {origin.text}" + _did_you_mean(name, tuple(MODEL_FIELDS)))


def _from_env(env: Mapping[str, str], raw: _Raw) -> list[str]:
    notes = []
    for k in KEYS:
        if k.env is None or not env.get(k.env, "").strip():
            continue  # unset or empty: not set
        text = env[k.env]
        origin = Origin(f"environment variable {k.env}", textual=True, base=None)
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
    origin = Origin("override", textual=True, base=None)
    settable = [k.key for k in KEYS]
    for dotted, value in overrides.items():
        if dotted.startswith("models.") and dotted.count(".") >= 2:
            key, name = dotted[len("models."):].rsplit(".", 1)
            _check_model_field(key, name, origin)
            models.setdefault(key, {})[name] = (value, origin)
        elif dotted in BY_KEY:
            raw[dotted] = (value, origin)
        else:
            _check_moved(dotted, origin.text)
            raise ConfigError(f"{dotted}: unknown key in override" + _did_you_mean(dotted, settable))


def _parse(key: str, value: Any, origin: Origin, parser: Parser) -> Any:
    try:
        return parser(value, origin)
    except BadValue as e:
        raise ConfigError(f"{key} = {value!r} (from {origin.text}): expected {e}") from None


def _build_model(key: str, raw: _Raw) -> ModelConfig:
    if not KEY_RE.fullmatch(key):
        origin = next(iter(raw.values()))[1].text if raw else "config"
        raise ConfigError(f"models.{key!r} (from {origin}): a model key must be non-empty, without whitespace or "
                          "backslashes")
    got = {name: _parse(f"models.{key}.{name}", v, o, MODEL_FIELDS[name]) for name, (v, o) in raw.items()}
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


def _check_fair(fair: FairConfig) -> None:
    """Every class named (the default, each key's own and those it may ask for) is one of ``fair.classes``."""
    names = tuple(fair.classes)
    named = [("fair.default_class", fair.default_class)]
    for k in fair.keys.values():
        named += [(f"fair.keys.{k.name}.class", k.klass)] if k.klass is not None else []
        named += [(f"fair.keys.{k.name}.classes", c) for c in k.classes]
    for where, c in named:
        if c not in names:
            raise ConfigError(f"{where} = {c!r}: not a priority class; fair.classes has {', '.join(names)}"
                              + _did_you_mean(c, names))


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
        _flatten_file(data, Origin(f"config file {config_path}", textual=False, base=config_path.parent), raw, models_raw)
    notes = _from_env(env, raw)
    if overrides:
        _from_overrides(overrides, raw, models_raw)

    values = {k: _parse(k, v, o, BY_KEY[k].parse) for k, (v, o) in raw.items()}

    def section(cls: type, name: str) -> Any:
        prefix = name + "."
        return cls(**{k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)})

    policy: PolicyConfig = section(PolicyConfig, "policy")
    fair: FairConfig = section(FairConfig, "fair")
    _check_fair(fair)
    server: ServerConfig = section(ServerConfig, "server")
    server = replace(server, api_keys=server.api_keys + tuple(k.key for k in fair.keys.values()
                                                              if k.key not in server.api_keys))
    models = {key: _build_model(key, r) for key, r in models_raw.items()}
    _check_aliases(models)
    data_dir: Path = values.get("data_dir") or paths.data_dir()
    store_url = values.get("store_url") or f"sqlite:///{data_dir / 'fitevict.db'}"
    origins = {k: o.text for k, (_, o) in raw.items()}
    for key, r in models_raw.items():
        origins.update({f"models.{key}.{n}": o.text for n, (_, o) in r.items()})
    return Config(
        server=server,
        engine=section(EngineConfig, "engine"),
        budget=section(BudgetConfig, "budget"),
        devices=section(DevicesConfig, "devices"),
        policy=policy,
        fair=fair,
        stores=section(StoresConfig, "stores"),
        logs=section(LogsConfig, "logs"),
        models=MappingProxyType(models),
        models_dirs=values.get("models_dirs", ()),
        aliases=values.get("aliases", MappingProxyType({})),
        data_dir=data_dir,
        store_url=store_url,
        config_path=config_path,
        origins=MappingProxyType(origins),
        notes=tuple(notes),
    )
