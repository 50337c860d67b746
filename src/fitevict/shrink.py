"""A context that fits (``policy.shrink_ctx``), pure: how many tokens a request can need, and the context to load.

Before a load nothing can tokenize, so the prompt is bounded from above by its UTF-8 bytes: a token of the
byte-level tokenizers llama.cpp runs covers at least one byte. A chat is counted as its messages serialized to JSON
(the role names, quotes and braces stand in for the template's markers, which are fewer tokens than those bytes)
plus ``TEMPLATE_ALLOWANCE`` tokens for the generation prompt and BOS. The answer needs ``max_tokens`` (or
``max_completion_tokens``, the Responses API's ``max_output_tokens``, Ollama's ``num_predict``); a request without one takes the model's default from its
request defaults, and with no default at all the answer may fill any context, so no smaller context is safe.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TEMPLATE_ALLOWANCE = 64  # tokens beyond the serialized messages: generation prompt, BOS, a system default
MAX_TOKEN_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict", "num_predict")


@dataclass(frozen=True, slots=True)
class Need:
    """The tokens a request may need, or why that is unknown."""

    tokens: int | None
    prompt_bound: int | None
    max_tokens: int | None
    why: str  # how it was counted, or why it could not be

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "prompt_bound": self.prompt_bound, "max_tokens": self.max_tokens,
                "why": self.why}


def prompt_bound(body: Mapping[str, Any]) -> int | None:
    """An upper bound on the request's prompt tokens (its UTF-8 bytes); None for a body with no text prompt. A chat's
    messages (Anthropic's with its ``system``), or a Responses request's ``input`` with its ``instructions``, count
    with their tools."""
    chat = isinstance(body.get("messages"), list)
    if chat or isinstance(body.get("input"), (str, list)):
        extra = ("system", "tools", "functions") if chat else ("instructions", "tools")
        parts = [body["messages" if chat else "input"], *(body[k] for k in extra if k in body)]
        return len(json.dumps(parts, ensure_ascii=False).encode()) + TEMPLATE_ALLOWANCE
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt.encode()) + TEMPLATE_ALLOWANCE
    return None


def _max_tokens(body: Mapping[str, Any], defaults: Mapping[str, Any]) -> tuple[int | None, str]:
    options = body.get("options") if isinstance(body.get("options"), Mapping) else {}
    for where, src in (("the request", body), ("the request's options", options), ("the model's defaults", defaults)):
        for k in MAX_TOKEN_KEYS:
            v = src.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v, f"{k}={v} from {where}"
    return None, "no max_tokens in the request or the model's defaults: the answer may fill any context"


def max_tokens(body: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> int | None:
    """The most tokens the answer may generate, as the request (or its model's defaults) says; None: not said."""
    return _max_tokens(body, defaults or {})[0]


def need(body: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> Need:
    """The tokens one slot must hold for this request: the prompt's bound plus the answer's length."""
    bound = prompt_bound(body)
    most, words = _max_tokens(body, defaults or {})
    if bound is None:
        return Need(None, None, most, "the request has no text prompt to count")
    if most is None:
        return Need(None, bound, None, words)
    return Need(bound + most, bound, most, f"prompt <= {bound} tokens (its UTF-8 bytes + {TEMPLATE_ALLOWANCE}) + "
                                           f"{words}")


def shrunk_ctx(largest_ctx: int | None, n_parallel: int, need_tokens: int | None) -> int | None:
    """The context to load instead: the largest that fits, when one slot of it holds the request; else None."""
    if largest_ctx is None or need_tokens is None:
        return None
    return largest_ctx if largest_ctx // max(1, n_parallel) >= need_tokens else None


def dry_run(largest_ctx: int | None, n_parallel: int | None) -> dict[str, Any] | None:
    """What a refusal's dry run adds under ``policy.shrink_ctx``: which requests would load at a smaller context."""
    if largest_ctx is None:
        return None
    per_slot = largest_ctx // max(1, n_parallel or 4)
    return {"loaded_ctx": largest_ctx, "tokens_per_slot": per_slot,
            "note": f"policy.shrink_ctx: a request whose prompt (counted as its UTF-8 bytes + {TEMPLATE_ALLOWANCE}) "
                    f"plus max_tokens fits {per_slot} tokens loads at ctx {largest_ctx}; a larger one is refused"}


def dry_run_of(plan: Any, enabled: bool) -> dict[str, Any]:
    """``{"shrink_ctx": ...}`` for a refused plan's dry run under ``policy.shrink_ctx``; ``{}`` otherwise."""
    if not enabled or plan.action != "refuse":
        return {}
    got = dry_run(plan.largest_ctx, plan.config.n_parallel if plan.config is not None else None)
    return {"shrink_ctx": got} if got else {}


__all__ = ["dry_run", "dry_run_of", "MAX_TOKEN_KEYS", "Need", "TEMPLATE_ALLOWANCE", "need", "prompt_bound", "shrunk_ctx"]
