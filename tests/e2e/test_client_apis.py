"""Every API a client speaks, through the official clients, against one real front door and real llama-server seats:
each relayed route loads the model its body names on demand and answers with the engine's own answer; Anthropic's
Messages API (keys as ``x-api-key``, its errors as the SDK's own exceptions, its event stream); the Responses API;
the config's ``[aliases]``; two models that cannot share memory taking turns across APIs.

One front door for the module (``fitevict serve`` in its own process): the budget holds one medium model and the
small one, ``policy.max_queue`` is 1 so that a second waiting request is refused at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from _frontdoor import FrontDoor, front_door, history, poll
from _models import medium_host_bytes, swap_models
from fitevict.engines.llama_cpp.install import engine_root
from fitevict.server.routes import ROUTES
from fitevict.zoo.rerank import NAME as RERANKER, write_reranker

pytestmark = pytest.mark.e2e

USER, ADMIN = "user-key", "admin-key"
SMALL = "llama-gqa"


@pytest.fixture(scope="module")
def door(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    tmp = tmp_path_factory.mktemp("apis")
    (tmp / "models").mkdir()
    models = swap_models(zoo, tmp / "models")
    write_reranker(models, engine_root() / "src" / "vendor" / "llama.cpp")
    cfg = tmp / "fitevict.toml"
    cfg.write_text(f'''
[server]
api_keys = ["{USER}"]
admin_keys = ["{ADMIN}"]
[budget]
ram_limit = {int(1.5 * medium_host_bytes(models))}
ram_reserve = 0
[policy]
max_queue = 1
[aliases]
"gpt-5" = "{SMALL}"
"claude-*" = "{SMALL}"
''')
    with front_door(tmp, "--config", str(cfg), "--models-dir", str(models)) as fd:
        yield fd


def unload(fd: FrontDoor, key: str) -> None:
    r = httpx.post(f"{fd.base_url}/v1/models/{key}/unload", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
    assert r.status_code == 200, r.text


def loads_for(fd: FrontDoor, request_id: str) -> list[dict]:
    """The load events a request caused (history settles what has been answered before it reads)."""
    return [row for row in history(fd, key=ADMIN, event="load") if row["request_id"] == request_id]


def oai(fd: FrontDoor) -> openai.OpenAI:
    return openai.OpenAI(base_url=fd.base_url + "/v1", api_key=USER, max_retries=0, timeout=120)


def claude(fd: FrontDoor, key: str = USER) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fd.base_url, api_key=key, max_retries=0, timeout=120)


# (path, body, what the engine's own answer holds): each route asked for the small model while it is not loaded
ROUTE_CASES = [
    ("/v1/responses", {"input": "hi", "max_output_tokens": 4}, lambda d: d["object"] == "response"),
    ("/v1/responses/input_tokens", {"input": "hi"}, lambda d: d["input_tokens"] > 0),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
     lambda d: d["type"] == "message" and d["role"] == "assistant"),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "hi"}]}, lambda d: d["input_tokens"] > 0),
    ("/v1/chat/completions/input_tokens", {"messages": [{"role": "user", "content": "hi"}]},
     lambda d: d["input_tokens"] > 0),
    ("/tokenize", {"content": "hello world"}, lambda d: len(d["tokens"]) > 1),
    ("/detokenize", {"tokens": [10, 11, 12]}, lambda d: isinstance(d["content"], str)),
]


@pytest.mark.parametrize("path,body,holds", ROUTE_CASES, ids=[c[0] for c in ROUTE_CASES])
def test_each_route_loads_the_named_model_on_demand(door: FrontDoor, path: str, body: dict, holds) -> None:
    unload(door, SMALL)
    rid = f"route-{path.strip('/').replace('/', '-')}"
    r = httpx.post(door.base_url + path, json={"model": SMALL, **body}, timeout=120,
                   headers={"Authorization": f"Bearer {USER}", "x-request-id": rid})
    assert r.status_code == 200, r.text
    assert holds(r.json()), r.json()
    assert r.headers["x-fitevict-model"] == SMALL and r.headers["x-request-id"] == rid
    (load,) = loads_for(door, rid)  # this request loaded it, and the history says through which route
    assert load["model"] == SMALL and load["details"]["origin"] == {"route": ROUTES[path].endpoint}


def test_infill_loads_on_demand_and_a_model_without_fim_tokens_is_a_400_saying_so(door: FrontDoor) -> None:
    """The demo models have no fill-in-the-middle tokens: /infill loads the model it names, and the engine's refusal
    (its 501) reaches the client as a 400 in the API's shape that says why."""
    unload(door, SMALL)
    r = httpx.post(door.base_url + "/infill", json={"model": SMALL, "input_prefix": "def f(", "input_suffix": "):\n"},
                   headers={"Authorization": f"Bearer {USER}", "x-request-id": "infill-no-fim"}, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "model_without_fim" and err["param"] == "model"
    assert f"{SMALL} cannot fill in the middle" in err["message"] and "prefix token is missing" in err["message"]
    (load,) = loads_for(door, "infill-no-fim")  # the request loaded it, through its own route
    assert load["details"]["origin"] == {"route": "infill"}


def test_rerank_for_a_generative_model_is_a_400_naming_the_rerankers(door: FrontDoor) -> None:
    auth = {"Authorization": f"Bearer {USER}"}
    before = {v["key"] for v in httpx.get(door.base_url + "/v1/models/residents", headers=auth).json()["data"]}
    gen = httpx.post(door.base_url + "/v1/rerank", json={"model": "med-c", "query": "q", "documents": ["d"]},
                     headers=auth, timeout=60)
    assert gen.status_code == 400 and gen.json()["error"]["rerankers"] == [RERANKER], gen.text
    assert "does not rerank" in gen.json()["error"]["message"] and RERANKER in gen.json()["error"]["message"]
    after = {v["key"] for v in httpx.get(door.base_url + "/v1/models/residents", headers=auth).json()["data"]}
    assert "med-c" not in after and after <= before  # refused before anything loaded


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_rerank_loads_the_reranker_on_demand(door: FrontDoor, path: str) -> None:
    unload(door, RERANKER)
    rid = f"rerank-{path.strip('/').replace('/', '-')}"
    docs = ["a cat is an animal", "the sky is blue", "cars have wheels"]
    r = httpx.post(door.base_url + path, json={"model": RERANKER, "query": "what is a cat", "documents": docs,
                                               "top_n": 2},
                   headers={"Authorization": f"Bearer {USER}", "x-request-id": rid}, timeout=120)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 2 and {x["index"] for x in results} <= {0, 1, 2}
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]
    (load,) = loads_for(door, rid)
    assert load["details"]["origin"] == {"route": "rerank"}


def test_a_body_the_engine_cannot_read_is_a_400_not_its_500(door: FrontDoor) -> None:
    """Chat's body passes the door as it is; the pinned engine answers tools it cannot parse with a 500."""
    r = httpx.post(door.base_url + "/v1/chat/completions", json={"model": SMALL, "messages": [], "tools": [1]},
                   headers={"Authorization": f"Bearer {USER}"}, timeout=120)
    assert r.status_code == 400 and "Failed to parse tools" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_the_responses_api_through_the_openai_sdk(door: FrontDoor) -> None:
    client = oai(door)
    resp = client.responses.create(model="gpt-5", input="Say hi", instructions="Be brief.", max_output_tokens=6)
    assert resp.status == "completed" and resp.usage.output_tokens >= 1 and isinstance(resp.output_text, str)
    stream = client.responses.create(model="gpt-5", input=[{"role": "user", "content": "hi"}], max_output_tokens=6,
                                     stream=True)
    kinds = [ev.type for ev in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    assert "response.output_text.delta" in kinds
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="gpt-5", input="hi", previous_response_id="resp_123")
    assert e.value.body["param"] == "previous_response_id" and "keeps no responses" in e.value.body["message"]


def test_anthropics_messages_api_through_the_anthropic_sdk(door: FrontDoor) -> None:
    client = claude(door)  # the key goes as x-api-key
    unload(door, SMALL)
    raw = client.messages.with_raw_response.create(model="claude-haiku-4-5", max_tokens=6, system="Be brief.",
                                                   messages=[{"role": "user", "content": "hi"}],
                                                   stop_sequences=["\n\n\n"], extra_headers={"x-request-id": "c1"})
    msg = raw.parse()
    # the alias is resolved once, at the door: the answer and the load's history name it and the model it chose
    assert raw.headers["x-fitevict-model"] == SMALL and raw.headers["x-fitevict-alias"] == "claude-haiku-4-5"
    (load,) = loads_for(door, "c1")
    assert load["details"]["origin"] == {"route": "messages", "asked_as": "claude-haiku-4-5", "alias": "claude-*"}
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "text"
    assert msg.usage.output_tokens >= 1 and msg.stop_reason in ("end_turn", "max_tokens", "stop_sequence")
    with client.messages.stream(model="claude-haiku-4-5", max_tokens=6,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert final.usage.output_tokens >= 1
    engine = [k for k in kinds if k not in ("text",)]  # the SDK adds "text" events of its own
    assert engine[0] == "message_start" and engine[-1] == "message_stop", kinds
    for kind in ("content_block_start", "content_block_delta", "content_block_stop", "message_delta"):
        assert kind in engine, kinds
    counted = client.messages.count_tokens(model="claude-haiku-4-5", messages=[{"role": "user", "content": "hi"}])
    assert counted.input_tokens > 0


def test_anthropics_errors_are_the_sdks_own_exceptions(door: FrontDoor) -> None:
    with pytest.raises(anthropic.NotFoundError) as e:
        claude(door).messages.create(model="llama-gq", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404 and SMALL in e.value.message
    with pytest.raises(anthropic.AuthenticationError):
        claude(door, key="wrong").messages.create(model=SMALL, max_tokens=4,
                                                  messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude(door).messages.create(model=SMALL, max_tokens=4, messages=[{"role": "system", "content": "hi"}])
    assert bad.value.body["error"]["type"] == "invalid_request_error"


def test_two_models_take_turns_across_apis_and_a_full_queue_is_overloaded(door: FrontDoor) -> None:
    """med-a streams through OpenAI's completions and stays in flight; med-b, asked through Anthropic's Messages API,
    cannot share the memory and waits; a second med-b request finds the queue full: the SDK's OverloadedError (529,
    with retry-after). Once med-a's stream ends, med-b loads in its place and answers."""
    auth = {"Authorization": f"Bearer {USER}"}
    body = {"model": "med-a", "prompt": "go", "max_tokens": 100000, "ignore_eos": True, "stream": True}
    waited: dict = {}

    def ask_b() -> None:
        waited["msg"] = claude(door).messages.create(model="med-b", max_tokens=4,
                                                     messages=[{"role": "user", "content": "hi"}])

    with httpx.stream("POST", door.base_url + "/v1/completions", json=body, headers=auth, timeout=120) as held:
        assert held.status_code == 200
        next(held.iter_raw())  # med-a is serving
        t = threading.Thread(target=ask_b)
        t.start()
        poll(lambda: httpx.get(door.base_url + "/v1/models/residents", headers=auth).json()["waiting"].get("med-b"),
             "med-b waiting for its turn")
        with pytest.raises(anthropic.APIStatusError) as full:
            claude(door).messages.create(model="med-b", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        # refused at once, not after a wait: the queue had not moved (med-a still streams, med-b's first still waits)
        assert t.is_alive() and "msg" not in waited
        assert httpx.get(door.base_url + "/v1/models/residents", headers=auth).json()["waiting"].get("med-b") == 1
    assert full.value.status_code == 529 and full.value.body["error"]["type"] == "overloaded_error"
    assert type(full.value).__name__ in ("OverloadedError", "InternalServerError")
    assert int(full.value.response.headers["retry-after"]) > 0
    t.join(120)
    assert waited["msg"].type == "message"
    evicted = [row for row in history(door, key=ADMIN, event="evict") if row["model"] == "med-a"]
    assert evicted and "med-b" in evicted[0]["reason"]
    loaded = [row for row in history(door, key=ADMIN, event="load") if row["model"] == "med-b"]
    assert loaded[0]["details"]["origin"]["route"] == "messages"


def test_the_zoo_reranker_ranks_on_the_bare_engine(tmp_path: Path, llama_server: Path) -> None:
    """The reranker the zoo writes is one the pinned engine ranks with, started as fitevict starts its seat."""
    from _server import running_server

    path = write_reranker(tmp_path, engine_root() / "src" / "vendor" / "llama.cpp")
    with running_server(llama_server, path, "--embeddings", "--pooling", "rank", "-c", "512", "-np", "1") as srv:
        r = httpx.post(srv.base_url + "/v1/rerank", json={"query": "a cat", "documents": ["cat", "sky", "car"],
                                                          "top_n": 3}, timeout=60)
    assert r.status_code == 200, r.text
    assert sorted(x["index"] for x in r.json()["results"]) == [0, 1, 2]


def test_metrics_and_the_log_are_labelled_by_route(door: FrontDoor) -> None:
    claude(door).messages.create(model="claude-haiku-4-5", max_tokens=1, messages=[{"role": "user", "content": "x"}])
    oai(door).responses.create(model="gpt-5", input="x", max_output_tokens=1)
    text = httpx.get(door.base_url + "/metrics", headers={"Authorization": f"Bearer {USER}"}, timeout=60).text
    for endpoint in ("responses", "messages"):
        assert f'endpoint="{endpoint}"' in text, endpoint
    assert door.await_requests(endpoint="messages", asked_as="claude-haiku-4-5")
