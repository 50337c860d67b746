"""Who a request is, for fairness: the client its key names, its class from the header, OpenAI's service_tier or its
key, the refusals of a class it may not ask for, and a key's 429 in each API's shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from fitevict.config import load_config
from fitevict.schedule.errors import RateLimited
from fitevict.server.clients import client_of, share_for
from fitevict.server.door import Door
from fitevict.server.errors import ANTHROPIC, OPENAI, ApiError


@pytest.fixture
def config(tmp_path: Path):
    p = tmp_path / "f.toml"
    p.write_text('''
[server]
api_keys = ["plain"]
[fair]
classes = { interactive = 4, batch = 1, bulk = 0.5 }
key_max_queue = 3
[fair.keys.pipeline]
key = "sk-pipe"
class = "batch"
weight = 2
max_in_flight = 2
[fair.keys.ops]
key = "sk-ops"
class = "batch"
classes = ["interactive"]
''')
    return load_config(p, env={})


def test_a_key_names_its_client_never_its_secret(config) -> None:
    assert client_of(config, "sk-pipe") == "pipeline" and client_of(config, "plain") == "key-1"
    assert "sk-pipe" in config.server.api_keys  # a named key is a user key


def test_the_class_comes_from_the_header_the_tier_or_the_key(config) -> None:
    own = share_for(config, "pipeline", None)
    assert (own.klass, own.client, own.weight, own.max_in_flight, own.max_queue) == ("batch", "pipeline", 2.0, 2, 3)
    assert share_for(config, "pipeline", "bulk").klass == "bulk"  # a lower class: always allowed
    assert share_for(config, "key-1", None, {"service_tier": "flex"}).klass == "batch"
    assert share_for(config, "key-1", None, {"service_tier": "auto"}).klass == "interactive"
    assert share_for(config, "ops", "interactive").klass == "interactive"  # listed in its classes


def test_a_class_above_the_keys_or_unknown_is_refused(config) -> None:
    with pytest.raises(ApiError) as e:
        share_for(config, "pipeline", "interactive")
    assert e.value.status == 403 and "fair.keys.<name>.classes" in e.value.message
    with pytest.raises(ApiError) as e:
        share_for(config, "pipeline", "urgent")
    assert e.value.status == 400 and "interactive, batch, bulk" in e.value.message


def test_a_rate_limit_is_429_with_retry_after_in_each_shape() -> None:
    err = Door.supervisor_error(RateLimited("llama-gqa: client 'k' has 1 request(s) waiting", retry_after=3))
    assert err.status == 429 and err.headers == {"Retry-After": "3"}
    assert err.shaped(OPENAI)[0] == 429 and err.shaped(OPENAI)[1]["error"]["code"] == "rate_limit_exceeded"
    status, body = err.shaped(ANTHROPIC)
    assert status == 429 and body["error"]["type"] == "rate_limit_error" and body["type"] == "error"
