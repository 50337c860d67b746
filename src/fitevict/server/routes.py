"""The one table of the routes the fast path relays to a seat: each loads the model its body names, on demand,
exactly like chat (the same door, admission, scheduling, keep-alive, relay and log line), and the seat's own
llama-server answers on the same path.

A route says what its log line and metrics call it (``endpoint``), which API's error shape it speaks (``api``),
which seat serves it (``seat``: a plain one, an ``--embeddings`` one, or a reranker's) and what its body must hold
before a seat is asked for it (``check``, ``bodies``). docs/api.md has the same table for people.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitevict.server import bodies
from fitevict.server.errors import ANTHROPIC, OPENAI

CHAT, EMBEDDINGS, RERANK = "chat", "embeddings", "rerank"  # the seat a route needs


@dataclass(frozen=True, slots=True)
class Route:
    endpoint: str  # the name in the request log line, the metrics and the docs
    api: str = OPENAI  # the error shape: OPENAI or ANTHROPIC
    seat: str = CHAT
    check: bodies.Check | None = None  # the body's fields the engine would choke on, checked at the door


_RERANK = Route("rerank", seat=RERANK, check=bodies.rerank)

ROUTES: dict[str, Route] = {
    "/v1/chat/completions": Route("chat"),
    "/v1/completions": Route("completions"),
    "/v1/embeddings": Route("embeddings", seat=EMBEDDINGS),
    "/v1/responses": Route("responses", check=bodies.responses),
    "/v1/responses/input_tokens": Route("responses_input_tokens", check=bodies.responses),
    "/v1/messages": Route("messages", api=ANTHROPIC, check=bodies.messages),
    "/v1/messages/count_tokens": Route("messages_count_tokens", api=ANTHROPIC, check=bodies.count_tokens),
    "/v1/chat/completions/input_tokens": Route("chat_input_tokens", check=bodies.chat),
    "/v1/rerank": _RERANK,
    "/rerank": _RERANK,
    "/tokenize": Route("tokenize", check=bodies.tokenize),
    "/detokenize": Route("detokenize", check=bodies.detokenize),
    "/infill": Route("infill", check=bodies.infill),
}
