"""LoRA adapters end to end: a real `fitevict serve`, real llama-server seats, the demo adapters of llama-gqa.

An adapter ``llama-gqa:X`` is served by llama-gqa's seat, started once with every adapter; each request sets the
scales. The adapters really change the output; the base (all scales 0) equals a seat without adapters.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import save_file

from _frontdoor import front_door, history
from fitevict.supervisor.loadreport import HEADER
from fitevict.units import MiB
from fitevict.zoo import write_zoo
from fitevict.zoo.gguf_adapters import write_adapters

pytestmark = pytest.mark.e2e

PROMPT = "the cat sat on"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("lora-models")
    write_zoo(dest, only=["llama-gqa"])
    write_adapters(dest, names=("sql", "poem"))
    hf, peft = dest / "org" / "tiny-hf", dest / "tiny-hf-chat"  # an HF base and a PEFT adapter of it
    hf.mkdir(parents=True)
    peft.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": np.zeros((4, 4), dtype=np.float32)}, str(hf / "model.safetensors"))
    (peft / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "org/tiny-hf"}))
    save_file({"a": np.zeros((2, 4), dtype=np.float32)}, str(peft / "adapter_model.safetensors"))
    return dest


@pytest.fixture(scope="module")
def door(models: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("lora-door")
    plain = tmp / "llama-gqa.gguf"
    shutil.copyfile(models / "llama-gqa.gguf", plain)  # the same weights, no adapters beside
    cfg = tmp / "fitevict.toml"
    cfg.write_text(f"""
[models.plain]
path = "{plain}"
ctx = 512

[models.llama-gqa]
ctx = 512
parallel = 2
""")
    with front_door(tmp, "--config", str(cfg), "--models-dir", str(models)) as fd:
        yield fd


def complete(fd, model: str, **fitevict) -> tuple[str, dict]:
    """Greedy text for the prompt, and the request's load report."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "cache_prompt": False}
    if fitevict:
        body["fitevict"] = fitevict
    r = httpx.post(fd.base_url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"], json.loads(r.headers[HEADER])


def test_models_list_each_adapter_with_its_base(door) -> None:
    data = {m["id"]: m["fitevict"] for m in httpx.get(door.base_url + "/v1/models", timeout=60).json()["data"]}
    assert data["llama-gqa:sql"]["base"] == "llama-gqa" and data["llama-gqa:poem"]["base"] == "llama-gqa"
    assert data["llama-gqa"]["adapters"] == ["llama-gqa:poem", "llama-gqa:sql"]
    assert "adapters" not in data["plain"]


def test_adapters_change_the_output_and_the_base_equals_a_seat_without_them(door) -> None:
    sql, _ = complete(door, "llama-gqa:sql")
    poem, _ = complete(door, "llama-gqa:poem")
    base, report = complete(door, "llama-gqa")
    plain, _ = complete(door, "plain")
    assert sql != poem and sql != base and poem != base
    assert base == plain  # all scales 0, sent explicitly, give exactly the seat without adapters
    assert report["adapter"] is None and report["adapters_on_seat"] == 2
    zero, _ = complete(door, "llama-gqa:sql", lora_scale=0.0)
    assert zero == base  # the requested adapter at scale 0 is the base too


def test_alternating_adapters_load_the_base_once(door) -> None:
    before = [e for e in history(door, event="load") if e["model"] == "llama-gqa"]
    reports = [complete(door, m)[1] for m in ["llama-gqa:sql", "llama-gqa:poem"] * 4]
    loads = [e for e in history(door, event="load") if e["model"] == "llama-gqa"]
    assert len(loads) == 1 and len(before) <= 1  # one base load for every adapter, whichever asked first
    assert not [e for e in history(door) if e["model"] == "llama-gqa" and e["event"] != "load"]  # no reload
    if not before:  # run alone: the first request loaded the base with both adapters
        first, reports = reports[0], reports[1:]
        assert (first["base_hit"], first["adapter_hit"], first["was_cached"]) == (False, False, False)
        assert first["base_load_seconds"] > 0 and first["adapter_load_seconds"] is not None
    assert all(r["base_hit"] and r["adapter_hit"] and r["was_cached"] for r in reports)
    assert all(r["base_load_seconds"] is None and r["evicted"] == [] for r in reports)
    assert {r["adapter"] for r in reports} == {"sql.gguf", "poem.gguf"}

    assert loads[0]["details"]["compute_source"] == "dry-run"  # the engine's dry run ran with the --lora list
    rep = loads[0]["details"]["load_report"]
    assert rep["base_hit"] is False and rep["adapters_on_seat"] == 2
    # the adapters' loading (the engine log's timestamps) is a part of the seat's load, never the whole of it
    assert rep["base_load_seconds"] > 0 and 0 < rep["adapter_load_seconds"] < loads[0]["seconds"]
    # resident bytes: the base plus both adapters, as priced (the log rounds each buffer to 0.01 MiB)
    pred, meas = loads[0]["details"]["predicted"], loads[0]["details"]["measured"]
    p_cpu = next(d for d in pred["devices"] if d["name"] == "CPU")
    m_cpu = next(d for d in meas["devices"] if d["name"] == "CPU")
    assert p_cpu["adapter_bytes"] > 0 and p_cpu["sources"]["adapters"] == "formula"
    assert abs(m_cpu["adapter_bytes"] - p_cpu["adapter_bytes"]) <= 2 * 0.005 * MiB
    assert abs(m_cpu["model_bytes"] - p_cpu["model_bytes"]) <= 0.005 * MiB
    assert rep["resident_bytes_after"]["CPU"] >= p_cpu["adapter_bytes"] + p_cpu["model_bytes"]
    assert rep["resident_source"]["CPU"] == "planned"  # the larger of its PSS and its buffers + overhead
    assert abs(loads[0]["details"]["prediction_error"]) < 0.01  # the whole seat: base + adapters, as priced


def test_the_plan_says_whether_a_request_would_be_a_base_hit(door) -> None:
    complete(door, "llama-gqa:sql")
    plan = httpx.post(door.base_url + "/v1/models/llama-gqa:poem/plan", timeout=60).json()
    assert plan["base"] == "llama-gqa" and plan["base_hit"] is True and plan["adapter_hit"] is True


def test_a_peft_adapter_is_listed_with_its_hf_base(door) -> None:
    """Listed and priced here; served on its base's transformers seat in test_peft_adapters.py."""
    data = {m["id"]: m["fitevict"] for m in httpx.get(door.base_url + "/v1/models", timeout=60).json()["data"]}
    peft = data["tiny-hf:tiny-hf-chat"]
    assert peft["base"] == "tiny-hf" and peft["engine"] == "transformers"
    assert peft["adapter_bytes"]["bytes"] == 2 * 4 * 4 and peft["adapter_bytes"]["source"] == "formula"
    assert data["tiny-hf"]["adapters"] == ["tiny-hf:tiny-hf-chat"]


def test_two_adapters_are_served_concurrently_from_one_seat(door) -> None:
    from concurrent.futures import ThreadPoolExecutor

    alone = {m: complete(door, m)[0] for m in ("llama-gqa:sql", "llama-gqa:poem", "llama-gqa")}
    order = ["llama-gqa:sql", "llama-gqa:poem", "llama-gqa"] * 3
    with ThreadPoolExecutor(len(order)) as pool:
        together = list(pool.map(lambda m: complete(door, m), order))
    assert [text for text, _ in together] == [alone[m] for m in order]  # each request got its own scales
    assert all(rep["base_hit"] for _, rep in together)
    assert len([e for e in history(door, event="load") if e["model"] == "llama-gqa"]) == 1
