"""The per-request load contract: parse it, and say what it fixes on the seat that serves it.

Pure functions of their arguments, but for one ``stat`` (``unservable``: whether a PEFT adapter's base is a
folder). One module for the HTTP front door and the CLI alike: a request's optional ``fitevict`` object
(``{"ctx": 8192, "kv_cache_type": "q8_0", ...}``) is validated here; ``request.ask`` turns it, with the model's
settings, into the ``LoadConfig`` a seat starts with and the ``PlanRequest`` the planner and the scheduler reason
about. The fields a contract names are the ones a resident seat must match (``PlanRequest.fixed``); a request that
names none is served by whatever seat of the model is resident.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from fitevict import planner as pl
from fitevict.request.catalog import CatalogEntry

KV_TYPES = ("f16", "q8_0", "q4_0")
ADAPTER_KINDS = ("lora", "peft")  # a GGUF adapter on llama-server, a PEFT folder on a transformers seat


class ContractError(ValueError):
    """A contract that cannot be honoured as written. ``param`` names the offending key."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Contract:
    """A per-request load contract (the ``fitevict`` object of a request body), already validated."""

    ctx: int | None = None
    kv_cache_type: str | None = None
    flash_attn: bool | None = None
    alloc_mode: str | None = None
    gguf_file: str | None = None
    n_gpu_layers: int | None = None
    n_cpu_moe: int | None = None
    parallel: int | None = None
    keep_alive: float | None = None  # seconds the seat stays after this request (inf: forever, 0: unload after)
    embeddings: bool | None = None  # set by the embeddings routes, never by a request body: needs an --embeddings seat
    lora_scale: float | None = None  # the requested adapter's scale (default 1); other adapters are at 0


INTERNAL_KEYS: tuple[str, ...] = ("embeddings",)  # contract fields a route sets; a request body may not
CONTRACT_KEYS: tuple[str, ...] = tuple(f.name for f in fields(Contract) if f.name not in INTERNAL_KEYS)

# contract key -> the LoadConfig fields it fixes on the seat that serves it
_FIXES: dict[str, tuple[str, ...]] = {
    "ctx": ("n_ctx",), "kv_cache_type": ("cache_type_k", "cache_type_v"), "flash_attn": ("flash_attn",),
    "n_gpu_layers": ("n_gpu_layers",), "n_cpu_moe": ("n_cpu_moe",), "parallel": ("n_parallel",),
    "embeddings": ("embeddings",),
}


def parse_keep_alive(v: Any, name: str) -> float | None:
    """Ollama's keep_alive: seconds (number), a duration ("5m", "1h30m", "90s"), 0 (unload after the
    request) or a negative value (keep it loaded). Returns seconds, ``inf`` for forever."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise ContractError(f"{name}: {v!r} is not a duration; use seconds, \"5m\", 0 or -1", param=name)
    if isinstance(v, (int, float)):
        return float("inf") if v < 0 else float(v)
    if isinstance(v, str):
        text = v.strip()
        units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
        total, num, i = 0.0, "", 0
        neg = text.startswith("-")
        text = text.lstrip("-")
        try:
            if text and text.replace(".", "", 1).isdigit():
                total = float(text)
            else:
                while i < len(text):
                    if text[i].isdigit() or text[i] == ".":
                        num += text[i]
                        i += 1
                        continue
                    unit = "ms" if text[i:i + 2] == "ms" else text[i]
                    if unit not in units or not num:
                        raise ValueError(text)
                    total += float(num) * units[unit]
                    num, i = "", i + len(unit)
                if num or not text:
                    raise ValueError(text)
        except ValueError:
            raise ContractError(f"{name}: {v!r} is not a duration; use seconds, \"5m\", \"1h30m\", 0 or -1",
                                param=name) from None
        return float("inf") if neg else total
    raise ContractError(f"{name}: {v!r} is not a duration; use seconds, \"5m\", 0 or -1", param=name)


def parse_contract(raw: Any, *, alloc_modes: tuple[str, ...] = pl.ALLOC_MODES) -> Contract | None:
    """Validate a request's ``fitevict`` object; unknown keys and values are refused with the allowed ones."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ContractError(f"fitevict: expected an object with keys {', '.join(CONTRACT_KEYS)}, "
                            f"got {type(raw).__name__}", param="fitevict")
    unknown = sorted(set(raw) - set(CONTRACT_KEYS))
    if unknown:
        raise ContractError(f"fitevict: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(CONTRACT_KEYS)}",
                            param=f"fitevict.{unknown[0]}")

    def integer(name: str, lo: int) -> int | None:
        v = raw.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ContractError(f"fitevict.{name}: {v!r} is not an integer >= {lo}", param=f"fitevict.{name}")
        return v

    def choice(name: str, allowed: Sequence[Any], shown: str) -> Any:
        v = raw.get(name)
        if v is not None and (v not in allowed or type(v) is not type(allowed[0])):
            raise ContractError(f"fitevict.{name}: {v!r} is not allowed; allowed: {shown}", param=f"fitevict.{name}")
        return v

    kv = choice("kv_cache_type", KV_TYPES, ", ".join(KV_TYPES))
    fa = choice("flash_attn", (True, False), "true, false")
    mode = choice("alloc_mode", alloc_modes, ", ".join(alloc_modes))
    gf = raw.get("gguf_file")
    if gf is not None and not isinstance(gf, str):
        raise ContractError(f"fitevict.gguf_file: expected a file name, got {gf!r}", param="fitevict.gguf_file")
    if kv is not None and kv != "f16" and fa is False:
        raise ContractError(f"fitevict: a quantized V cache ({kv}) needs flash attention; set flash_attn true "
                            f"or use kv_cache_type f16", param="fitevict.kv_cache_type")
    if kv is not None and kv != "f16" and fa is None:
        fa = True  # a quantized V cache requires it; the plan says so
    scale = raw.get("lora_scale")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 <= scale <= 100):
        raise ContractError(f"fitevict.lora_scale: {scale!r} is not a number from 0 to 100", param="fitevict.lora_scale")
    return Contract(ctx=integer("ctx", 0), kv_cache_type=kv, flash_attn=fa, alloc_mode=mode, gguf_file=gf,
                    n_gpu_layers=integer("n_gpu_layers", -1), n_cpu_moe=integer("n_cpu_moe", 0),
                    parallel=integer("parallel", 1),
                    keep_alive=parse_keep_alive(raw.get("keep_alive"), "fitevict.keep_alive"),
                    lora_scale=float(scale) if scale is not None else None)


def for_embeddings(contract: Contract | None) -> Contract:
    """The contract of an embeddings request: the same, served only by a seat started with --embeddings."""
    return replace(contract or Contract(), embeddings=True)


def fixed_fields(contract: Contract | None) -> frozenset[str]:
    """The LoadConfig fields a resident seat must match to serve this contract."""
    if contract is None:
        return frozenset()
    out: set[str] = set()
    for key, names in _FIXES.items():
        if getattr(contract, key) is not None:
            out.update(names)
    return frozenset(out)


def seat_key(entry: CatalogEntry) -> str:
    """The seat that serves ``entry``: its base's for an adapter (admission is per base), else its own."""
    return entry.base if entry.base is not None else entry.key


def unservable(entry: CatalogEntry, engines: tuple[str, ...]) -> str | None:
    """Why the adapter ``entry`` cannot be served by this fitevict (whose engines are ``engines``), or None."""
    if entry.base is None or entry.kind != "peft":
        return None
    if entry.engine not in engines:
        return (f"model {entry.key!r} is a PEFT adapter of {entry.base!r}; serving it needs the transformers (torch) "
                f"engine, which this fitevict does not have (engines: {', '.join(engines)}); serve {entry.base!r}, "
                "or convert the adapter to GGUF (llama.cpp's convert_lora_to_gguf.py) and put it in the base's "
                "<stem>.adapters/ folder")
    if entry.base_path is not None and not Path(entry.base_path).is_dir():
        return (f"model {entry.key!r} is a PEFT adapter of {entry.base!r}, a GGUF model served by llama-server, which "
                "loads only GGUF adapters: convert it (llama.cpp's convert_lora_to_gguf.py) and put it in the base's "
                "<stem>.adapters/ folder, or serve it on the base's Hugging Face folder")
    return None


def lora_field(seat_loras: tuple[str, ...], requested: str | None, scale: float = 1.0) -> list[dict]:
    """The ``lora`` field of a request to a seat started with ``seat_loras``: every adapter by id (its position),
    ``requested`` (an adapter file) at ``scale``, every other at 0. For the base (``requested`` None) every scale
    is 0 explicitly: the pinned llama-server serves a request without the field, or with an empty list, with
    every adapter applied at its load scale despite ``--lora-init-without-apply``.

    Raises ValueError when the seat did not load ``requested``."""
    if requested is not None and requested not in seat_loras:
        raise ValueError(f"adapter {requested} is not loaded on this seat (it has {len(seat_loras)}: "
                         f"{', '.join(Path(p).name for p in seat_loras) or 'none'}); the seat restarts with the new set")
    return [{"id": i, "scale": scale if p == requested else 0.0} for i, p in enumerate(seat_loras)]


def with_lora(body: dict, seat_loras: tuple[str, ...], entry: CatalogEntry, contract: Contract | None) -> dict:
    """``body`` with the ``lora`` field for ``entry`` on a seat with ``seat_loras`` (a client's own ``lora`` is
    replaced: ids are the seat's); unchanged when the seat has no adapters. Both engine families read it: a
    transformers seat makes the one adapter with a non-zero scale active, or runs the base with all at 0."""
    if not seat_loras:
        return body
    scale = contract.lora_scale if contract is not None and contract.lora_scale is not None else 1.0
    requested = str(entry.path) if entry.kind in ADAPTER_KINDS else None
    return {**body, "lora": lora_field(seat_loras, requested, scale)}
