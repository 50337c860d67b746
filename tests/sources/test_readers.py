"""The store readers on real layouts (Ollama manifests and blobs, a hub cache with refs and links, LM Studio's
folders) built in a temporary HOME and made read-only: names, layers, quantizations, splits, and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitevict.config import ConfigError, StoresConfig, load_config
from fitevict.sources import quant_of, read_stores, store_lines, store_roots
from fitevict.sources import hfcache, lmstudio, ollama
from fitevict.zoo.stores import tiny_gguf, write_hf_repo, write_lmstudio_repo, write_ollama_model

from .conftest import tree


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    src = tmp_path / "src"
    (base,) = tiny_gguf(src / "base.gguf")
    (other,) = tiny_gguf(src / "other.gguf", tensors=2)
    (proj,) = tiny_gguf(src / "mmproj-base-f16.gguf")
    (lora,) = tiny_gguf(src / "sql.gguf", adapter=True)
    shards = tiny_gguf(src / "split" / "m-F16.gguf", tensors=2, split_max_tensors=1)
    return {"base": base, "other": other, "proj": proj, "lora": lora, "shard1": shards[0], "shard2": shards[1]}


def test_ollama_names_layers_and_aliases(tmp_path: Path, files: dict[str, Path], freeze) -> None:
    root = tmp_path / "home" / ".ollama" / "models"
    write_ollama_model(root, "llava", files["base"], projector=files["proj"], template="{{ .Prompt }}")
    write_ollama_model(root, "sql", files["base"], tag="7b", adapters=(files["lora"],), system="Answer in SQL.",
                       params={"num_ctx": 2048, "stop": ["</s>"], "temperature": 0.2})
    write_ollama_model(root, "tiny", files["other"], namespace="alice")
    write_ollama_model(root, "tiny", files["other"], registry="hf.co", namespace="bob", tag="Q8_0")
    before = freeze(root)
    scan = ollama.read(root)
    got = {m.name: m for m in scan.models}
    assert sorted(got) == ["alice/tiny:latest", "hf.co/bob/tiny:Q8_0", "llava:latest", "sql:7b"]
    llava, sql = got["llava:latest"], got["sql:7b"]
    assert llava.aliases == ("llava",) and sql.aliases == ()  # latest is implied; other tags are not
    assert llava.path.read_bytes() == files["base"].read_bytes() and llava.path.name.startswith("sha256-")
    assert llava.path == sql.path  # one blob, shared by digest
    assert llava.mmproj is not None and llava.mmproj.read_bytes() == files["proj"].read_bytes()
    assert llava.template == "{{ .Prompt }}" and llava.system is None and dict(llava.params) == {}
    assert [a.read_bytes() for a in sql.adapters] == [files["lora"].read_bytes()]
    assert dict(sql.params) == {"num_ctx": 2048, "stop": ["</s>"], "temperature": 0.2}
    assert sql.system == "Answer in SQL." and all(m.store == "ollama" and m.kind == "gguf" for m in scan.models)
    assert any("llava:latest" in n and "GGUF's own chat template" in n for n in scan.notes), scan.notes
    assert tree(root) == before


def test_ollama_skips_what_it_cannot_serve_with_a_note(tmp_path: Path, files: dict[str, Path], freeze) -> None:
    root = tmp_path / "ollama"
    write_ollama_model(root, "gone", files["base"])
    write_ollama_model(root, "fine", files["base"])
    (tmp_path / "weights.bin").write_bytes(b"safetensors, not GGUF")
    write_ollama_model(root, "other-format", tmp_path / "weights.bin")
    gone_manifest = root / "manifests" / "registry.ollama.ai" / "library" / "gone" / "latest"
    doc = json.loads(gone_manifest.read_text())
    doc["layers"][0]["digest"] = "sha256:" + "0" * 64
    gone_manifest.write_text(json.dumps(doc))
    (root / "manifests" / "stray").write_text("{}")
    freeze(root)
    scan = ollama.read(root)
    assert [m.name for m in scan.models] == ["fine:latest"]
    assert any("'other-format:latest'" in n and "not one GGUF file" in n for n in scan.notes), scan.notes
    assert any("'gone:latest'" in n and "is missing" in n for n in scan.notes), scan.notes
    assert any("stray" in n and "<registry>/<namespace>/<name>/<tag>" in n for n in scan.notes), scan.notes


def test_hf_cache_quantizations_splits_and_refs_main(tmp_path: Path, files: dict[str, Path], freeze) -> None:
    hub = tmp_path / "hub"
    write_hf_repo(hub, "unsloth/M-GGUF", {"M-Q4_K_M.gguf": files["base"]}, revision="a" * 40)
    write_hf_repo(hub, "unsloth/M-GGUF", {"M-Q4_K_M.gguf": files["base"], "M-IQ4_XS.gguf": files["other"],
                                         "F16/m-F16-00001-of-00002.gguf": files["shard1"],
                                         "F16/m-F16-00002-of-00002.gguf": files["shard2"],
                                         "mmproj-F16.gguf": files["proj"]}, revision="b" * 40)
    write_hf_repo(hub, "bob/One-GGUF", {"one.gguf": files["other"]})
    hf = tmp_path / "hfsrc"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"\x08" + bytes(7) + b"{}      ")
    write_hf_repo(hub, "Qwen/Qwen3-0.6B", {n: hf / n for n in ("config.json", "model.safetensors")})
    before = freeze(hub)
    scan = hfcache.read(hub)
    got = {m.name: m for m in scan.models}
    assert sorted(got) == ["Qwen/Qwen3-0.6B", "bob/One-GGUF", "unsloth/M-GGUF:F16", "unsloth/M-GGUF:IQ4_XS",
                           "unsloth/M-GGUF:Q4_K_M"]
    snap = hub / "models--unsloth--M-GGUF" / "snapshots" / ("b" * 40)  # refs/main's, not the older one
    f16 = got["unsloth/M-GGUF:F16"]
    assert f16.path == snap / "F16" / "m-F16-00001-of-00002.gguf" and len(f16.files) == 2  # a split is one model
    assert f16.model_dir == snap and f16.mmproj == snap / "mmproj-F16.gguf"
    assert f16.gguf_files == ("M-IQ4_XS.gguf", "M-Q4_K_M.gguf", "F16/m-F16-00001-of-00002.gguf")
    assert got["unsloth/M-GGUF:Q4_K_M"].aliases == ("M-Q4_K_M", "M-GGUF~M-Q4_K_M", "unsloth~M-GGUF~M-Q4_K_M")
    assert got["bob/One-GGUF"].aliases == ("One-GGUF", "bob~One-GGUF")
    qwen = got["Qwen/Qwen3-0.6B"]
    assert (qwen.kind, qwen.files) == ("hf", (qwen.path / "model.safetensors",))
    assert tree(hub) == before


def test_hf_cache_without_refs_takes_the_only_snapshot_and_never_picks_one_of_several(tmp_path: Path,
                                                                                      files: dict[str, Path]) -> None:
    hub = tmp_path / "hub"
    write_hf_repo(hub, "a/One", {"one.gguf": files["base"]}, current=False)
    write_hf_repo(hub, "b/Two", {"x.gguf": files["base"]}, revision="1" * 40, current=False)
    write_hf_repo(hub, "b/Two", {"x.gguf": files["base"]}, revision="2" * 40, current=False)
    scan = hfcache.read(hub)
    assert [m.name for m in scan.models] == ["a/One"]
    assert any("models--b--Two" in n and "none is marked current" in n for n in scan.notes), scan.notes


def test_lmstudio_publisher_repo_and_quantizations(tmp_path: Path, files: dict[str, Path], freeze) -> None:
    root = tmp_path / "lms"
    write_lmstudio_repo(root, "lmstudio-community/Qwen3-GGUF", {"Qwen3-Q4_K_M.gguf": files["base"],
                                                               "Qwen3-q8_0.gguf": files["other"]})
    write_lmstudio_repo(root, "bartowski/Phi-GGUF", {"Phi.gguf": files["base"], "mmproj-Phi-f16.gguf": files["proj"]})
    before = freeze(root)
    got = {m.name: m for m in lmstudio.read(root).models}
    assert sorted(got) == ["bartowski/Phi-GGUF", "lmstudio-community/Qwen3-GGUF:Q4_K_M",
                           "lmstudio-community/Qwen3-GGUF:Q8_0"]
    assert got["bartowski/Phi-GGUF"].mmproj == root / "bartowski" / "Phi-GGUF" / "mmproj-Phi-f16.gguf"
    assert all(m.store == "lmstudio" for m in got.values())
    assert tree(root) == before


@pytest.mark.parametrize(("stem", "quant"), [("Qwen3-8B-Q4_K_M", "Q4_K_M"), ("gemma-3-4b-it-q4_0", "Q4_0"),
                                             ("m-IQ4_XS", "IQ4_XS"), ("Llama-3.2-1B-Instruct-f16", "F16"),
                                             ("x.BF16", "BF16"), ("Qwen3-UD-Q4_K_XL", "UD-Q4_K_XL"),
                                             ("model", None), ("Q4vision", None)])
def test_quant_of(stem: str, quant: str | None) -> None:
    assert quant_of(stem) == quant


def test_default_locations_follow_the_stores_own_variables(tmp_path: Path, files: dict[str, Path],
                                                          store_defaults: Path) -> None:
    home = store_defaults
    env = {"HOME": str(home)}
    assert store_roots(StoresConfig(), env) == []  # no store where none exists
    write_ollama_model(home / ".ollama" / "models", "m", files["base"])
    write_lmstudio_repo(home / ".cache" / "lm-studio" / "models", "p/r", {"r.gguf": files["base"]})
    write_hf_repo(tmp_path / "hfhome" / "hub", "o/n", {"n.gguf": files["base"]})
    env["HF_HOME"] = str(tmp_path / "hfhome")
    assert store_roots(StoresConfig(), env) == [("ollama", home / ".ollama" / "models"),
                                                ("hf-cache", tmp_path / "hfhome" / "hub"),
                                                ("lmstudio", home / ".cache" / "lm-studio" / "models")]
    env["OLLAMA_MODELS"] = str(tmp_path / "elsewhere")
    env["HF_HUB_CACHE"] = str(tmp_path / "hfhome" / "hub")
    assert [s for s, _ in store_roots(StoresConfig(lmstudio=False), env)] == ["hf-cache"]
    scans = read_stores(StoresConfig(ollama=home / ".ollama" / "models"), env)
    assert [(s.store, [m.name for m in s.models]) for s in scans] == [
        ("ollama", ["m:latest"]), ("hf-cache", ["o/n"]), ("lmstudio", ["p/r"])]
    with pytest.raises(ConfigError, match=r"stores\.hf_cache = '.*nowhere': not a folder"):
        store_roots(StoresConfig(hf_cache=tmp_path / "nowhere"), env)


def test_the_stores_own_variables_point_elsewhere(tmp_path: Path, files: dict[str, Path],
                                                  store_defaults: Path) -> None:
    """OLLAMA_MODELS; HF_HUB_CACHE over HF_HOME over XDG_CACHE_HOME, as the hub library reads them."""
    write_ollama_model(store_defaults / ".ollama" / "models", "home", files["base"])
    write_ollama_model(tmp_path / "ollama", "moved", files["base"])
    for where in ("hub", "hfhome/hub", "xdg/huggingface/hub"):
        write_hf_repo(tmp_path / where, f"o/{where.replace('/', '-')}", {"n.gguf": files["base"]})
    env = {"HOME": str(store_defaults), "OLLAMA_MODELS": str(tmp_path / "ollama"),
           "XDG_CACHE_HOME": str(tmp_path / "xdg")}

    def names(**more: str) -> list[str]:
        return [m.name for s in read_stores(StoresConfig(lmstudio=False), {**env, **more}) for m in s.models]

    assert names() == ["moved:latest", "o/xdg-huggingface-hub"]
    assert names(HF_HOME=str(tmp_path / "hfhome")) == ["moved:latest", "o/hfhome-hub"]
    assert names(HF_HOME=str(tmp_path / "hfhome"), HF_HUB_CACHE=str(tmp_path / "hub")) == ["moved:latest", "o/hub"]


def test_the_tests_read_no_store_of_the_machine_running_them(tmp_path: Path, files: dict[str, Path],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A HOME holding all three stores (as a developer's might) is not read: not in this process, not in a
    process the tests start (tests/conftest.py)."""
    import os
    import subprocess
    import sys

    home = tmp_path / "home"
    write_ollama_model(home / ".ollama" / "models", "m", files["base"])
    write_hf_repo(home / ".cache" / "huggingface" / "hub", "o/n", {"n.gguf": files["base"]})
    write_lmstudio_repo(home / ".lmstudio" / "models", "p/r", {"r.gguf": files["base"]})
    monkeypatch.setenv("HOME", str(home))
    for var in ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    assert read_stores(StoresConfig()) == [] and read_stores(load_config(None, env={}).stores) == []
    child = ("from fitevict.config import load_config; from fitevict.sources import read_stores; "
             "print(len(read_stores(load_config().stores)))")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True,
                         env={**os.environ, "FITEVICT_CONFIG": ""}).stdout
    assert out.strip() == "0"


def test_serve_says_where_each_store_was_read_or_why_not(tmp_path: Path, files: dict[str, Path]) -> None:
    root = tmp_path / "lms"
    write_lmstudio_repo(root, "bartowski/Phi-GGUF", {"Phi.gguf": files["base"]})
    cfg = StoresConfig(ollama=False, hf_cache=True, lmstudio=str(root))
    off, absent, read = store_lines(cfg, read_stores(cfg))
    assert off == "ollama store: off (stores.ollama = false)"
    assert absent.startswith("hf-cache store: none at ")  # its default location (none in the tests)
    assert read == f"lmstudio store at {root}: 1 model(s)"
