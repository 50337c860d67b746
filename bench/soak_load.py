"""The soak's workload: one request of every API the front door speaks, streamed or not, and what came of it.

Each request is sent with httpx over a client that keeps its connections alive, and ends as one outcome record:
``ok`` (a 2xx answer, and for a stream the API's own end marker), ``hung-up`` (the client closed a stream after its
first bytes, on purpose), or ``failed`` (its status and the error the door sent, or the transport error). Which
failures an injected fault cut is decided later, by the report, from the fault records' windows."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass

import httpx

CHAT = ("med-a", "med-b", "llama-gqa", "llama-q8_0")  # generative models: the two medium copies cannot share memory
EMBEDDER, RERANKER = "embedder", "bert-rerank"
MSGS = [{"role": "user", "content": "Say something about rivers."}]


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of request: its route, whether it may stream, and the end marker its stream carries."""

    name: str
    path: str
    streams: bool
    end: bytes = b""  # a streamed answer is whole once this was seen


KINDS = (
    Kind("openai-chat", "/v1/chat/completions", True, b"data: [DONE]"),
    Kind("openai-completions", "/v1/completions", True, b"data: [DONE]"),
    Kind("openai-embeddings", "/v1/embeddings", False),
    Kind("openai-responses", "/v1/responses", True, b"response.completed"),
    Kind("anthropic-messages", "/v1/messages", True, b"message_stop"),
    Kind("ollama-chat", "/api/chat", True, b'"done":true'),
    Kind("ollama-generate", "/api/generate", True, b'"done":true'),
    Kind("rerank", "/v1/rerank", False),
    Kind("tokenize", "/tokenize", False),
)
BY_NAME = {k.name: k for k in KINDS}


def body(kind: Kind, model: str, stream: bool, rng: random.Random) -> dict:
    """The request body of ``kind`` for ``model``: a few tokens at most, so the load stays light."""
    n = rng.randint(4, 24)
    if kind.name == "openai-chat":
        return {"model": model, "messages": MSGS, "max_tokens": n, "stream": stream}
    if kind.name == "openai-completions":
        return {"model": model, "prompt": "Once upon a time", "max_tokens": n, "stream": stream}
    if kind.name == "openai-embeddings":
        return {"model": model, "input": ["a river", "a mountain"][: rng.randint(1, 2)]}
    if kind.name == "openai-responses":
        return {"model": model, "input": "Say something.", "max_output_tokens": n, "stream": stream}
    if kind.name == "anthropic-messages":
        return {"model": model, "messages": MSGS, "max_tokens": n, "stream": stream}
    if kind.name in ("ollama-chat", "ollama-generate"):
        extra = {"keep_alive": rng.choice(["30s", "5m", 0, -1])} if rng.random() < 0.2 else {}
        text = {"messages": MSGS} if kind.name == "ollama-chat" else {"prompt": "Once upon a time"}
        return {"model": model, **text, "stream": stream, "options": {"num_predict": n}, **extra}
    if kind.name == "rerank":
        return {"model": model, "query": "a cat", "documents": ["cat", "sky", "car"]}
    return {"model": model, "content": "hello world, rivers and mountains"}


def pick(rng: random.Random, hangup_share: float) -> tuple[Kind, str, bool, bool]:
    """A random request: (kind, model, streamed, hung up by the client after its first bytes)."""
    kind = rng.choice(KINDS)
    model = EMBEDDER if kind.name == "openai-embeddings" else RERANKER if kind.name == "rerank" else rng.choice(CHAT)
    stream = kind.streams and rng.random() < 0.5
    return kind, model, stream, stream and rng.random() < hangup_share


def _error_of(status: int, text: str) -> str:
    """The error a door's answer carries, shortened: its type/code and message."""
    try:
        doc = json.loads(text)
        err = doc.get("error", doc)
        if isinstance(err, dict):
            return f"{status} {err.get('type', '')}/{err.get('code', '')}: {str(err.get('message', ''))[:200]}"
        return f"{status}: {str(err)[:200]}"
    except (ValueError, AttributeError):
        return f"{status}: {text[:200]}"


def _stream_error(buf: bytes) -> str | None:
    """An error event inside a stream (OpenAI's ``data: {"error"``, Anthropic's ``event: error``, Ollama's
    ``{"error"``), or None."""
    for marker in (b'data: {"error"', b"event: error", b'{"error"'):
        i = buf.find(marker)
        if i >= 0:
            return buf[i:i + 300].decode(errors="replace")
    return None


def send(client: httpx.Client, base: str, kind: Kind, model: str, stream: bool, hangup: bool,
         rng: random.Random, rid: str) -> dict:
    """Send one request and return its outcome record (times are unix seconds)."""
    out = {"id": rid, "kind": kind.name, "model": model, "stream": stream, "hangup": hangup, "t0": time.time()}
    headers = {"x-request-id": rid}
    try:
        with client.stream("POST", base + kind.path, json=body(kind, model, stream, rng), headers=headers) as r:
            out["status"] = r.status_code
            if hangup and r.status_code == 200:
                next(r.iter_raw(), b"")
                out.update(outcome="hung-up")  # closing the response here drops the connection mid-stream
                return out
            buf = r.read()
            if r.status_code >= 300:
                out.update(outcome="failed", error=_error_of(r.status_code, buf.decode(errors="replace")))
            elif stream and (err := _stream_error(buf)):
                out.update(outcome="failed", error=f"error event in the stream: {err}")
            elif stream and kind.end not in buf.replace(b'": ', b'":'):
                out.update(outcome="failed", error=f"the stream ended without {kind.end.decode()} "
                                                   f"({len(buf)} bytes: ...{buf[-120:].decode(errors='replace')})")
            else:
                out.update(outcome="ok", bytes=len(buf))
    except httpx.HTTPError as e:
        out.update(outcome="failed", status=out.get("status"), error=f"{type(e).__name__}: {e}"[:300])
    finally:
        out["t1"] = time.time()
    return out
