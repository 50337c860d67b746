"""Value parsers: each checks one form and says what is expected; errors name the key and the origin."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fitevict.units import SizeError, parse_size
from fitevict.config.records import STORE_SCHEMES


# ----------------------------------------------------------------------------- value parsers


class BadValue(Exception):
    """A value of the wrong form; the message says what is expected."""


@dataclass(frozen=True, slots=True)
class Origin:
    text: str  # "config file /x.toml", "environment variable FITEVICT_PORT", "override"
    textual: bool  # the value is a string to be read (env), not a typed TOML value
    base: Path | None  # relative paths are taken from here (the config file's folder); None = cwd


Parser = Callable[[Any, Origin], Any]


def integer(lo: int, hi: int | None = None) -> Parser:
    form = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"

    def parse(v: Any, o: Origin) -> int:
        if isinstance(v, str) and o.textual:
            try:
                v = int(v.strip())
            except ValueError:
                raise BadValue(form) from None
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadValue(form)
        if v < lo or (hi is not None and v > hi):
            raise BadValue(form)
        return v

    return parse


def seconds(*, positive: bool) -> Parser:
    form = "a number of seconds > 0" if positive else "a number of seconds >= 0"

    def parse(v: Any, o: Origin) -> float:
        if isinstance(v, str) and o.textual:
            try:
                v = float(v.strip())
            except ValueError:
                raise BadValue(form) from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise BadValue(form)
        if v < 0 or (positive and v == 0) or v == float("inf"):
            raise BadValue(form)
        return float(v)

    return parse


def days(v: Any, o: Origin) -> float:
    """A number of days >= 0 (0: no bound by age)."""
    try:
        return seconds(positive=False)(v, o)
    except BadValue:
        raise BadValue("a number of days >= 0, e.g. 90 (0: kept for ever)") from None


def integer_or(word: str, lo: int) -> Parser:
    """An integer >= ``lo``, or ``word`` (read as None: the default the word names)."""
    whole = integer(lo)
    form = f"an integer >= {lo}, or \"{word}\""

    def parse(v: Any, o: Origin) -> int | None:
        if v is None or (isinstance(v, str) and v.strip() == word):
            return None
        try:
            return whole(v, o)
        except BadValue:
            raise BadValue(form) from None

    return parse


def fraction(v: Any, o: Origin) -> float:
    form = "a number in (0, 1], e.g. 0.5"
    if isinstance(v, str) and o.textual:
        try:
            v = float(v.strip())
        except ValueError:
            raise BadValue(form) from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise BadValue(form)
    return float(v)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def boolean(v: Any, o: Origin) -> bool:
    if isinstance(v, str) and o.textual and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    if not isinstance(v, bool):
        raise BadValue("true or false")
    return v


def one_of(choices: tuple[str, ...], *, optional: bool = False) -> Parser:
    form = "one of " + ", ".join(choices)

    def parse(v: Any, o: Origin) -> str | None:
        if v is None and optional:
            return None
        if not isinstance(v, str) or v.strip() not in choices:
            raise BadValue(form)
        return v.strip()

    return parse


def nonempty_text(v: Any, o: Origin) -> str:
    if not isinstance(v, str) or not v.strip():
        raise BadValue("a non-empty string")
    return v.strip()


def size(*, optional: bool) -> Parser:
    form = "a size like 600MiB, 24GiB or 1073741824" + (" (or none for no limit)" if optional else "")

    def parse(v: Any, o: Origin) -> int | None:
        if optional and (v is None or (isinstance(v, str) and v.strip().lower() in {"none", "off"})):
            return None
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise BadValue(form)
        if isinstance(v, int) and v < 0:
            raise BadValue(form + "; it must not be negative")
        try:
            return parse_size(v)
        except SizeError:
            raise BadValue(form) from None

    return parse


def size_per_device(*, optional: bool) -> Parser:
    """A size for every device, or sizes per device by the engine's names: a table ``{ Vulkan0 = "1GiB" }`` in a
    file, ``Vulkan0=1GiB,RPC0=2GiB`` in the environment or on a command line."""
    one = size(optional=optional)
    form = 'a size like 2GiB, or sizes per device like { Vulkan0 = "1GiB", RPC0 = "2GiB" } (Vulkan0=1GiB,RPC0=2GiB)'

    def parse(v: Any, o: Origin) -> int | Mapping[str, int] | None:
        if isinstance(v, str) and "=" in v:
            pairs = [item.partition("=") for item in v.split(",") if item.strip()]
            v = {name.strip(): value.strip() for name, _eq, value in pairs}
        if not isinstance(v, Mapping):
            return one(v, o)
        out: dict[str, int] = {}
        for name, value in v.items():
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][\w-]*", name):
                raise BadValue(f"{form}; {name!r} is no device name (the engine's, like CUDA0, Vulkan0, RPC0)")
            try:
                out[name] = size(optional=False)(value, o)
            except BadValue as e:
                raise BadValue(f"{form}; {name} = {value!r} should be {e}") from None
        return MappingProxyType(out)

    return parse


def uma_table(v: Any, o: Origin) -> Mapping[str, bool]:
    """``devices.uma``: device name -> whether its memory is host memory, e.g. ``{ Vulkan0 = true }``."""
    form = "a table of device names to true (its memory is host memory) or false, e.g. { Vulkan0 = true }"
    if isinstance(v, str) and o.textual:
        v = {name.strip(): value.strip() for name, _eq, value in (i.partition("=") for i in v.split(",") if i.strip())}
    if not isinstance(v, Mapping):
        raise BadValue(form)
    out: dict[str, bool] = {}
    for name, value in v.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][\w-]*", name):
            raise BadValue(f"{form}; {name!r} is no device name")
        try:
            out[name] = boolean(value, o)
        except BadValue as e:
            raise BadValue(f"{form}; {name} = {value!r} should be {e}") from None
    return MappingProxyType(out)


def rpc_endpoint(v: Any, o: Origin) -> str:
    """An rpc-server endpoint, ``HOST:PORT`` (what ``llama-server --rpc`` takes)."""
    if not isinstance(v, str) or not re.fullmatch(r"[^\s,:]+:\d{1,5}", v.strip()) or int(v.rsplit(":", 1)[1]) > 65535:
        raise BadValue("an endpoint HOST:PORT, like 127.0.0.1:50052")
    return v.strip()


def positive_size(v: Any, o: Origin) -> int:
    n = size(optional=False)(v, o)
    if n == 0:
        raise BadValue("a size > 0, like 16MiB")
    return n


def str_list(item: Parser = nonempty_text, form: str = "a list of non-empty strings") -> Parser:
    def parse(v: Any, o: Origin) -> tuple[Any, ...]:
        if isinstance(v, str) or not isinstance(v, (list, tuple)):
            raise BadValue(form)
        out = []
        for i, x in enumerate(v):
            try:
                out.append(item(x, o))
            except BadValue as e:
                raise BadValue(f"{form}; item {i} ({x!r}) should be {e}") from None
        return tuple(out)

    return parse


def arg_list(v: Any, o: Origin) -> tuple[str, ...]:
    if isinstance(v, str) or not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise BadValue('a list of strings, one argument each, e.g. ["--threads", "8"]')
    return tuple(v)


def secret(v: Any, o: Origin) -> str:
    if not isinstance(v, str) or not v or any(c.isspace() for c in v):
        raise BadValue("a non-empty key without whitespace")
    return v


def origin_url(v: Any, o: Origin) -> str:
    if not isinstance(v, str) or not (v == "*" or re.fullmatch(r"https?://[^/\s]+", v)):
        raise BadValue('"*" or an origin like http://localhost:3000 (scheme://host[:port], no path)')
    return v


def path_value(v: Any, o: Origin) -> Path:
    if not isinstance(v, (str, os.PathLike)) or not str(v).strip():
        raise BadValue("a path")
    p = Path(str(v).strip()).expanduser()
    if not p.is_absolute():
        p = (o.base or Path.cwd()) / p
    return p


def store_source(v: Any, o: Origin) -> bool | Path:
    """A model store's setting: true (its default location), false (off) or the folder to read."""
    if isinstance(v, str) and o.textual and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    if isinstance(v, bool):
        return v
    try:
        return path_value(v, o)
    except BadValue:
        raise BadValue("true (the store's default location, when it exists), false (off) or a folder path") from None


def store_url(v: Any, o: Origin) -> str:
    form = "a URL like sqlite:////abs/path/fitevict.db or postgresql://user@host/db"
    if not isinstance(v, str) or "://" not in v:
        raise BadValue(form)
    scheme = v.split("://", 1)[0].split("+", 1)[0].lower()
    if scheme not in STORE_SCHEMES:
        raise BadValue(form)
    return v


def request_defaults(v: Any, o: Origin) -> Mapping[str, Any]:
    form = "a table of request fields, e.g. { temperature = 0.7, top_p = 0.9 }"
    if not isinstance(v, Mapping):
        raise BadValue(form)
    if "model" in v:
        raise BadValue(form + "; 'model' cannot have a default")
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        raise BadValue(form + " holding only JSON values (no dates or times)") from None
    return MappingProxyType(dict(v))


KEY_RE = re.compile(r"[^\s\\]+")


def alias(v: Any, o: Origin) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"\S+", v):
        raise BadValue("a non-empty name without whitespace")
    return v


def alias_table(v: Any, o: Origin) -> Mapping[str, str]:
    """``[aliases]``: names clients send (exact, or patterns with ``*``) -> the catalog model that serves them."""
    form = 'a table of names to models, e.g. { "gpt-5" = "llama-gqa", "claude-*" = "qwen" }'
    if not isinstance(v, Mapping):
        raise BadValue(form)
    out: dict[str, str] = {}
    for name, target in v.items():
        if not isinstance(name, str) or not re.fullmatch(r"\S+", name) or name.strip("*") == "":
            raise BadValue(f"{form}; {name!r} is no name: non-empty, without whitespace, not only '*'")
        if not isinstance(target, str) or not re.fullmatch(r"\S+", target) or "*" in target:
            raise BadValue(f"{form}; the model for {name!r} must be one model's name (no '*'), got {target!r}")
        out[name] = target
    return MappingProxyType(out)


def class_table(v: Any, o: Origin) -> Mapping[str, float]:
    """``fair.classes``: priority class names -> weights (> 0); the heavier class goes first."""
    form = 'a table of class names to weights > 0, e.g. { interactive = 4, batch = 1 }'
    if not isinstance(v, Mapping) or not v:
        raise BadValue(form)
    out: dict[str, float] = {}
    for name, w in v.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise BadValue(f"{form}; {name!r} is no class name (letters, digits, _ . -)")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w < float("inf"):
            raise BadValue(f"{form}; the weight of {name!r} is {w!r}")
        out[name] = float(w)
    return MappingProxyType(out)


KEY_FIELDS = ("key", "class", "classes", "weight", "max_in_flight", "max_queue")


def key_table(v: Any, o: Origin) -> Mapping[str, Any]:
    """``[fair.keys.<name>]``: per API key, its secret (``key``), ``class``, the ``classes`` it may ask for above its
    own, its ``weight`` within its class and its caps."""
    from fitevict.config.records import KeyConfig

    form = 'tables [fair.keys.<name>] with key = "...", and optionally class, classes, weight, max_in_flight, max_queue'
    if not isinstance(v, Mapping):
        raise BadValue(form)
    out: dict[str, KeyConfig] = {}
    for name, t in v.items():
        if not isinstance(t, Mapping) or "key" not in t:
            raise BadValue(f"{form}; fair.keys.{name} has no key")
        unknown = [f for f in t if f not in KEY_FIELDS]
        if unknown:
            raise BadValue(f"{form}; fair.keys.{name} has no field {unknown[0]!r} (it has {', '.join(KEY_FIELDS)})")
        try:
            out[name] = KeyConfig(
                name=alias(name, o), key=secret(t["key"], o),
                klass=nonempty_text(t["class"], o) if "class" in t else None,
                classes=str_list()(t.get("classes", []), o),
                weight=_positive(t.get("weight", 1.0)),
                max_in_flight=integer(1)(t["max_in_flight"], o) if "max_in_flight" in t else None,
                max_queue=integer(0)(t["max_queue"], o) if "max_queue" in t else None)
        except BadValue as e:
            raise BadValue(f"{form}; in fair.keys.{name}: {e}") from None
    return MappingProxyType(out)


def _positive(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
        raise BadValue(f"a weight > 0, got {v!r}")
    return float(v)
