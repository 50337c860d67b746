"""What each relayed route's body must hold before a seat is asked for it: a malformed body is a 400 at the door,
in the route's API's error shape, and never reaches the engine.

The pinned llama-server reads these bodies with nlohmann::json's checked accessors: a missing field or a field of
the wrong type throws inside the engine, which answers 500 (``ex_wrapper`` in tools/server/server.cpp) or, on
``/infill``, reads on past its own error. So the fields the engine reads by force are checked here, by type,
and nothing more: what the engine reads leniently (``json_value``, a default when the type is wrong) is its own.

Each check takes the body (a dict) and raises ``BodyError`` naming the field (a dotted path) and what it needs.
Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Check = Callable[[dict[str, Any]], None]


class BodyError(ValueError):
    """A body field the route cannot take: ``param`` is its path (``messages.0.content``)."""

    def __init__(self, param: str, need: str, code: str = "invalid_body") -> None:
        super().__init__(f"'{param}': {need}")
        self.param, self.code = param, code


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _need(body: dict, key: str, ok: Callable[[Any], bool], need: str, *, required: bool = False,
          at: str = "") -> Any:
    if key not in body or (body[key] is None and not required):
        if required:
            raise BodyError(at + key, f"is required: {need}", code="missing_field")
        return None
    if not ok(body[key]):
        raise BodyError(at + key, need)
    return body[key]


def _list_of(v: Any, ok: Callable[[Any], bool]) -> bool:
    return isinstance(v, list) and all(ok(x) for x in v)


def _common(body: dict) -> None:
    """Sampling fields every generating route passes on to the engine."""
    _need(body, "stream", lambda v: isinstance(v, bool), "true or false")
    for k in ("temperature", "top_p"):
        _need(body, k, _is_number, "a number")
    _need(body, "top_k", _is_int, "an integer")


# -- Anthropic's Messages API ----------------------------------------------------------------------------------

def _blocks(v: Any, at: str) -> None:
    """Anthropic content: a string, or a list of blocks each an object with a string ``type``."""
    if isinstance(v, str):
        return
    if not isinstance(v, list):
        raise BodyError(at, "a string or a list of content blocks")
    for i, block in enumerate(v):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise BodyError(f"{at}.{i}", 'a content block: an object with a string "type" ("text", "image", '
                                         '"tool_use", "tool_result", ...)')
        if block["type"] == "text" and not isinstance(block.get("text"), str):
            raise BodyError(f"{at}.{i}.text", "a string")
        if block["type"] == "tool_result" and "content" in block and not isinstance(block["content"], (str, list)):
            raise BodyError(f"{at}.{i}.content", "a string or a list of content blocks")


def _anthropic_prompt(body: dict) -> None:
    messages = _need(body, "messages", lambda v: isinstance(v, list), "a list of messages", required=True)
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BodyError(f"messages.{i}", 'a message: {"role": "user" | "assistant", "content": ...}')
        if m.get("role") not in ("user", "assistant"):
            raise BodyError(f"messages.{i}.role", '"user" or "assistant" (the system prompt goes in "system")')
        if "content" not in m:
            raise BodyError(f"messages.{i}.content", "is required: a string or a list of content blocks",
                            code="missing_field")
        _blocks(m["content"], f"messages.{i}.content")
    if body.get("system") is not None:
        _blocks(body["system"], "system")
    _need(body, "tools", lambda v: _list_of(v, lambda t: isinstance(t, dict) and isinstance(t.get("name"), str)),
          'a list of tools, each an object with a string "name"')
    _need(body, "tool_choice", lambda v: isinstance(v, dict), 'an object such as {"type": "auto"}')


def messages(body: dict) -> None:
    """``POST /v1/messages``: Anthropic requires ``max_tokens``; the rest as ``count_tokens``."""
    _anthropic_prompt(body)
    _need(body, "max_tokens", lambda v: _is_int(v) and v >= 1, "a positive integer", required=True)
    _need(body, "stop_sequences", lambda v: _list_of(v, lambda s: isinstance(s, str)), "a list of strings")
    _common(body)


def count_tokens(body: dict) -> None:
    """``POST /v1/messages/count_tokens``: the prompt of a Messages request."""
    _anthropic_prompt(body)


# -- OpenAI: the Responses API and chat's token count -----------------------------------------------------------

STATEFUL = ("previous_response_id", "store")


def _response_item(item: Any, at: str) -> None:
    if isinstance(item, dict) and isinstance(item.get("content"), str):
        return  # an input message with text
    if not isinstance(item, dict):
        raise BodyError(at, "an input item (an object)")
    kind = item.get("type")
    if kind == "function_call":
        for k in ("call_id", "name", "arguments"):
            _need(item, k, lambda v: isinstance(v, str), "a string", required=True, at=at + ".")
    elif kind == "function_call_output":
        _need(item, "call_id", lambda v: isinstance(v, str), "a string", required=True, at=at + ".")
        _need(item, "output", lambda v: isinstance(v, (str, list)), "a string or a list", required=True, at=at + ".")
    elif isinstance(item.get("role"), str):
        content = _need(item, "content", lambda v: isinstance(v, list), "a string or a list of content parts",
                        required=True, at=at + ".")
        for j, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise BodyError(f"{at}.content.{j}", 'a content part: an object with a string "type"')
    elif kind != "reasoning":
        raise BodyError(at, 'an input item: a message (with "role" and "content"), "function_call", '
                            '"function_call_output" or "reasoning"')


def responses(body: dict) -> None:
    """``POST /v1/responses`` and its ``input_tokens``. The engine keeps no responses: a request that relies on
    server-side state (``previous_response_id``, ``store: true``) is refused here, not dropped in silence."""
    if body.get("previous_response_id") not in (None, ""):
        raise BodyError("previous_response_id", "this server keeps no responses (the engine is stateless): send "
                                                "the whole conversation in 'input' instead",
                        code="unsupported_parameter")
    if body.get("store") is True:
        raise BodyError("store", "this server stores no responses (the engine is stateless): send 'store': false "
                                 "or leave it out", code="unsupported_parameter")
    inp = _need(body, "input", lambda v: isinstance(v, (str, list)), "a string or a list of input items",
                required=True)
    if isinstance(inp, list):
        for i, item in enumerate(inp):
            _response_item(item, f"input.{i}")
    _need(body, "instructions", lambda v: isinstance(v, str), "a string")
    _need(body, "tools", lambda v: _list_of(v, lambda t: isinstance(t, dict)), "a list of tools (objects)")
    _need(body, "max_output_tokens", lambda v: _is_int(v) and v >= 1, "a positive integer")
    _need(body, "reasoning", lambda v: isinstance(v, dict), "an object")
    _common(body)


def _function_tool(t: Any) -> bool:
    return isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict) and \
        isinstance(t["function"].get("name"), str)


def chat(body: dict) -> None:
    """``POST /v1/chat/completions/input_tokens``: a chat request's messages, each an object with a role and its
    content a string or a list of parts (a text part with its text), and its tools, each a function."""
    msgs = _need(body, "messages", lambda v: isinstance(v, list), "a list of messages", required=True)
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BodyError(f"messages.{i}", 'a message: an object with a string "role"')
        for j, part in enumerate(m["content"] if isinstance(m.get("content"), list) else ()):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise BodyError(f"messages.{i}.content.{j}", 'a content part: an object with a string "type"')
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise BodyError(f"messages.{i}.content.{j}.text", "a string")
    _need(body, "tools", lambda v: _list_of(v, _function_tool),
          'a list of tools, each {"type": "function", "function": {"name": ..., ...}}')


# -- llama.cpp's own routes --------------------------------------------------------------------------------------

def _text_or_tokens(v: Any) -> bool:
    return isinstance(v, str) or _list_of(v, lambda x: isinstance(x, str) or _is_int(x))


def tokenize(body: dict) -> None:
    _need(body, "content", _text_or_tokens, "a string (or a list of strings and token ids)", required=True)
    for k in ("add_special", "parse_special", "with_pieces"):
        _need(body, k, lambda v: isinstance(v, bool), "true or false")


def detokenize(body: dict) -> None:
    _need(body, "tokens", lambda v: _list_of(v, _is_int), "a list of token ids (integers)", required=True)


def infill(body: dict) -> None:
    for k in ("input_prefix", "input_suffix"):
        _need(body, k, lambda v: isinstance(v, str), "a string", required=True)
    _need(body, "prompt", lambda v: isinstance(v, str), "a string")
    _need(body, "input_extra", lambda v: _list_of(v, lambda c: isinstance(c, dict) and isinstance(c.get("text"), str)
                                                  and isinstance(c.get("filename", ""), str)),
          'a list of {"filename": string, "text": string}')
    _need(body, "n_predict", _is_int, "an integer")
    _common(body)


def rerank(body: dict) -> None:
    _need(body, "query", lambda v: isinstance(v, str), "a string", required=True)
    docs = body.get("documents", body.get("texts"))
    if not (isinstance(docs, list) and docs and all(isinstance(d, str) for d in docs)):
        raise BodyError("documents", "a non-empty list of strings", code="missing_field" if docs is None else
                        "invalid_body")
    _need(body, "top_n", lambda v: _is_int(v) and v >= 1, "a positive integer")
