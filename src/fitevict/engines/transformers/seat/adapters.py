"""PEFT adapters on the seat's resident base: all loaded at start, one active per request.

The base is wrapped once (``PeftModel.from_pretrained`` for the first adapter, ``load_adapter`` for each other;
peft's own API: transformers 5.24's ``model.set_adapter`` needs peft >= 0.22). A request chooses through the
same ``lora`` field the front door sends a llama-server seat (``[{"id": i, "scale": s}]``, ids indexing the
seat's ``--adapter`` list): the one adapter with a non-zero scale is made active (``set_adapter``, and its
scale set when it differs), or, when every scale is 0 or the field is absent, the request runs on the base with
the adapters disabled (``disable_adapter``). The runner's lock serializes requests, so a generation always runs
with its own adapter active. What the switch cost is measured per request (``Activation``) and answered in the
``x-fitevict-adapter`` response header.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HEADER = "x-fitevict-adapter"


@dataclass(frozen=True, slots=True)
class LoadedAdapter:
    name: str  # the name it was loaded under (the folder's, made a valid module key)
    path: str
    load_seconds: float

    def to_json(self) -> dict:
        return {"name": self.name, "path": self.path, "load_seconds": round(self.load_seconds, 6)}


@dataclass(frozen=True, slots=True)
class Activation:
    """What a request's adapter choice cost on the seat: measured around set_adapter / set_scale / disabling."""

    adapter: str | None  # the active adapter's name; None: the base, adapters disabled
    scale: float | None
    switched: bool  # the seat's state changed for this request (another adapter, scale, or base)
    seconds: float

    def header(self) -> str:
        return json.dumps({"adapter": self.adapter, "scale": self.scale, "switched": self.switched,
                           "activate_seconds": round(self.seconds, 6)}, separators=(",", ":"))


def adapter_names(paths: Sequence[str]) -> tuple[str, ...]:
    """One module-key-safe name per adapter folder (its name; a repeated one gets its position appended)."""
    out: list[str] = []
    for i, p in enumerate(paths):
        name = re.sub(r"[^A-Za-z0-9_]", "_", Path(p).name) or f"adapter{i}"
        out.append(f"{name}_{i}" if name in out else name)
    return tuple(out)


def attach(model: object, paths: Sequence[str]) -> tuple[object, tuple[LoadedAdapter, ...]]:
    """``model`` wrapped with every adapter of ``paths`` (in order), and each adapter's load time."""
    from peft import PeftModel

    loaded: list[LoadedAdapter] = []
    wrapped = model
    for i, (name, path) in enumerate(zip(adapter_names(paths), paths)):
        t0 = time.monotonic()
        try:
            if i == 0:
                wrapped = PeftModel.from_pretrained(model, str(path), adapter_name=name, is_trainable=False)
            else:
                wrapped.load_adapter(str(path), adapter_name=name, is_trainable=False)  # type: ignore[attr-defined]
        except Exception as e:
            raise RuntimeError(f"PEFT adapter {path} does not load on this base: {type(e).__name__}: {e}; remove "
                               "the folder, or fix its base_model_name_or_path to name the base it was trained "
                               "on") from e
        loaded.append(LoadedAdapter(name, str(path), time.monotonic() - t0))
    wrapped.eval()  # type: ignore[attr-defined]
    return wrapped, tuple(loaded)


def choice(body: dict, names: Sequence[str]) -> tuple[str, float] | None:
    """The adapter (name, scale) a request's ``lora`` field asks for; None for the base. ValueError names what is
    wrong (an id the seat does not have, more than one adapter with a non-zero scale)."""
    lora = body.get("lora")
    if lora is None:
        return None
    if not isinstance(lora, list):
        raise ValueError(f"lora: expected a list of {{\"id\": i, \"scale\": s}}, got {type(lora).__name__}")
    picked: list[tuple[str, float]] = []
    for item in lora:
        i, scale = (item.get("id"), item.get("scale", 1.0)) if isinstance(item, dict) else (None, None)
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(names):
            raise ValueError(f"lora: id {i!r} is not an adapter of this seat (it has {len(names)}: "
                             f"{', '.join(names) or 'none'})")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise ValueError(f"lora: scale {scale!r} of id {i} is not a number")
        if scale != 0:
            picked.append((names[i], float(scale)))
    if len(picked) > 1:
        raise ValueError(f"lora: {len(picked)} adapters with a non-zero scale ({', '.join(n for n, _ in picked)}); "
                         "a transformers seat applies one adapter per request")
    return picked[0] if picked else None


class Switch:
    """The seat's adapter state. ``use`` runs only under the runner's lock (one generation at a time)."""

    def __init__(self, model: object, names: Sequence[str]) -> None:
        self.model = model
        self.names = tuple(names)
        self.scales: dict[str, float] = {}
        self.last: tuple[str, float] | None = (self.names[0], 1.0) if self.names else None  # active after load

    @contextmanager
    def use(self, want: tuple[str, float] | None) -> Iterator[Activation]:
        t0 = time.monotonic()
        switched = want != self.last
        if want is None:
            with self.model.disable_adapter():  # type: ignore[attr-defined]
                self.last = None
                yield Activation(None, None, switched, time.monotonic() - t0)
            return
        name, scale = want
        if self.model.active_adapter != name:  # type: ignore[attr-defined]
            self.model.set_adapter(name)  # type: ignore[attr-defined]
        if self.scales.get(name, 1.0) != scale:
            from peft.tuners.lora import LoraLayer

            for m in self.model.modules():  # type: ignore[attr-defined]
                if isinstance(m, LoraLayer):
                    m.set_scale(name, scale)
            self.scales[name] = scale
        self.last = want
        yield Activation(name, scale, switched, time.monotonic() - t0)
