"""The transformers engine: an HF load configuration becomes the seat's argv, and the seat's object walk becomes a
measured Footprint.

Each transformers seat is its own process (``python -m fitevict.engines.transformers.seat``), started in its own process
group like a llama-server seat. Its environment sets ``MALLOC_MMAP_THRESHOLD_=65536`` so that freed model memory
goes back to the kernel instead of staying with glibc, and hides CUDA devices from a CPU-only seat.

The seat logs three machine-readable lines (prefixes in fitevict.engines.transformers.seat): its footprint after load,
a failed load's reason, and the leak breaker's teardown report. The same documents are served over HTTP:
``GET /footprint`` and ``POST /unload``. Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from fitevict.engines.base import NO_WEIGHTS, EngineBase, LaunchSpec, Traits
from fitevict.engines.transformers.seat import (EXIT_NO_WEIGHTS, FAILED_LINE, FOOTPRINT_LINE, STOPPING_LINE,
                                                TEARDOWN_LINE, SeatArgs, parse_seat_argv, seat_argv)
from fitevict.pricing.footprint import HOST, DeviceFootprint, Footprint, Term
from fitevict.pricing.hf_price import HfLoadConfig
from fitevict.pricing.peft import PEFT_CONFIG
from fitevict.pricing.loadconfig import LoadConfig

SEAT_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
_PER_REQUEST = "allocated per request (the walk runs at load); priced by formula"
_NO_OUTPUT = "no output buffer at load: the logits are allocated per request; priced by formula"


def hf_config(config: LoadConfig | HfLoadConfig, *, embeddings: bool = False,
              extra_args: Sequence[str] = ()) -> HfLoadConfig:
    """The HF load configuration a seat runs (and is priced) under: a planner's LoadConfig gives the context and
    the device (CPU-only, or all on its first device); a model's ``extra_args`` in the seat's own flags
    (``--dtype bfloat16 --quant bnb4`` ...) override, parsed by the seat's parser."""
    if isinstance(config, HfLoadConfig):
        base = config
    else:  # an HF base's LoadConfig names its PEFT adapters in ``loras`` (the catalog's, in key order)
        base = HfLoadConfig(n_ctx=config.n_ctx, device_map=config.devices[0] if config.devices else "cpu",
                            embeddings=config.embeddings, adapters=config.loras)
    if embeddings and not base.embeddings:
        base = HfLoadConfig(**{**_fields(base), "embeddings": True})
    if not extra_args:
        return base
    return parse_seat_argv([*seat_argv(SeatArgs(Path("."), 0, base, "m")), *extra_args]).cfg


def _fields(c: HfLoadConfig) -> dict:
    return {k: getattr(c, k) for k in c.__dataclass_fields__}


def _device_name(torch_device: str) -> str:
    """torch's "cpu" / "cuda:1" as fitevict's budget names "CPU" / "CUDA1"."""
    if torch_device == "cpu":
        return HOST
    kind, _, idx = torch_device.partition(":")
    return f"{kind.upper()}{idx or 0}"


def _last_json(log_text: str, prefix: str) -> dict | None:
    for line in reversed(log_text.splitlines()):
        if line.startswith(prefix):
            return json.loads(line[len(prefix):])
    return None


def footprint_from_walk(doc: dict) -> Footprint:
    """A measured Footprint from the seat's /footprint document: per device, the model term is the object walk's
    held bytes, its PEFT adapters' apart (the ``adapters`` term); KV and activations are allocated per request, so they are unavailable here (the price has them).
    Host memory is the seat process's whole PSS after load, its own overhead (the pre-load baseline) included."""
    walk = doc["walk"]
    devices = []
    for dev, d in walk["devices"].items():
        if dev == "declared":
            continue
        lora = int(d.get("adapter", 0))  # PEFT adapters' weights: their own term, as priced
        devices.append(DeviceFootprint(_device_name(dev), model=Term(int(d["total"]) - lora, "measured"),
                                       context=Term.unavailable(_PER_REQUEST), compute=Term.unavailable(_PER_REQUEST),
                                       output=Term.unavailable(_NO_OUTPUT),
                                       **({"adapters": Term(lora, "measured")} if doc.get("adapters") else {})))
    if not any(d.name == HOST for d in devices):
        devices.insert(0, DeviceFootprint(HOST, model=Term(0, "measured", "the object walk found no tensor on the host")))
    loaded = doc["process"]["loaded"]
    notes = [f"seat overhead (pre-load baseline): committed {doc['process']['baseline']['committed_bytes']} B, "
             f"mapped {doc['process']['baseline']['mapped_bytes']} B"]
    if walk.get("declared_bytes"):
        notes.append(f"{walk['declared_bytes']} B of weights are on the meta device (offloaded): declared, not held")
    ok = loaded["committed_bytes"] is not None
    return Footprint(devices=tuple(sorted(devices, key=lambda d: d.name != HOST)),
                     host_mapped_bytes=loaded["mapped_bytes"] or 0, host_committed_bytes=loaded["committed_bytes"] or 0,
                     host_source="measured" if ok else "unavailable", notes=tuple(notes))


def adapter_load_seconds(doc: dict | None) -> float | None:
    """Seconds the seat spent loading its PEFT adapters (its own clock, each adapter's load summed), or None when
    it loaded none (or logged no document)."""
    adapters = (doc or {}).get("adapters") or []
    return sum(float(a["load_seconds"]) for a in adapters) if adapters else None


class TransformersEngine(EngineBase):
    name = "transformers"
    pricer = "fitevict.engines.transformers.pricer:PRICER"
    traits = Traits(file_kinds=("hf",), flags_set_price=True, overhead="own-process", adapters="switched",
                    adapter_kinds=("peft",), reports_teardown=True,
                    process_marks=("fitevict.engines.transformers.seat",))

    def __init__(self, python: Path | None = None) -> None:
        self.python = Path(python or sys.executable)

    def launch_spec(self, model_path: Path, config: LoadConfig | HfLoadConfig, port: int, *,
                    extra_args: Sequence[str] = (), embeddings: bool = False, mmproj: Path | None = None,
                    slot_save_path: Path | None = None, test_keep_tensor: str | None = None) -> LaunchSpec:
        """``mmproj`` and ``slot_save_path`` are not this engine's (its traits say so): never set here."""
        cfg = hf_config(config, embeddings=embeddings, extra_args=extra_args)  # priced under the same cfg
        args = SeatArgs(Path(model_path), port, cfg, Path(model_path).name, test_keep_tensor)
        argv = (str(self.python), "-m", "fitevict.engines.transformers.seat", *seat_argv(args))
        env = {**os.environ, **SEAT_ENV}
        notes: list[str] = []
        if not cfg.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""  # RAM-only: no CUDA device may be touched
        if isinstance(config, LoadConfig) and len(config.devices) > 1:
            notes.append(f"devices {','.join(config.devices)}: the seat loads on {config.devices[0]} only; "
                         "give an HfLoadConfig with device_map split and max_memory to spread it")
        return LaunchSpec(argv, env, port, "/health", tuple(notes))

    def measured_footprint(self, log_text: str) -> Footprint | None:
        """The walk the seat logged after its load (None: no footprint line, e.g. the load failed)."""
        doc = _last_json(log_text, FOOTPRINT_LINE)
        return footprint_from_walk(doc) if doc else None

    @classmethod
    def document(cls, log_text: str) -> dict | None:
        """The seat's footprint document as it logged it after load (walk, process baseline), or None."""
        return _last_json(log_text, FOOTPRINT_LINE)

    @classmethod
    def adapter_kind(cls, path: Path) -> str | None:
        """A PEFT adapter folder (its ``adapter_config.json``)."""
        return "peft" if Path(path).is_dir() and PEFT_CONFIG in os.listdir(path) else None

    @classmethod
    def exit_meaning(cls, code: int | None) -> str | None:
        """The seat's exit code for a walk that found no weights (``EXIT_NO_WEIGHTS``)."""
        return NO_WEIGHTS if code == EXIT_NO_WEIGHTS else None

    @classmethod
    def failure(cls, log_text: str) -> str | None:
        """A failed load's reason, as the seat logged it."""
        doc = _last_json(log_text, FAILED_LINE)
        return str(doc["reason"]) if doc else None

    @classmethod
    def teardown(cls, log_text: str) -> dict | None:
        """The leak breaker's report, as the seat logged it on its way out."""
        return _last_json(log_text, TEARDOWN_LINE)

    @classmethod
    def shutting_down(cls, log_text: str) -> str | None:
        """The seat's own line saying why it began its teardown (a SIGTERM or SIGINT received, or /unload asked)."""
        said = [line.strip() for line in log_text.splitlines() if line.startswith(STOPPING_LINE)]
        return said[-1] if said else None

    @classmethod
    def adapter_seconds(cls, log_text: str) -> float | None:
        """The seconds its adapters took to load, by the seat's own footprint document."""
        return adapter_load_seconds(cls.document(log_text))

    @staticmethod
    def fetch_footprint(port: int, timeout: float = 10.0) -> dict:
        from fitevict.engines import loopback

        r = loopback.get(f"http://127.0.0.1:{port}/footprint", timeout)
        r.raise_for_status()
        return r.json()

    @staticmethod
    def unload(port: int, timeout: float = 60.0) -> dict:
        """In-process teardown (del + gc, leak check, malloc_trim, PSS returned); the seat exits after answering."""
        from fitevict.engines import loopback

        r = loopback.post(f"http://127.0.0.1:{port}/unload", timeout)
        r.raise_for_status()
        return r.json()
