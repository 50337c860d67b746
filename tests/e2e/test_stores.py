"""The stores people already have, served by a real ``fitevict serve`` with real llama-server seats: an Ollama
store (a model with a projector and params; a manifest with two adapter layers on it and a system message), a
Hugging Face hub cache with two quantizations in one snapshot, and an LM Studio folder, all in their default places
under a temporary HOME (no store variable, no config file, no models dir), made read-only. Each answers through the
openai client and the ollama API under its tool's name; an ambiguous name answers 400 with the candidates; nothing
is written to any store."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from _frontdoor import front_door
from fitevict.paths import cache_dir
from fitevict.pricing.gguf import load_structure
from fitevict.zoo.gguf_adapters import write_adapter
from fitevict.zoo.mmproj import write_mmproj
from fitevict.zoo.stores import write_hf_repo, write_lmstudio_repo, write_ollama_model
from sources.conftest import set_writable, tree

pytestmark = pytest.mark.e2e

STORES = (".ollama", ".cache/huggingface", ".lmstudio")
UNSET = ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "FITEVICT_OLLAMA", "FITEVICT_HF_CACHE",
         "FITEVICT_LMSTUDIO", "XDG_CONFIG_HOME")
ONE_OF_EACH = ("sql", "zoo/tiny-GGUF:F16", "pub/tiny-GGUF")


@pytest.fixture(scope="module")
def home(zoo: dict, tmp_path_factory: pytest.TempPathFactory):
    """A HOME with the three stores in their default places, read-only while the module runs."""
    src, home = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("home")
    gqa, tied = zoo["llama-gqa"].path, zoo["llama-tied"].path
    base = src / "llama-gqa.gguf"
    shutil.copyfile(gqa, base)
    lora, lora2 = (write_adapter(base, "llama-gqa", n).path for n in ("sql", "chat"))
    proj = write_mmproj(src / "mmproj-f16.gguf", n_embd_text=load_structure(gqa).n_embd)
    models = home / ".ollama" / "models"
    write_ollama_model(models, "tiny", gqa, projector=proj, template="{{ .Prompt }}",
                       params={"num_ctx": 1024, "temperature": 0, "num_predict": 4})
    write_ollama_model(models, "sql", gqa, projector=proj, adapters=(lora, lora2), system="You write SQL.",
                       params={"num_ctx": 1024, "temperature": 0})
    write_hf_repo(home / ".cache" / "huggingface" / "hub", "zoo/tiny-GGUF",
                  {"tiny-F16.gguf": gqa, "tiny-F32.gguf": tied})
    write_lmstudio_repo(home / ".lmstudio" / "models", "pub/tiny-GGUF", {"tiny-F16.gguf": gqa})
    for s in STORES:
        set_writable(home / s, False)
    yield home
    for s in STORES:
        set_writable(home / s, True)


@pytest.fixture(scope="module")
def door(home: Path, llama_server: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("stores-door")
    env = {"HOME": str(home), "FITEVICT_CACHE_DIR": str(cache_dir()), "FITEVICT_LLAMA_SERVER": str(llama_server),
           **dict.fromkeys(UNSET)}  # no store variable and no switch: the stores' default places under HOME
    before = {s: tree(home / s) for s in STORES}
    with front_door(tmp, env=env) as fd:
        yield fd
    assert {s: tree(home / s) for s in STORES} == before  # nothing written to any store


def test_each_store_is_listed_under_its_tools_names(door) -> None:
    data = httpx.get(door.base_url + "/v1/models", timeout=30).json()["data"]
    listed = {m["id"]: m["fitevict"]["store"] for m in data}
    assert listed == {"tiny:latest": "ollama", "sql:latest": "ollama", "sql:latest:2": "ollama",
                      "zoo/tiny-GGUF:F16": "hf-cache",
                      "zoo/tiny-GGUF:F32": "hf-cache", "pub/tiny-GGUF": "lmstudio"}
    tags = {m.model: m for m in ollama.Client(host=door.base_url, timeout=60).list().models}
    assert set(tags) == set(listed)


@pytest.mark.parametrize("name", ONE_OF_EACH)
def test_one_model_of_each_store_answers_both_apis(door, name: str) -> None:
    client = openai.OpenAI(base_url=door.base_url + "/v1", api_key="unused", timeout=300)
    r = client.chat.completions.create(model=name, max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens == 3
    c = ollama.Client(host=door.base_url, timeout=300)
    o = c.chat(model=name, messages=[{"role": "user", "content": "hi"}], options={"num_predict": 2})
    assert o.done and o.eval_count == 2


def test_ollama_layers_are_used(door) -> None:
    c = ollama.Client(host=door.base_url, timeout=300)
    g = c.generate(model="tiny", prompt="once upon")  # params: num_predict 4, temperature 0
    assert g.done and g.eval_count == 4
    assert g.response == c.generate(model="tiny:latest", prompt="once upon").response  # greedy: the same text
    residents = httpx.get(door.base_url + "/v1/models/residents", timeout=30).json()["data"]
    seat = next(v for v in residents if v["key"] == "tiny:latest")
    assert seat["ctx"] == 1024 and seat["store"] == "ollama"  # num_ctx is the load contract's ctx
    sql = c.chat(model="sql", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 3})
    assert sql.done and sql.model == "sql:latest"  # the adapter, on the base's seat with its projector
    second = c.chat(model="sql:latest:2", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 3})
    assert second.done and second.model == "sql:latest:2"  # the manifest's second adapter layer, on the same seat
    residents = httpx.get(door.base_url + "/v1/models/residents", timeout=30).json()["data"]
    assert [v["key"] for v in residents].count("tiny:latest") == 1  # one seat for the base and both adapters


def test_an_ambiguous_name_answers_400_with_the_candidates(door) -> None:
    r = httpx.post(door.base_url + "/v1/chat/completions", timeout=30, json={
        "model": "zoo/tiny-GGUF", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    assert r.json()["error"]["candidates"] == ["zoo/tiny-GGUF:F16", "zoo/tiny-GGUF:F32"]
    with pytest.raises(ollama.ResponseError) as err:
        ollama.Client(host=door.base_url, timeout=30).chat(model="tiny-GGUF",
                                                           messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 400
    assert "pub/tiny-GGUF" in str(err.value) and "zoo/tiny-GGUF:F16" in str(err.value)
    r = httpx.post(door.base_url + "/v1/models/zoo/tiny-GGUF:F32/load", timeout=300)
    assert r.status_code == 200 and r.json()["model"] == "zoo/tiny-GGUF:F32"  # a slash in an admin route
