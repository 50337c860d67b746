"""Ollama's shapes: options split into sampling (per request) and load contract (per seat), answers back."""

from __future__ import annotations

import math

import pytest

from fitevict.request.contract import Contract
from fitevict.server import ollama_shapes as sh


def test_options_split_into_sampling_and_the_load_contract() -> None:
    req = {"options": {"num_predict": 7, "temperature": 0.2, "top_p": 0.9, "top_k": 5, "seed": 3, "stop": ["\n"],
                       "num_ctx": 2048, "num_gpu": 99, "num_thread": 2}, "keep_alive": "5m"}
    tr = sh.chat_request({**req, "messages": [{"role": "user", "content": "hi"}]}, stream=False)
    assert tr.body == {"messages": [{"role": "user", "content": "hi"}], "stream": False, "max_tokens": 7,
                       "temperature": 0.2, "top_p": 0.9, "top_k": 5, "seed": 3, "stop": ["\n"]}
    assert tr.contract == Contract(ctx=2048, keep_alive=300.0)
    assert tr.ignored == ("num_gpu", "num_thread")  # placement is the planner's


def test_num_predict_below_zero_means_the_engines_default() -> None:
    body, _ = sh.sampling_of({"options": {"num_predict": -1}})
    assert "max_tokens" not in body


def test_keep_alive_0_and_minus_1() -> None:
    assert sh.contract_of({"keep_alive": 0}).keep_alive == 0.0
    assert sh.contract_of({"keep_alive": -1}).keep_alive == math.inf
    assert sh.contract_of({}) is None


def test_bad_load_options_name_ollamas_keys() -> None:
    with pytest.raises(sh.OllamaError, match="keep_alive"):
        sh.contract_of({"keep_alive": "soon"})
    with pytest.raises(sh.OllamaError, match="options.num_ctx"):
        sh.contract_of({"options": {"num_ctx": -5}})


def test_format_json_and_schema() -> None:
    assert sh.sampling_of({"format": "json"})[0]["response_format"] == {"type": "json_object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert sh.sampling_of({"format": schema})[0]["response_format"]["json_schema"]["schema"] == schema
    with pytest.raises(sh.OllamaError, match="format"):
        sh.sampling_of({"format": "yaml"})


def test_generate_goes_through_the_chat_template_unless_raw() -> None:
    path, tr = sh.generate_request({"prompt": "once", "system": "be brief"}, stream=True)
    assert path == "/v1/chat/completions"
    assert tr.body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "once"}]
    assert tr.body["stream_options"] == {"include_usage": True}
    path, tr = sh.generate_request({"prompt": "once", "raw": True}, stream=False)
    assert path == "/v1/completions" and tr.body["prompt"] == "once"


def test_tool_calls_both_ways() -> None:
    msgs = sh.chat_messages([{"role": "assistant", "content": "",
                              "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}])
    assert msgs[0]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    answer = {"choices": [{"message": {"content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": '{"x": 1}'}}]}, "finish_reason": "tool_calls"}]}
    assert sh.tool_calls_of(answer) == [{"function": {"name": "f", "arguments": {"x": 1}}}]
    assert sh.done_fields(finish="tool_calls", usage=None, timings=None, total_s=0, load_s=0)["done_reason"] == "stop"


def test_done_fields_count_tokens_and_time_in_nanoseconds() -> None:
    d = sh.done_fields(finish="length", usage={"prompt_tokens": 17, "completion_tokens": 4},
                       timings={"prompt_n": 1, "prompt_ms": 2.5, "predicted_n": 4, "predicted_ms": 10.0},
                       total_s=1.5, load_s=1.25)
    assert d == {"done": True, "done_reason": "length", "total_duration": 1_500_000_000,
                 "load_duration": 1_250_000_000, "prompt_eval_count": 17, "prompt_eval_duration": 2_500_000,
                 "eval_count": 4, "eval_duration": 10_000_000}


def test_ps_entry_counts_measured_bytes_where_measured_and_says_so() -> None:
    view = {"key": "m", "state": "ready", "phase": "ready", "in_flight": 0, "ctx": 4096, "unload_at": None,
            "devices": {"CPU": {"predicted_bytes": 100, "predicted_source": "formula", "measured_bytes": 120,
                                "measured_source": "measured"},
                        "CUDA0": {"predicted_bytes": 1000, "predicted_source": "dry-run", "measured_bytes": None,
                                  "measured_source": "unavailable, because it was not measured yet"}}}
    e = sh.ps_entry(view, {}, "d")
    assert (e["size"], e["size_vram"]) == (1120, 1000)
    assert e["fitevict"]["sources"] == {"CPU": "measured", "CUDA0": "predicted: dry-run"}
    assert e["expires_at"] == sh.FOREVER  # nothing scheduled: keep_alive -1, pinned, or never used
    assert sh.iso(0.0) == "1970-01-01T00:00:00Z"


def test_parameter_size() -> None:
    assert [sh.parameter_size(n) for n in (483_000, 7_240_000_000, 135_000_000, 12)] == ["483K", "7.2B", "135M", "12"]
