"""llama-server's memory flags that map one to one onto a LoadConfig field: one table for both directions.

The seat's argv builder (``engines/llama_cpp/server.load_args``) writes these flags from a LoadConfig, and the command
line reader (``pricing/cmdline.parse_server_argv``) reads them back, both from this table, so a spelling, an alias
or an allowed value is written once. Flags whose meaning depends on others (``-np`` with ``-kvu``, ``-ngl`` with
``-dev``, the tensor overrides and their order, ``--lora``, ``--embeddings`` with its pooling, ``-lm``) stay with
the builder and the reader, beside this table. A round-trip property test (config -> argv -> config) holds the two
together. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fitevict.config.records import FLASH_ATTN
from fitevict.pricing.gguf import PricingError
from fitevict.pricing.loadconfig import CACHE_TYPES, LoadConfig

FLASH_ATTN_VALUES: tuple[str, ...] = FLASH_ATTN  # on, off, auto: the config's one list (LoadConfig's type agrees)


def _int(flag: str, v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise PricingError(f"{flag} {v!r} is not a whole number") from None


def _choice(allowed: tuple[str, ...], what: str) -> Callable[[str, str], str]:
    def parse(flag: str, v: str) -> str:
        v = v.lower()
        if v not in allowed:
            raise PricingError(f"{flag} {v!r} is not {what}; allowed: {', '.join(allowed)}")
        return v
    return parse


@dataclass(frozen=True, slots=True)
class ValueFlag:
    """A flag with a value: its spellings (the first is written), the field it sets, and how its value reads."""

    names: tuple[str, ...]
    field: str
    parse: Callable[[str, str], object]


@dataclass(frozen=True, slots=True)
class Switch:
    """A flag without a value that sets a boolean field to ``value`` (absent: the field's default)."""

    names: tuple[str, ...]
    field: str
    value: bool


VALUE_FLAGS: tuple[ValueFlag, ...] = (
    ValueFlag(("-ctk", "--cache-type-k"), "cache_type_k", _choice(CACHE_TYPES, "a cache type")),
    ValueFlag(("-ctv", "--cache-type-v"), "cache_type_v", _choice(CACHE_TYPES, "a cache type")),
    ValueFlag(("-fa", "--flash-attn"), "flash_attn", _choice(FLASH_ATTN_VALUES, "a flash-attention mode")),
    ValueFlag(("-b", "--batch-size"), "n_batch", _int),
    ValueFlag(("-ub", "--ubatch-size"), "n_ubatch", _int),
)
SWITCHES: tuple[Switch, ...] = (
    Switch(("--swa-full",), "swa_full", True),
    Switch(("-nr", "--no-repack"), "repack", False),
)
_BY_NAME: dict[str, ValueFlag | Switch] = {n: f for f in (*VALUE_FLAGS, *SWITCHES) for n in f.names}


def flag(name: str) -> ValueFlag | Switch | None:
    """The table's entry for a spelling, or None."""
    return _BY_NAME.get(name)


def value_args(cfg: LoadConfig) -> list[str]:
    """The value flags, written in the table's order with their first spelling."""
    return [x for f in VALUE_FLAGS for x in (f.names[0], str(getattr(cfg, f.field)))]


def switch_args(cfg: LoadConfig) -> list[str]:
    """The switches whose field differs from its default."""
    default = LoadConfig()
    return [s.names[0] for s in SWITCHES
            if getattr(cfg, s.field) == s.value and getattr(default, s.field) != s.value]
