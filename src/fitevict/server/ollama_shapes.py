"""Ollama's API shapes: an Ollama request becomes an engine request and a load contract; an engine answer
(llama-server's OpenAI-style JSON or stream chunk) becomes Ollama's answer. Pure functions of their arguments, but
for the model files' ``stat`` in the listing (``identity_digest``, ``file_bytes_now``).

Ollama's ``options`` split in two: sampling options go to the engine with each request (``num_predict`` as
``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ...), and ``num_ctx`` is a load
option: it becomes the load contract's ``ctx`` (a seat with another context is replaced). Placement options
(``num_gpu``, ``num_thread``, ``use_mmap``, ...) are the planner's to decide and are ignored (and named in
the ``x-fitevict-ignored-options`` response header). ``keep_alive`` becomes the contract's ``keep_alive``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fitevict.request.contract import Contract, ContractError, parse_contract

# Ollama option -> the engine's request field (llama-server's OpenAI-style routes read these)
SAMPLING: dict[str, str] = {
    "num_predict": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "typical_p": "typical_p", "seed": "seed", "stop": "stop", "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "mirostat": "mirostat", "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta", "num_keep": "n_keep",
}
LOAD = {"num_ctx": "ctx"}  # Ollama option -> load contract key
DONE_REASON = {"stop": "stop", "length": "length", "tool_calls": "stop"}
FOREVER = "9999-12-31T23:59:59Z"  # expires_at of a seat no idle unload is scheduled for (keep_alive -1, pinned)


class OllamaError(ValueError):
    """A request Ollama's API would refuse: HTTP ``status`` and Ollama's one-line message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Translated:
    """An Ollama request, split: what goes to the engine, the load contract, and options not used."""

    body: dict[str, Any]
    contract: Contract | None
    ignored: tuple[str, ...]


def contract_of(req: dict[str, Any]) -> Contract | None:
    """The load contract of an Ollama request: ``options.num_ctx``, ``keep_alive`` and an optional
    ``fitevict`` object (the same keys as in OpenAI requests)."""
    given = req.get("fitevict")
    if given is not None and not isinstance(given, dict):
        raise OllamaError(f"fitevict: expected an object, got {type(given).__name__}")
    raw = dict(given or {})
    options = req.get("options") or {}
    if not isinstance(options, dict):
        raise OllamaError(f"options: expected an object, got {type(options).__name__}")
    for opt, key in LOAD.items():
        if options.get(opt) is not None:
            raw.setdefault(key, options[opt])
    if req.get("keep_alive") is not None:
        raw.setdefault("keep_alive", req["keep_alive"])
    try:
        return parse_contract(raw or None)
    except ContractError as e:
        raise OllamaError(str(e).replace("fitevict.ctx", "options.num_ctx")
                          .replace("fitevict.keep_alive", "keep_alive")) from None


def sampling_of(req: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Engine request fields from ``options`` (and ``format``), and the options left unused."""
    options = req.get("options") or {}
    out: dict[str, Any] = {}
    ignored = []
    for name, value in options.items():
        if name in SAMPLING:
            if name == "num_predict" and isinstance(value, int) and value < 0:
                continue  # -1: until the model stops; -2: until the context is full (the engine's default)
            out[SAMPLING[name]] = value
        elif name not in LOAD and value is not None:
            ignored.append(name)
    fmt = req.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise OllamaError(f"format: {fmt!r} is not allowed; use \"json\" or a JSON schema object")
    return out, tuple(sorted(ignored))


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """Ollama messages as OpenAI chat messages (images as image_url parts, tool-call arguments as JSON text)."""
    if not isinstance(messages, list):
        raise OllamaError("messages: expected a list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise OllamaError(f"messages[{i}]: expected an object with a role and content")
        msg: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("images"):
            msg["content"] = [{"type": "text", "text": msg["content"]},
                              *({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{img}"}}
                                for img in m["images"])]
        if m.get("tool_calls"):
            msg["tool_calls"] = [{"id": f"call_{i}_{j}", "type": "function",
                                  "function": {"name": c["function"]["name"],
                                               "arguments": json.dumps(c["function"].get("arguments") or {})}}
                                 for j, c in enumerate(m["tool_calls"])]
        if m.get("tool_name"):
            msg["name"] = m["tool_name"]
        out.append(msg)
    return out


def chat_request(req: dict[str, Any], stream: bool) -> Translated:
    """POST /api/chat as a request for the engine's /v1/chat/completions."""
    sampling, ignored = sampling_of(req)
    body: dict[str, Any] = {"messages": chat_messages(req.get("messages") or []), "stream": stream, **sampling}
    if req.get("tools"):
        body["tools"] = req["tools"]
    if stream:
        body["stream_options"] = {"include_usage": True}
    return Translated(body, contract_of(req), ignored)


def generate_request(req: dict[str, Any], stream: bool) -> tuple[str, Translated]:
    """POST /api/generate as an engine request: the prompt through the model's chat template
    (/v1/chat/completions, with ``system``), or as given with ``raw`` (/v1/completions)."""
    sampling, ignored = sampling_of(req)
    prompt = req.get("prompt") or ""
    if not isinstance(prompt, str):
        raise OllamaError("prompt: expected a string")
    extra: dict[str, Any] = {"stream": stream, **sampling}
    if stream:
        extra["stream_options"] = {"include_usage": True}
    if req.get("raw"):
        return "/v1/completions", Translated({"prompt": prompt, **extra}, contract_of(req), ignored)
    msgs = chat_messages([{"role": "system", "content": req["system"]}] if req.get("system") else [])
    msgs.append({"role": "user", "content": prompt})
    if req.get("images"):
        msgs[-1] = chat_messages([{"role": "user", "content": prompt, "images": req["images"]}])[0]
    return "/v1/chat/completions", Translated({"messages": msgs, **extra}, contract_of(req), ignored)


def embed_inputs(req: dict[str, Any], *, legacy: bool) -> list[str]:
    """The texts of POST /api/embed (``input``: a string or a list) or /api/embeddings (``prompt``)."""
    v = req.get("prompt") if legacy else req.get("input")
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(x, str) for x in v) and v:
        return v
    name = "prompt" if legacy else "input"
    raise OllamaError(f"{name}: expected a string{'' if legacy else ' or a non-empty list of strings'}")


# -- answers ---------------------------------------------------------------------------------------


def ns(seconds: float | None) -> int:
    return int(round((seconds or 0.0) * 1e9))


def iso(t: float | None) -> str:
    if t is None or math.isinf(t):
        return FOREVER
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def text_of(chunk: dict[str, Any]) -> str:
    """The text one engine answer or stream chunk carries (chat delta/message, or completion text)."""
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    part = c.get("delta") or c.get("message") or {}
    return part.get("content") or c.get("text") or ""


def tool_calls_of(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    choices = chunk.get("choices") or []
    part = (choices[0].get("message") or choices[0].get("delta") or {}) if choices else {}
    out = []
    for c in part.get("tool_calls") or []:
        fn = c.get("function") or {}
        args = fn.get("arguments")
        try:
            parsed = json.loads(args) if isinstance(args, str) else (args or {})
        except ValueError:
            parsed = {"_raw": args}  # the model wrote arguments that are not JSON: handed on as written
        out.append({"function": {"name": fn.get("name"), "arguments": parsed}})
    return out


def finish_of(chunk: dict[str, Any]) -> str | None:
    choices = chunk.get("choices") or []
    return choices[0].get("finish_reason") if choices else None


def done_fields(*, finish: str | None, usage: dict | None, timings: dict | None, total_s: float,
                load_s: float) -> dict[str, Any]:
    """Ollama's closing fields: why it stopped, token counts and durations (ns) from the engine's timings."""
    usage, timings = usage or {}, timings or {}
    return {
        "done": True, "done_reason": DONE_REASON.get(finish or "stop", finish or "stop"),
        "total_duration": ns(total_s), "load_duration": ns(load_s),
        "prompt_eval_count": usage.get("prompt_tokens", timings.get("prompt_n", 0)),
        "prompt_eval_duration": ns((timings.get("prompt_ms") or 0.0) / 1000),
        "eval_count": usage.get("completion_tokens", timings.get("predicted_n", 0)),
        "eval_duration": ns((timings.get("predicted_ms") or 0.0) / 1000),
    }


def message(text: str, tool_calls: list | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        m["tool_calls"] = tool_calls
    return m


# -- models ----------------------------------------------------------------------------------------


def identity_digest(path: Path) -> str:
    """A stable digest of the model file's identity (path, size, mtime): not a hash of its bytes, which
    would mean reading gigabytes on every listing; it changes whenever the file does."""
    try:
        st = path.stat()
        ident = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    except OSError as e:
        ident = f"{path}:unreadable:{e.errno}"
    return hashlib.sha256(ident.encode()).hexdigest()


def file_bytes_now(files: tuple[Path, ...]) -> tuple[int | None, str]:
    """The bytes of a model's weight ``files`` as they are on disk now, and the figure's source: a file replaced,
    truncated or still growing since the catalog was scanned shows at once. (None, "unavailable, because ...") when
    one cannot be read."""
    try:
        return sum(p.stat().st_size for p in files), "file-size"
    except OSError as e:
        return None, f"unavailable, because {e.filename}: {e.strerror}"


def details_of(structure: Any, kind: str) -> dict[str, Any]:
    """Ollama's model ``details`` from a GGUF structure (``None``: not a GGUF, or unreadable)."""
    if structure is None:
        return {"format": "safetensors" if kind == "hf" else kind, "family": None, "families": None,
                "parameter_size": None, "quantization_level": None}
    return {"format": "gguf", "family": structure.arch, "families": [structure.arch],
            "parameter_size": parameter_size(parameter_count(structure)),
            "quantization_level": structure.dominant_type()}


def parameter_count(structure: Any) -> int:
    return sum(math.prod(t.shape) for t in structure.tensors)


def parameter_size(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}".replace(".0" + unit, unit)
    return str(n)


def model_info(structure: Any) -> dict[str, Any]:
    if structure is None:
        return {}
    a = structure.arch
    return {"general.architecture": a, "general.parameter_count": parameter_count(structure),
            f"{a}.context_length": structure.n_ctx_train, f"{a}.embedding_length": structure.n_embd,
            f"{a}.block_count": structure.n_layer, f"{a}.vocab_size": structure.n_vocab}


def ps_entry(view: dict[str, Any], details: dict[str, Any], digest: str) -> dict[str, Any]:
    """One resident as /api/ps shows it: ``size`` is every device's bytes, ``size_vram`` the GPUs'; each
    measured where the seat was measured, else predicted (the ``fitevict`` object names the source)."""
    size, vram, sources = 0, 0, {}
    for dev, d in view["devices"].items():
        measured = d["measured_bytes"] is not None
        n = d["measured_bytes"] if measured else d["predicted_bytes"]
        size += n
        if dev != "CPU":
            vram += n
        sources[dev] = d["measured_source"] if measured else f"predicted: {d['predicted_source']}"
    return {"name": view["key"], "model": view["key"], "size": size, "size_vram": vram, "digest": digest,
            "details": details, "expires_at": iso(view["unload_at"]), "context_length": view["ctx"],
            "fitevict": {"state": view["state"], "phase": view["phase"], "in_flight": view["in_flight"],
                         "sources": sources, "devices": view["devices"]}}
