"""The cluster front door's ASGI plumbing: reading a body, answering JSON, text or an error in OpenAI's (or
Ollama's) shape."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from fitevict.server.errors import OPENAI, ApiError
from fitevict.server.routes import ROUTES

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def query(scope: Scope) -> dict[str, str]:
    return dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))


async def read_body(receive: Receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ApiError(499, "client disconnected")
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes (server.max_body_bytes)", code="body_too_large")
        chunks.append(chunk)
        if not msg.get("more_body"):
            return b"".join(chunks)


async def send_bytes(send: Send, status: int, content_type: str, body: bytes,
                     headers: dict[str, str] | None = None) -> None:
    head = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
            *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items())]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
    await send_bytes(send, status, "application/json", json.dumps(doc).encode(), headers)


async def send_error(e: ApiError, path: str, scope: Scope, receive: Receive, send: Send) -> None:
    if path.startswith("/api/"):  # Ollama's shape
        await send_json(send, e.status, {"error": e.message}, e.headers)
    else:  # the route's API's shape (Anthropic's on its routes), OpenAI's elsewhere
        route = ROUTES.get(path)
        await e.response(route.api if route is not None else OPENAI)(scope, receive, send)
