"""The error shapes fitevict answers in: OpenAI's envelope everywhere, Anthropic's on Anthropic's routes, and an
engine's own error answer put into the route's shape (``engine_error``)."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

OPENAI, ANTHROPIC = "openai", "anthropic"  # the APIs whose error shapes a route speaks

# Anthropic's error types by status (docs.anthropic.com, "Errors"); 529 is its "overloaded" status, which its SDK
# retries with the retry-after header
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                   429: "rate_limit_error", 529: "overloaded_error"}
BUSY_TYPES = ("server_busy", "overloaded_error")  # a full queue: Anthropic's 529
# how the pinned engine's chat parser begins the 500s it answers to a body it cannot read (common/chat.cpp)
REQUEST_FAULTS = ("Failed to parse messages", "Failed to parse tools")
# how the pinned engine begins its refusal of /infill for a model whose vocabulary lacks fill-in-the-middle tokens
# (tools/server/server-context.cpp: "Infill is not supported by this model: prefix token is missing. ...")
NO_FIM = "Infill is not supported by this model"


class ApiError(Exception):
    """An error with an HTTP status, in OpenAI's envelope: {"error": {message, type, param, code}}, or in
    Anthropic's (``response(ANTHROPIC)``)."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None, extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.extra = extra or {}

    def response(self, api: str = OPENAI) -> JSONResponse:
        status, body = self.shaped(api)
        return JSONResponse(body, status_code=status, headers=self.headers)

    def shaped(self, api: str = OPENAI) -> tuple[int, dict[str, Any]]:
        """The status and body in ``api``'s shape. Anthropic's: ``{"type": "error", "error": {"type", "message"}}``
        with its types by status, a busy queue as 529 ``overloaded_error``."""
        if api == ANTHROPIC:
            status = 529 if self.type in BUSY_TYPES else self.status
            kind = ANTHROPIC_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
            return status, {"type": "error", "error": {"type": kind, "message": self.message, **self.extra}}
        body: dict[str, Any] = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        body.update(self.extra)
        return self.status, {"error": body}


def envelope(status: int, message: str, **kw: Any) -> JSONResponse:
    return ApiError(status, message, **kw).response()


def engine_error(api: str, model: str, status: int, raw: bytes) -> tuple[int, bytes]:
    """An engine's error answer in ``api``'s shape. llama-server answers a body it failed to read (a field of the
    wrong type, a missing one it reads by force) with a 500 whose message is nlohmann::json's exception
    (``[json.exception.type_error.302] ...``) or its chat parser's (``Failed to parse tools: ...``): that is the
    request's fault, a 400. Its ``501 not_supported_error`` is a request this model cannot serve (``model_refusal``):
    a 400 too, saying why. OpenAI's shape is the engine's own, so any other answer passes as it came."""
    message, kind = _engine_message(raw)
    refusal = model_refusal(model, status, message, kind)
    if refusal is not None:
        new_status, body = refusal.shaped(api)
        return new_status, json.dumps(body).encode()
    fault = status == 500 and ("[json.exception." in message or message.startswith(REQUEST_FAULTS))
    if api == OPENAI and not fault:
        return status, raw
    err = ApiError(400 if fault else status, f"{model}: the engine refused the request: {message}",
                   type="invalid_request_error" if fault else kind, code="invalid_body" if fault else None)
    new_status, body = err.shaped(api)
    return new_status, json.dumps(body).encode()


def model_refusal(model: str, status: int, message: str, kind: str) -> ApiError | None:
    """The engine's ``501 not_supported_error`` as the client's 400: the model cannot serve this request, and the
    same request to it fails again. ``/infill`` on a model without fill-in-the-middle tokens says which tokens the
    engine found missing and what serves instead. None for any other answer."""
    if status != 501 or kind != "not_supported_error":
        return None
    if message.startswith(NO_FIM):
        missing = message[len(NO_FIM):].lstrip(": ").strip()
        return ApiError(400, f"{model} cannot fill in the middle: its vocabulary has no fill-in-the-middle tokens (the "
                        f"engine: {missing}). /infill needs a model with FIM prefix, suffix and middle tokens (GGUF "
                        "tokenizer.ggml.fim_pre_token_id, fim_suf_token_id and fim_mid_token_id, or tokens the engine "
                        "recognises such as <|fim_prefix|>), as code models have; /v1/completions serves this one",
                        param="model", code="model_without_fim")
    return ApiError(400, f"{model} cannot serve this request: the engine said: {message}", param="model",
                    code="not_supported_by_model")


def stream_break(api: str, model: str, why: str) -> bytes:
    """The last event of a stream its engine broke off (the seat died mid-answer), in ``api``'s shape: an SSE
    ``error`` event (Anthropic's), else a ``data:`` event with OpenAI's error envelope; the SDKs raise either.
    Blank lines first end an event the engine left half-written."""
    err = ApiError(502, f"{model}: the engine broke off its answer: {why}; a new request loads it again",
                   type="engine_error", code="engine_lost")
    _, body = err.shaped(api)
    data = json.dumps(body).encode()
    return b"\n\nevent: error\ndata: " + data + b"\n\n" if api == ANTHROPIC else b"\n\ndata: " + data + b"\n\n"


def _engine_message(raw: bytes) -> tuple[str, str]:
    """The message and type of an engine's error body (``{"error": {"message", "type"}}``), else its text."""
    try:
        err = json.loads(raw)["error"]
        return str(err.get("message", "")), str(err.get("type", "api_error"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return raw.decode(errors="replace").strip()[:500], "api_error"
