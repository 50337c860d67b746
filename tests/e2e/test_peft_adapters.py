"""PEFT adapters end to end: a real `fitevict serve`, a real transformers seat, the HF demo base and its two demo
PEFT adapters (fitevict.zoo.peft), real HTTP on loopback.

An adapter ``hf-llama-gqa:X`` is served by hf-llama-gqa's seat, started once with both adapters; each request makes
its adapter active on the seat (one at a time), and the base runs with them disabled.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door, history
from fitevict.pricing.peft import adapter_held_bytes, load_peft_adapter
from fitevict.supervisor.loadreport import HEADER
from fitevict.zoo.peft import write_peft_adapters

pytestmark = pytest.mark.e2e

BASE = "hf-llama-gqa"
SQL, POEM = f"{BASE}:sql", f"{BASE}:poem"
PROMPT = "the cat sat on"


@pytest.fixture(scope="module")
def models(hf_zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("peft-models")
    shutil.copytree(hf_zoo[BASE].path, dest / BASE)
    write_peft_adapters(dest / BASE, ("sql", "poem"))  # -> hf-llama-gqa.adapters/{sql,poem}/
    return dest


@pytest.fixture(scope="module")
def door(models: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("peft-door")
    with front_door(tmp, "--models-dir", str(models)) as fd:
        yield fd


def complete(fd, model: str, *, stream: bool = False) -> tuple[str, dict]:
    """Greedy text for the prompt, and the request's load report."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": stream}
    if not stream:
        r = httpx.post(fd.base_url + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"], json.loads(r.headers[HEADER])
    with httpx.stream("POST", fd.base_url + "/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        docs = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        return "".join(d["choices"][0]["text"] for d in docs), json.loads(r.headers[HEADER])


def test_models_list_each_peft_adapter_with_its_base(door) -> None:
    data = {m["id"]: m["fitevict"] for m in httpx.get(door.base_url + "/v1/models", timeout=60).json()["data"]}
    assert data[SQL]["base"] == BASE and data[SQL]["engine"] == "transformers"
    assert data[BASE]["adapters"] == [POEM, SQL]
    assert data[SQL]["adapter_bytes"]["source"] == "formula"


def test_alternating_adapters_load_the_base_once_and_each_changes_the_output(door, models: Path) -> None:
    order = [SQL, POEM] * 3
    got = [complete(door, m) for m in order]
    base, base_report = complete(door, BASE)
    texts = {m: t for m, (t, _) in zip(order, got)}
    assert all(t == texts[m] for m, (t, _) in zip(order, got))  # greedy: each adapter answers the same each time
    assert len({texts[SQL], texts[POEM], base}) == 3  # the adapters really change the output
    loads = [e for e in history(door, event="load") if e["model"] == BASE]
    assert len(loads) == 1  # one base load for both adapters
    assert not [e for e in history(door) if e["model"] == BASE and e["event"] != "load"]  # no reload, no eviction

    first, rest = got[0][1], [r for _, r in got[1:]]
    assert (first["base_hit"], first["adapter_hit"], first["was_cached"]) == (False, False, False)
    assert first["base_load_seconds"] > 0 and first["adapter_load_seconds"] > 0
    assert all(r["base_hit"] and r["adapter_hit"] and r["was_cached"] for r in rest)
    assert all(r["base_load_seconds"] is None and r["evicted"] == [] for r in rest)
    assert {r["adapter"] for r in rest} == {"sql", "poem"} and base_report["adapter"] is None
    # every request switched (sql, poem, sql, ...): the seat measured each switch, which costs less than the base's
    # load it spares (the budget a switch is measured against, not a wall-clock figure), and said so
    spared = first["base_load_seconds"]
    assert all(r["activate_seconds"] is not None and 0 < r["activate_seconds"] < spared for _, r in got), \
        ([r["activate_seconds"] for _, r in got], spared)
    assert all(any("switching from the previous request" in n for n in r["notes"]) for r in rest)
    assert any("disabled" in n for n in base_report["notes"]) and base_report["activate_seconds"] is not None

    d = loads[0]["details"]
    rep = d["load_report"]  # the history's own copy of the load
    assert (rep["base_hit"], rep["adapters_on_seat"]) == (False, 2) and rep["adapter_load_seconds"] > 0
    # resident bytes: the base plus both adapters, each term as priced to the byte (the walk against the headers)
    p_cpu = next(x for x in d["predicted"]["devices"] if x["name"] == "CPU")
    m_cpu = next(x for x in d["measured"]["devices"] if x["name"] == "CPU")
    held = sum(adapter_held_bytes(load_peft_adapter(f), None) for f in sorted((models / f"{BASE}.adapters").iterdir()))
    assert p_cpu["adapter_bytes"] == m_cpu["adapter_bytes"] == held > 0
    assert (p_cpu["sources"]["adapters"], m_cpu["sources"]["adapters"]) == ("formula", "measured")
    assert p_cpu["model_bytes"] == m_cpu["model_bytes"]
    assert rep["resident_bytes_after"]["CPU"] >= p_cpu["model_bytes"] + p_cpu["adapter_bytes"]
    print(f"peft e2e: adapters {held} B predicted = measured; switches "
          f"{[r['activate_seconds'] for _, r in got]} s; base load {first['base_load_seconds']:.3f} s, "
          f"adapters {first['adapter_load_seconds']:.4f} s")


def test_the_plan_says_an_adapter_request_would_be_a_base_hit(door) -> None:
    complete(door, SQL)
    plan = httpx.post(door.base_url + f"/v1/models/{POEM}/plan", timeout=60).json()
    assert plan["base"] == BASE and plan["base_hit"] is True and plan["adapter_hit"] is True


def test_concurrent_requests_for_both_adapters_each_get_their_own(door) -> None:
    alone = {m: complete(door, m)[0] for m in (SQL, POEM, BASE)}
    assert complete(door, POEM, stream=True)[0] == alone[POEM]  # a stream switches the same way
    order = [SQL, POEM, BASE] * 3
    with ThreadPoolExecutor(len(order)) as pool:
        together = list(pool.map(lambda m: complete(door, m), order))
    assert [text for text, _ in together] == [alone[m] for m in order]  # switches serialized on the seat
    assert all(rep["base_hit"] for _, rep in together)
    assert len([e for e in history(door, event="load") if e["model"] == BASE]) == 1


def test_the_ollama_route_switches_adapters_too(door) -> None:
    def generate(model: str) -> str:
        r = httpx.post(door.base_url + "/api/generate", timeout=300, json={
            "model": model, "prompt": PROMPT, "raw": True, "stream": False,
            "options": {"temperature": 0, "num_predict": 8}})
        assert r.status_code == 200, r.text
        return r.json()["response"]

    assert {m: generate(m) for m in (SQL, POEM, BASE)} == {m: complete(door, m)[0] for m in (SQL, POEM, BASE)}


def test_a_seat_with_adapters_learns_its_own_overhead(models: Path, hf_zoo: dict, tmp_path: Path) -> None:
    """peft's import is a seat's own overhead too (measured: ~136 MiB committed): a seat with adapters learns its
    process overhead apart from a plain seat, so on the next run each is priced whole, the process included."""
    plain = tmp_path / "plain"
    shutil.copytree(hf_zoo[BASE].path, plain / "hf-plain")  # the same weights, no adapters: a seat without peft
    dirs = ("--models-dir", str(models), "--models-dir", str(plain))
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        with front_door(tmp_path / run, *dirs, "--data-dir", str(tmp_path / "a" / "data")) as fd:
            complete(fd, SQL)
            complete(fd, "hf-plain")
            loads = {e["model"]: e for e in reversed(history(fd, event="load"))}  # the newest of each
    figures = {}
    for key in (BASE, "hf-plain"):
        d = loads[key]["details"]
        assert any("seat's own overhead" in n for n in d["predicted"]["notes"]), d["predicted"]["notes"]
        predicted = d["predicted"]["host"]["committed_bytes"] + d["predicted"]["host"]["mapped_bytes"]
        measured = d["host_pss"]["committed_bytes"] + d["host_pss"]["mapped_bytes"]  # the seat process's PSS
        figures[key] = (predicted, measured)
    print(f"learned overheads, host bytes (predicted, measured): {figures}")
    # shared library pages are split among every process mapping them (PSS), so a busy machine moves both a few %;
    # one overhead for both kinds of seat would be off by peft's ~136 MiB, a third of this seat
    assert all(abs(p - m) / m < 0.08 for p, m in figures.values()), figures
    assert figures[BASE][0] - figures["hf-plain"][0] > 32 << 20  # the seat with adapters is priced with peft
