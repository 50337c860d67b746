"""The stores in the catalog: names, Ollama's layers used (projector, adapters, params, system), shadowing and
aliases reported, the naming rule's ambiguous names; from a real config over stores in a temporary HOME."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitevict.config import load_config
from fitevict.request.catalog import AmbiguousModel, Catalog, UnknownModel
from fitevict.request.names import shortenings
from fitevict.zoo.stores import tiny_gguf, write_hf_repo, write_lmstudio_repo, write_ollama_model

from .conftest import tree


@pytest.fixture
def home(tmp_path: Path, store_defaults: Path) -> Path:
    """A HOME with the three stores in their default places (the stores' own variables unset)."""
    src, home = tmp_path / "src", store_defaults
    (base,) = tiny_gguf(src / "base.gguf")
    (other,) = tiny_gguf(src / "other.gguf", tensors=2)
    (third,) = tiny_gguf(src / "third.gguf", tensors=3)
    (proj,) = tiny_gguf(src / "mmproj-f16.gguf")
    (lora,) = tiny_gguf(src / "sql.gguf", adapter=True)
    (lora2,) = tiny_gguf(src / "sql2.gguf", adapter=True, tensors=2)
    ollama = home / ".ollama" / "models"
    write_ollama_model(ollama, "llama", base, projector=proj, params={"num_ctx": 2048, "temperature": 0.1})
    write_ollama_model(ollama, "sql", base, adapters=(lora,), system="Answer in SQL.",
                       params={"temperature": 0, "stop": ["```"], "num_thread": 4})
    write_ollama_model(ollama, "lonely", third, tag="v1", adapters=(lora,))
    write_ollama_model(ollama, "duo", base, adapters=(lora, lora2), system="Two at once.")
    hub = home / ".cache" / "huggingface" / "hub"
    write_hf_repo(hub, "unsloth/M-GGUF", {"M-Q4_K_M.gguf": base, "M-Q8_0.gguf": other})
    write_hf_repo(hub, "bob/One-GGUF", {"One-Q4_0.gguf": other})
    lms = home / ".lmstudio" / "models"
    write_lmstudio_repo(lms, "bob/One-GGUF", {"One-Q4_0.gguf": third})
    write_lmstudio_repo(lms, "alice/M-GGUF", {"M.gguf": third})
    return home


def catalog(home: Path, toml: str = "", models_dir: Path | None = None) -> Catalog:
    cfg = home.parent / "fitevict.toml"
    dirs = json.dumps([str(models_dir)] if models_dir else [])
    cfg.write_text(f"models_dirs = {dirs}\n{toml}")
    return Catalog.from_config(load_config(cfg, env={}))


def test_every_store_is_listed_under_its_own_names(home: Path, freeze) -> None:
    before = {s: freeze(home / s) for s in (".ollama", ".cache", ".lmstudio")}
    cat = catalog(home)
    stores = {e.key: e.store for e in cat.entries()}
    assert stores == {"llama:latest": "ollama", "sql:latest": "ollama", "lonely:v1": "ollama", "duo:latest": "ollama",
                      "duo:latest:2": "ollama",
                      "sha256-" + cat.resolve("lonely:v1").base[7:]: "ollama",
                      "unsloth/M-GGUF:Q4_K_M": "hf-cache", "unsloth/M-GGUF:Q8_0": "hf-cache",
                      "bob/One-GGUF": "hf-cache", "alice/M-GGUF": "lmstudio"}
    assert cat.resolve("LLAMA").key == "llama:latest"  # latest implied; names match case-insensitively
    assert cat.resolve("one-gguf").key == cat.resolve("bob~One-GGUF").key == "bob/One-GGUF"  # the old keys
    assert {s: tree(home / s) for s in before} == before  # nothing written to any store


def test_ollama_layers_become_mmproj_adapters_ctx_defaults_and_system(home: Path) -> None:
    cat = catalog(home)
    llama, sql = cat.resolve("llama:latest"), cat.resolve("sql")
    assert llama.mmproj is not None and llama.mmproj.name.startswith("sha256-")
    assert llama.settings.ctx == 2048 and dict(llama.settings.request_defaults) == {"temperature": 0.1}
    assert (sql.kind, sql.base, sql.base_path) == ("lora", "llama:latest", llama.path)  # the adapter, on its base
    assert llama.loras == (sql.path, cat.resolve("duo:latest:2").path)  # the base's seat starts with each adapter once
    assert dict(sql.settings.request_defaults) == {"temperature": 0, "stop": ["```"]}
    assert sql.system == "Answer in SQL." and llama.system is None
    assert any("'sql:latest'" in n and "num_thread" in n and "not applied" in n for n in cat.notes), cat.notes
    lonely = cat.resolve("lonely:v1")  # no manifest serves its model bare: the base is keyed by the blob's digest
    assert lonely.base.startswith("sha256-") and len(lonely.base) == len("sha256-") + 12
    assert cat.resolve(lonely.base).path == lonely.base_path


def test_each_adapter_layer_of_a_manifest_is_an_adapter_of_its_base(home: Path) -> None:
    cat = catalog(home)
    first, second = cat.resolve("duo"), cat.resolve("duo:latest:2")
    assert cat.resolve("duo:latest:1") is first and first.key == "duo:latest"  # the first under the manifest's name
    assert first.path == cat.resolve("sql").path and first.path != second.path  # one blob for sql's and duo's first
    assert {e.kind for e in (first, second)} == {"lora"} and first.base == second.base == "llama:latest"
    assert first.system == second.system == "Two at once." and first.store == second.store == "ollama"
    assert first.loras == second.loras == cat.resolve("llama").loras
    assert not any("duo" in n and "not applied" in n for n in cat.notes), cat.notes


def test_a_name_in_two_stores_is_reported_not_dropped_silently(home: Path) -> None:
    cat = catalog(home)
    assert cat.resolve("bob/One-GGUF").store == "hf-cache"  # the earlier store wins
    assert any("lmstudio model 'bob/One-GGUF'" in n and "shadowed by the hf-cache model" in n
               for n in cat.notes), cat.notes


def test_an_alias_another_model_holds_is_reported(home: Path) -> None:
    models = home.parent / "models"
    tiny_gguf(models / "llama.gguf")
    cat = catalog(home, models_dir=models)
    assert cat.resolve("llama").store == "models-dir" and cat.resolve("llama:latest").aliases == ()
    assert any("'llama'" in n and "not an alias of 'llama:latest'" in n for n in cat.notes), cat.notes


def test_ambiguous_names_list_the_candidates(home: Path) -> None:
    cat = catalog(home)
    with pytest.raises(AmbiguousModel) as err:
        cat.resolve("unsloth/M-GGUF")  # which quantization?
    assert err.value.candidates == ("unsloth/M-GGUF:Q4_K_M", "unsloth/M-GGUF:Q8_0")
    with pytest.raises(AmbiguousModel) as err:
        cat.resolve("M-GGUF")  # which publisher, which quantization?
    assert set(err.value.candidates) == {"alice/M-GGUF", "unsloth/M-GGUF:Q4_K_M", "unsloth/M-GGUF:Q8_0"}
    assert "is ambiguous" in str(err.value) and "alice/M-GGUF" in str(err.value)
    with pytest.raises(UnknownModel) as one:
        cat.resolve("lonely")  # only one model it shortens: offered, not served
    assert not isinstance(one.value, AmbiguousModel) and one.value.close_matches[0] == "lonely:v1"


def test_shortenings() -> None:
    assert shortenings("hf.co/bob/tiny:Q8_0") == {"hf.co/bob/tiny", "bob/tiny", "tiny", "bob/tiny:q8_0",
                                                  "tiny:q8_0"}
    assert shortenings("plain") == set()


def test_config_entries_adjust_store_models_and_stores_switch_off(home: Path) -> None:
    cat = catalog(home, '[models."bob/One-GGUF"]\nctx = 1234\n[models."llama:latest"]\nctx = 512\n'
                        'request_defaults = { top_k = 5 }')
    assert cat.resolve("bob/One-GGUF").settings.ctx == 1234
    llama = cat.resolve("llama")
    assert llama.settings.ctx == 512 and dict(llama.settings.request_defaults) == {"temperature": 0.1, "top_k": 5}
    off = catalog(home, "[stores]\nollama = false\nhf_cache = false")
    assert {e.store for e in off.entries()} == {"lmstudio"} and off.resolve("bob/One-GGUF").store == "lmstudio"


def test_a_rescan_sees_a_new_store_model(home: Path) -> None:
    cat = catalog(home)
    (new,) = tiny_gguf(home.parent / "src" / "new.gguf", tensors=4)
    write_ollama_model(home / ".ollama" / "models", "newcomer", new, tag="1b")
    added, removed = cat.replace_with(catalog(home))
    assert (added, removed) == (["newcomer:1b"], [])
    # a manifest that serves the orphan adapter's model bare becomes its base, in place of the digest key
    write_ollama_model(home / ".ollama" / "models", "third", cat.resolve("alice/M-GGUF").path)
    added, removed = cat.replace_with(catalog(home))
    assert added == ["third:latest"] and removed[0].startswith("sha256-")
    assert cat.resolve("lonely:v1").base == "third:latest"


def test_defaults_and_the_system_message_fill_what_a_request_lacks(home: Path) -> None:
    from fitevict.server.door import with_defaults

    sql = catalog(home).resolve("sql")
    body = {"messages": [{"role": "user", "content": "x"}], "temperature": 1}
    assert with_defaults(sql, body)
    assert body == {"messages": [{"role": "system", "content": "Answer in SQL."}, {"role": "user", "content": "x"}],
                    "temperature": 1, "stop": ["```"]}
    own = {"messages": [{"role": "system", "content": "mine"}], "stop": [], "temperature": 0}
    assert not with_defaults(sql, own) and own["messages"] == [{"role": "system", "content": "mine"}]
