"""policy.shrink_ctx's arithmetic (fitevict.shrink): the tokens a request may need, bounded from above before any
tokenizer runs, and the context a refusal's largest fitting one gives when a slot holds them."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from fitevict.shrink import TEMPLATE_ALLOWANCE, dry_run, need, prompt_bound, shrunk_ctx


def test_a_chat_is_bounded_by_its_serialized_bytes_plus_the_template_allowance() -> None:
    msgs = [{"role": "system", "content": "Sei breve."}, {"role": "user", "content": "Grüß dich, 世界"}]
    b = prompt_bound({"messages": msgs})
    assert b == len(json.dumps([msgs], ensure_ascii=False).encode()) + TEMPLATE_ALLOWANCE
    assert b > len("Sei breve.Grüß dich, 世界".encode())  # multi-byte characters count as their bytes
    assert prompt_bound({"prompt": "abc"}) == 3 + TEMPLATE_ALLOWANCE
    assert prompt_bound({"content": "x"}) is None  # no prompt to generate from (/tokenize)


def test_anthropics_and_the_responses_apis_prompts_count_with_their_system_text_and_tools() -> None:
    msgs, tools = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], [{"name": "f"}]
    anthropic = {"system": "Be brief.", "messages": msgs, "tools": tools, "max_tokens": 5}
    assert prompt_bound(anthropic) == len(json.dumps([msgs, "Be brief.", tools], ensure_ascii=False).encode()) + \
        TEMPLATE_ALLOWANCE
    responses = {"input": "hello", "instructions": "Be brief.", "max_output_tokens": 9}
    got = need(responses)
    assert got.prompt_bound == len(json.dumps(["hello", "Be brief."]).encode()) + TEMPLATE_ALLOWANCE
    assert got.max_tokens == 9 and got.tokens == got.prompt_bound + 9


def test_max_tokens_from_the_request_then_the_models_defaults_else_unknown() -> None:
    body = {"prompt": "hello"}
    assert need({**body, "max_tokens": 10}).tokens == 5 + TEMPLATE_ALLOWANCE + 10
    assert need({**body, "options": {"num_predict": 7}}).max_tokens == 7
    assert need(body, {"max_tokens": 20}).max_tokens == 20
    unknown = need(body)
    assert unknown.tokens is None and "may fill any context" in unknown.why


def test_shrunk_only_when_one_slot_of_the_largest_context_holds_the_request() -> None:
    assert shrunk_ctx(4096, 1, 4096) == 4096
    assert shrunk_ctx(4096, 1, 4097) is None
    assert shrunk_ctx(4096, 2, 2049) is None and shrunk_ctx(4096, 2, 2048) == 4096
    assert shrunk_ctx(None, 1, 10) is None and shrunk_ctx(4096, 1, None) is None
    assert dry_run(4096, 2)["tokens_per_slot"] == 2048 and dry_run(None, 1) is None


@given(text=st.text(max_size=200), extra=st.integers(1, 500))
def test_the_bound_is_never_below_the_text_bytes(text: str, extra: int) -> None:
    n = need({"messages": [{"role": "user", "content": text}], "max_tokens": extra})
    assert n.tokens is not None and n.tokens >= len(text.encode()) + extra
