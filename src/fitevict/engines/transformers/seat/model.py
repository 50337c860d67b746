"""Loading a transformers model or diffusers pipeline into the seat, and running it (chat, completions, embeddings).

Placement follows the priced plan: ``cpu``; one GPU (``CUDA0`` -> ``{"": 0}``); or ``split``, the module-group map
that pricing computed (hf_price.place_groups), passed to ``from_pretrained`` as an explicit ``device_map`` so the
load puts each group where it was priced.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from fitevict.engines.transformers.seat import STARTED_LINE, STOPPED_LINE
from fitevict.engines.transformers.seat.adapters import Activation, Switch, choice
from fitevict.pricing.footprint import HOST
from fitevict.pricing.hf_price import HfLoadConfig, place_groups, plan_weights
from fitevict.pricing.safetensors import load_hf_structure


class LoadFailed(RuntimeError):
    """The model did not load as a model (no weights from the files, a pipeline without weighted components)."""


def _torch_device(name: str) -> str | int:
    return "cpu" if name == HOST else int(name.removeprefix("CUDA"))


def device_map(path: Path, cfg: HfLoadConfig) -> str | dict | None:
    """The ``device_map`` from_pretrained gets for ``cfg`` (None: transformers' default CPU load, which mmaps)."""
    if cfg.device_map == "cpu":
        return "cpu" if cfg.quant != "none" else None
    if cfg.device_map != "split":
        return {"": _torch_device(cfg.device_map)}
    s = load_hf_structure(path)
    groups = place_groups(plan_weights(s, cfg), cfg)
    out = {g: _torch_device(d) for g, d in groups}
    first = next(iter(out.values()), "cpu")
    prefix = next((g.rsplit(".layers.", 1)[0] for g in out if ".layers." in g), "model")
    out.setdefault(f"{prefix}.rotary_emb", first)
    if s.config.get("tie_word_embeddings"):
        embed = next((d for g, d in out.items() if "embed" in g), first)
        out.setdefault("lm_head", embed)
    return out


def _dtype_arg(cfg: HfLoadConfig) -> dict:
    return {} if cfg.dtype == "auto" else {"dtype": getattr(torch, cfg.dtype)}


def _quant_arg(cfg: HfLoadConfig) -> dict:
    if cfg.quant == "none":
        return {}
    from transformers import BitsAndBytesConfig

    if cfg.quant == "bnb8":
        return {"quantization_config": BitsAndBytesConfig(load_in_8bit=True)}
    return {"quantization_config": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                      bnb_4bit_use_double_quant=cfg.bnb4_double_quant)}


@dataclass
class Loaded:
    obj: object  # the model, or the diffusers pipeline
    tokenizer: object | None
    kind: str  # "causal-lm" | "diffusers"
    missing_from_files: tuple[str, ...]
    load_seconds: float


def prepare(path: Path, cfg: HfLoadConfig) -> None:
    """Import everything the load will import (the libraries, the model's or pipeline's own classes, bitsandbytes
    and its integration), so the memory measured before the load is the seat's overhead and not the model's."""
    import importlib
    import json

    if (path / "model_index.json").is_file():
        index = json.loads((path / "model_index.json").read_text())
        import diffusers

        getattr(diffusers, str(index.get("_class_name", "DiffusionPipeline")), None)
        for spec in index.values():
            if isinstance(spec, list) and len(spec) == 2 and spec[0]:
                getattr(importlib.import_module(str(spec[0])), str(spec[1]), None)
        return
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(str(path)))]
    if cfg.adapters:
        import peft  # noqa: F401
        from peft.tuners import lora  # noqa: F401
    if cfg.quant != "none":
        import bitsandbytes  # noqa: F401
        import transformers.integrations.bitsandbytes  # noqa: F401
        from transformers.quantizers import auto  # noqa: F401


def load(path: Path, cfg: HfLoadConfig) -> Loaded:
    t0 = time.monotonic()
    if (path / "model_index.json").is_file():
        from diffusers import DiffusionPipeline

        pipe = DiffusionPipeline.from_pretrained(str(path), **({} if cfg.dtype == "auto" else
                                                               {"dtype": getattr(torch, cfg.dtype)}))
        if cfg.device_map not in ("cpu", "split"):
            pipe.to(f"cuda:{_torch_device(cfg.device_map)}")
        return Loaded(pipe, None, "diffusers", (), time.monotonic() - t0)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dm = device_map(path, cfg)
    model, info = AutoModelForCausalLM.from_pretrained(
        str(path), output_loading_info=True, **_dtype_arg(cfg), **_quant_arg(cfg),
        **({"device_map": dm} if dm is not None else {}))
    model.eval()
    tok = AutoTokenizer.from_pretrained(str(path))
    return Loaded(model, tok, "causal-lm", tuple(sorted(info.get("missing_keys", ()))), time.monotonic() - t0)


def first_device(model: object) -> torch.device:
    return next(model.parameters()).device  # type: ignore[attr-defined]


class _Timed:
    """A streamer front: records when the prompt was consumed and when each token came, feeding ``inner``."""

    def __init__(self, inner: object | None) -> None:
        self.inner = inner
        self.t_first: float | None = None
        self.n_new = 0
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
        else:
            if self.t_first is None:
                self.t_first = time.monotonic()
            self.n_new += int(value.numel())
        if self.inner is not None:
            self.inner.put(value)  # type: ignore[attr-defined]

    def end(self) -> None:
        if self.inner is not None:
            self.inner.end()  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class Timings:
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float

    def to_json(self) -> dict:
        return {"prompt_n": self.prompt_n, "prompt_ms": round(self.prompt_ms, 3),
                "prompt_per_second": round(self.prompt_n / self.prompt_ms * 1000, 2) if self.prompt_ms else None,
                "predicted_n": self.predicted_n, "predicted_ms": round(self.predicted_ms, 3),
                "predicted_per_second": (round(self.predicted_n / self.predicted_ms * 1000, 2)
                                         if self.predicted_ms else None)}


def _gen_kwargs(body: dict) -> dict:
    temp = float(body.get("temperature") if body.get("temperature") is not None else 0.0)
    kw: dict = {"max_new_tokens": int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)}
    if body.get("ignore_eos"):  # as llama-server: generate max_tokens whatever the model says
        kw["min_new_tokens"] = kw["max_new_tokens"]
    if temp > 0:
        kw.update(do_sample=True, temperature=temp, top_p=float(body.get("top_p") or 1.0))
    else:
        kw.update(do_sample=False)
    return kw


class Cut(Exception):
    """A generation stopped between two tokens (its client hung up, or the seat began to stop): its answer is
    incomplete, and is never sent as a whole one."""


def _stop_on(gone: Callable[[], str | None] | None, stop: threading.Event, why: list[str]) -> list:
    """transformers stopping criteria that end a generation between two tokens once ``stop`` is set or ``gone``
    says why it should end (its client closed its connection, the seat is stopping): a hung-up request stops using
    the seat, as llama-server's does; ``why`` gets the words."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _Gone(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.Tensor:
            if not stop.is_set() and gone is not None and (reason := gone()):
                why.append(reason)
                stop.set()
            return torch.full((input_ids.shape[0],), stop.is_set(), dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([_Gone()])


def _started(n_prompt: int) -> None:
    print(f"{STARTED_LINE}{n_prompt} prompt token(s)", file=sys.stderr, flush=True)


def _stopped(stop: threading.Event, why: list[str], n_new: int) -> str | None:
    """The words for a generation that ``stop`` ended early (said in the seat's log), or None."""
    if not stop.is_set():
        return None
    words = f"{why[0] if why else 'stopped'} after {n_new} token(s)"
    print(STOPPED_LINE + words, file=sys.stderr, flush=True)
    return words


class Runner:
    """Text routes over one loaded causal LM; one request runs at a time (KV for one sequence, as priced), with
    the adapter its ``lora`` field chooses active (adapters.Switch) when the seat holds PEFT adapters."""

    def __init__(self, loaded: Loaded, adapter_names: tuple[str, ...] = ()) -> None:
        self.model = loaded.obj
        self.tok = loaded.tokenizer
        self.lock = threading.Lock()
        self.switch = Switch(self.model, adapter_names) if adapter_names else None

    def _adapter(self, body: dict) -> AbstractContextManager[Activation | None]:
        """Under the lock: the request's adapter made active for the block (nothing to do on a seat without)."""
        if self.switch is None:
            if choice(body, ()) is not None:
                raise ValueError("lora: this seat holds no adapters")
            return nullcontext(None)
        return self.switch.use(choice(body, self.switch.names))

    def chat_prompt(self, messages: list[dict]) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)  # type: ignore

    def _encode(self, text: str, special: bool) -> dict:
        enc = self.tok(text, return_tensors="pt", add_special_tokens=special)  # type: ignore[misc]
        dev = first_device(self.model)
        return {k: v.to(dev) for k, v in enc.items()}

    def generate(self, text: str, body: dict, *, special: bool, gone: Callable[[], str | None] | None = None
                 ) -> tuple[str, Timings, str, Activation | None]:
        """(text, timings, finish_reason, the adapter's activation) for one prompt; ``gone``: why it should end
        now, or None (checked between tokens: the generation then stops and ``Cut`` is raised)."""
        enc = self._encode(text, special)
        n_prompt = int(enc["input_ids"].shape[1])
        kw = _gen_kwargs(body)
        stop, why = threading.Event(), []
        with self.lock, self._adapter(body) as act, torch.inference_mode():
            if body.get("seed") is not None:
                torch.manual_seed(int(body["seed"]))
            timed = _Timed(None)
            _started(n_prompt)
            t0 = time.monotonic()
            out = self.model.generate(**enc, **kw, streamer=timed, pad_token_id=self.tok.pad_token_id,  # type: ignore
                                      stopping_criteria=_stop_on(gone, stop, why))
            t1 = time.monotonic()
            if cut := _stopped(stop, why, timed.n_new):
                raise Cut(cut)
        new = out[0, n_prompt:]
        first = timed.t_first or t1
        finish = "length" if len(new) >= kw["max_new_tokens"] else "stop"
        return (self.tok.decode(new, skip_special_tokens=True),  # type: ignore[attr-defined]
                Timings(n_prompt, (first - t0) * 1000, len(new), (t1 - first) * 1000), finish, act)

    def stream(self, text: str, body: dict, *, special: bool, gone: Callable[[], str | None] | None = None
               ) -> Iterator[Activation | None | str | Timings]:
        """The adapter's activation first (None on a seat without adapters), once the lock is held and the
        adapter is active; then text pieces as they are generated; then the Timings. Closing the iterator early
        (the client hung up: writing to it failed) or ``gone`` stops the generation before the lock is let go; after
        a stop by ``gone``, ``Cut`` is raised instead of the Timings."""
        from transformers import TextIteratorStreamer

        enc = self._encode(text, special)
        n_prompt = int(enc["input_ids"].shape[1])
        kw = _gen_kwargs(body)
        streamer = TextIteratorStreamer(self.tok, skip_prompt=True, skip_special_tokens=True)  # type: ignore
        timed = _Timed(streamer)
        errors: list[BaseException] = []
        stop, why = threading.Event(), []

        def run() -> None:
            try:
                with torch.inference_mode():
                    self.model.generate(**enc, **kw, streamer=timed, pad_token_id=self.tok.pad_token_id,  # type: ignore
                                        stopping_criteria=_stop_on(gone, stop, why))
            except BaseException as e:  # noqa: BLE001 - handed to the reader below, which raises it
                errors.append(e)
                streamer.end()

        with self.lock, self._adapter(body) as act:
            yield act
            if body.get("seed") is not None:
                torch.manual_seed(int(body["seed"]))
            _started(n_prompt)
            t0 = time.monotonic()
            th = threading.Thread(target=run, name="generate", daemon=True)
            th.start()
            read_all = False
            try:
                for piece in streamer:
                    if piece:
                        yield piece
                read_all = True
            finally:  # also when the reader stops early: the generation ends before the next request may start
                if not read_all and not stop.is_set():
                    why.append("the client hung up (its answer could not be written)")
                    stop.set()
                th.join()
                cut = _stopped(stop, why, timed.n_new)
            t1 = time.monotonic()
        if errors:
            raise errors[0]
        if cut:
            raise Cut(cut)
        first = timed.t_first or t1
        yield Timings(n_prompt, (first - t0) * 1000, timed.n_new, (t1 - first) * 1000)

    def embed(self, texts: list[str], body: dict) -> tuple[list[list[float]], int, Activation | None]:
        """Mean-pooled last hidden states, one vector per text; the tokens read; the adapter's activation."""
        vectors, n = [], 0
        with self.lock, self._adapter(body) as act, torch.inference_mode():
            for t in texts:
                enc = self._encode(t, True)
                n += int(enc["input_ids"].shape[1])
                out = self.model(**enc, output_hidden_states=True)  # type: ignore[operator]
                vectors.append(out.hidden_states[-1][0].float().mean(0).tolist())
        return vectors, n, act
