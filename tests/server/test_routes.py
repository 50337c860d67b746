"""The table of relayed routes without engines: every route is answered by the fast path, and what the door refuses
(a bad key, a malformed body, an unknown model, a stateful Responses request) is refused before anything loads, in
the route's API's own error shape, with a log line labelled by the route. The config's ``[aliases]``."""

from __future__ import annotations

import json
import logging

import pytest

from fitevict.request.aliases import Aliases
from fitevict.server.errors import ApiError, engine_error
from fitevict.server.routes import ROUTES


@pytest.fixture()
def request_lines(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="fitevict.request")
    return lambda: [json.loads(r.getMessage()) for r in caplog.records if r.name == "fitevict.request"]


def anthropic_error(r, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    doc = r.json()
    assert doc["type"] == "error" and doc["error"]["type"] == kind and set(doc) == {"type", "error"}, doc
    return doc["error"]["message"]


def openai_error(r, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param, err
    return err


MSG = {"model": "llama-gqa", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
# (path, body, the param named): each a malformed body the pinned engine would answer with a 500 or worse
MALFORMED = [
    ("/v1/messages", {"model": "llama-gqa", "max_tokens": 8}, "messages"),
    ("/v1/messages", {**MSG, "messages": "hi"}, "messages"),
    ("/v1/messages", {**MSG, "messages": ["hi"]}, "messages.0"),
    ("/v1/messages", {**MSG, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ("/v1/messages", {**MSG, "messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages.0.content.0"),
    ("/v1/messages", {**MSG, "max_tokens": "8"}, "max_tokens"),
    ("/v1/messages", {k: v for k, v in MSG.items() if k != "max_tokens"}, "max_tokens"),
    ("/v1/messages", {**MSG, "stop_sequences": "x"}, "stop_sequences"),
    ("/v1/messages", {**MSG, "tools": [{"description": "no name"}]}, "tools"),
    ("/v1/messages", {**MSG, "system": 3}, "system"),
    ("/v1/messages/count_tokens", {"model": "llama-gqa", "messages": {}}, "messages"),
    ("/v1/responses", {"model": "llama-gqa"}, "input"),
    ("/v1/responses", {"model": "llama-gqa", "input": 3}, "input"),
    ("/v1/responses", {"model": "llama-gqa", "input": [{"type": "function_call", "name": "f"}]}, "input.0.call_id"),
    ("/v1/responses", {"model": "llama-gqa", "input": [{"role": "user", "content": 3}]}, "input.0.content"),
    ("/v1/responses", {"model": "llama-gqa", "input": "x", "max_output_tokens": -1}, "max_output_tokens"),
    ("/v1/responses/input_tokens", {"model": "llama-gqa", "input": [7]}, "input.0"),
    ("/v1/chat/completions/input_tokens", {"model": "llama-gqa", "messages": [1]}, "messages.0"),
    ("/v1/chat/completions/input_tokens", {"model": "llama-gqa", "messages": [
        {"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
    ("/v1/chat/completions/input_tokens", {"model": "llama-gqa", "messages": [], "tools": [{"type": "x"}]}, "tools"),
    ("/v1/rerank", {"model": "llama-gqa", "query": "q"}, "documents"),
    ("/rerank", {"model": "llama-gqa", "query": 1, "documents": ["a"]}, "query"),
    ("/tokenize", {"model": "llama-gqa"}, "content"),
    ("/tokenize", {"model": "llama-gqa", "content": {"a": 1}}, "content"),
    ("/detokenize", {"model": "llama-gqa", "tokens": ["a"]}, "tokens"),
    ("/infill", {"model": "llama-gqa", "input_prefix": "def "}, "input_suffix"),
    ("/infill", {"model": "llama-gqa", "input_prefix": "a", "input_suffix": "b", "input_extra": [{"x": 1}]},
     "input_extra"),
]


@pytest.mark.parametrize("path,body,param", MALFORMED, ids=[f"{p} {q}" for p, _, q in MALFORMED])
def test_a_malformed_body_is_a_400_in_the_routes_shape_before_anything_loads(make_client, request_lines, path, body,
                                                                             param) -> None:
    c = make_client()
    r = c.post(path, json=body)
    if ROUTES[path].api == "anthropic":
        assert f"'{param}'" in anthropic_error(r, 400, "invalid_request_error")
    else:
        openai_error(r, 400, param)
    line = request_lines()[-1]
    assert line["endpoint"] == ROUTES[path].endpoint and line["status"] == 400
    assert c.get("/v1/models/residents").json()["data"] == []


@pytest.mark.parametrize("field,value", [("previous_response_id", "resp_1"), ("store", True)])
def test_responses_that_need_server_state_are_refused_not_dropped(make_client, field, value) -> None:
    c = make_client()
    r = c.post("/v1/responses", json={"model": "llama-gqa", "input": "hi", field: value})
    err = openai_error(r, 400, field)
    assert err["code"] == "unsupported_parameter" and "keeps no responses" in err["message"] or \
        "stores no responses" in err["message"]
    ok = c.post("/v1/responses", json={"model": "nope", "input": "hi", "store": False})
    assert ok.status_code == 404  # store: false passes the check (and then the model is unknown)


def test_anthropic_routes_answer_in_anthropics_shape(make_client, request_lines) -> None:
    c = make_client(**{"server.api_keys": ["u1"]})
    assert "API key" in anthropic_error(c.post("/v1/messages", json=MSG), 401, "authentication_error")
    wrong = c.post("/v1/messages", json=MSG, headers={"x-api-key": "nope"})
    anthropic_error(wrong, 401, "authentication_error")
    unknown = c.post("/v1/messages", json={**MSG, "model": "llama-gq"}, headers={"x-api-key": "u1"})
    assert "llama-gqa" in anthropic_error(unknown, 404, "not_found_error")  # the model it could have meant
    counted = c.post("/v1/messages/count_tokens", json={"model": "nope", "messages": []},
                     headers={"anthropic-version": "2023-06-01", "x-api-key": "u1"})
    anthropic_error(counted, 404, "not_found_error")
    assert c.get("/v1/messages").status_code == 405
    assert [(x["endpoint"], x["status"]) for x in request_lines()] == [
        ("messages", 401), ("messages", 401), ("messages", 404), ("messages_count_tokens", 404), ("messages", 405)]


def test_every_route_of_the_table_is_answered_by_the_fast_path(make_client) -> None:
    c = make_client()
    for path, route in ROUTES.items():
        r = c.post(path, json={"model": "no-such-model", "input": "x", "messages": [], "max_tokens": 1,
                               "content": "x", "tokens": [1], "query": "q", "documents": ["d"], "input_prefix": "",
                               "input_suffix": ""})
        assert r.status_code == 404, (path, r.text)
        doc = r.json()
        assert (doc["error"]["type"] == "not_found_error") if route.api == "anthropic" else (
            doc["error"]["code"] == "model_not_found"), (path, doc)


def test_a_busy_queue_is_anthropics_529_overloaded_with_retry_after() -> None:
    busy = ApiError(503, "full", type="server_busy", code="busy", headers={"Retry-After": "2"})
    r = busy.response("anthropic")
    assert r.status_code == 529 and r.headers["retry-after"] == "2"
    assert json.loads(r.body) == {"type": "error", "error": {"type": "overloaded_error", "message": "full"}}
    assert busy.response().status_code == 503  # OpenAI's routes keep 503


def test_an_engine_error_is_put_in_the_routes_shape() -> None:
    bad = json.dumps({"error": {"code": 500, "message": "[json.exception.type_error.302] type must be string",
                                "type": "server_error"}}).encode()
    status, body = engine_error("openai", "m", 500, bad)  # the engine choked on the body: the request's fault
    assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
    status, body = engine_error("anthropic", "m", 500, bad)
    assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
    tools = b'{"error": {"code": 500, "message": "Failed to parse tools: Missing tool type: 1", "type": "server_error"}}'
    assert engine_error("openai", "m", 500, tools)[0] == 400
    assert engine_error("openai", "m", 500, b'{"error": {"message": "out of memory"}}')[0] == 500  # the engine's own
    # the engine's 501 for a model without fill-in-the-middle tokens: the client's 400, in each API's shape
    no_fim = json.dumps({"error": {"code": 501, "message": "Infill is not supported by this model: prefix token is "
                                   "missing. suffix token is missing. middle token is missing. ",
                                   "type": "not_supported_error"}}).encode()
    status, body = engine_error("openai", "m", 501, no_fim)
    err = json.loads(body)["error"]
    assert status == 400 and err["type"] == "invalid_request_error" and err["code"] == "model_without_fim"
    assert err["message"].startswith("m cannot fill in the middle") and "prefix token is missing" in err["message"]
    status, body = engine_error("anthropic", "m", 501, no_fim)
    assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
    other = json.dumps({"error": {"code": 501, "message": "no", "type": "not_supported_error"}}).encode()
    assert engine_error("openai", "m", 501, other)[0] == 400
    assert json.loads(engine_error("openai", "m", 501, other)[1])["error"]["code"] == "not_supported_by_model"
    teapot = b'{"error": {"code": 501, "message": "Infill is not supported", "type": "server_error"}}'
    assert engine_error("openai", "m", 501, teapot) == (501, teapot)  # not the engine's refusal: passes as it came
    status, body = engine_error("anthropic", "m", 400, b'{"error": {"message": "too long", "type": "x"}}')
    assert status == 400 and json.loads(body) == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "m: the engine refused the request: too long"}}


def test_aliases_match_exact_names_first_then_the_longest_pattern() -> None:
    a = Aliases({"claude-*": "small", "claude-opus-*": "big", "GPT-5": "mid", "*-mini": "tiny"})
    assert a.match("gpt-5").target == "mid" and a.match("gpt-5").alias == "GPT-5"
    assert a.match("claude-opus-4-1").target == "big" and a.match("claude-sonnet-4-5").alias == "claude-*"
    assert a.match("claude-opus-mini").target == "big"  # longer pattern first
    assert a.match("gpt-4o-mini").target == "tiny" and a.match("gpt-4o") is None
    assert Aliases({"a.b*": "x"}).match("aXb") is None  # only * is special
    assert a.of(("big",)) == ([], ["claude-opus-*"]) and a.close("gpt5") == ["GPT-5"]


def test_aliases_select_their_model_at_the_door_and_are_listed(make_client, request_lines) -> None:
    c = make_client(aliases={"gpt-5": "llama-gqa", "claude-*": "llama-gqa", "gone": "not-a-model"})
    models = c.get("/v1/models").json()["data"]
    listed = {m["id"]: m["fitevict"] for m in models}
    assert listed["gpt-5"] == {"alias_of": "llama-gqa"} and "gone" not in listed
    assert listed["llama-gqa"]["alias_names"] == ["gpt-5"] and listed["llama-gqa"]["alias_patterns"] == ["claude-*"]
    assert c.get("/v1/models/gpt-5").json()["fitevict"] == {"alias_of": "llama-gqa"}
    # an alias passes the door: the request goes on to a seat (here the stand-in engine cannot start one)
    r = c.post("/v1/messages/count_tokens", json={"model": "claude-sonnet-4-5", "messages": []})
    assert r.status_code != 404 and request_lines()[-1]["model"] == "llama-gqa"
    gone = c.post("/v1/chat/completions", json={"model": "gone", "messages": []})
    assert "alias" in openai_error(gone, 404)["message"] and "not-a-model" in gone.json()["error"]["message"]
    close = c.post("/v1/chat/completions", json={"model": "gpt5", "messages": []})
    assert "gpt-5" in openai_error(close, 404)["close_matches"]


def test_docs_api_has_every_route_of_the_table() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    for path, route in ROUTES.items():
        assert f"`POST {path}`" in doc and f"`{route.endpoint}`" in doc, path


def test_rerank_for_a_model_that_does_not_rank_is_a_400_before_anything_loads(make_client) -> None:
    c = make_client()
    r = c.post("/v1/rerank", json={"model": "llama-gqa", "query": "q", "documents": ["d"]})
    err = openai_error(r, 400, "model")
    assert err["code"] == "not_a_reranker" and err["rerankers"] == [] and "no model here reranks" in err["message"]
    assert c.get("/v1/models/residents").json()["data"] == []
