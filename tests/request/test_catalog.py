"""Model discovery on real folders of tiny, valid GGUF files (written with gguf.GGUFWriter)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from fitevict.config import ConfigError, load_config
from fitevict.engines import REGISTRY
from fitevict.request.catalog import AmbiguousModel, Catalog, GgufFileError, UnknownModel, resolve_gguf_file
from fitevict.zoo.stores import tiny_gguf, write_hf_repo


def make_gguf(path: Path, *, tensors: int = 1, split_max_tensors: int = 0) -> list[Path]:
    """Write a valid GGUF (or a split of ``tensors`` parts); returns the files written."""
    return tiny_gguf(path, tensors=tensors, split_max_tensors=split_max_tensors)


def make_hf(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    header = json.dumps({"w": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    return folder


def catalog_for(tmp_path: Path, toml: str = "", *dirs: Path) -> Catalog:
    """The catalog of a real config file (with models_dirs) read the way the server reads it."""
    cfg = tmp_path / "fitevict.toml"
    listed = ", ".join(json.dumps(str(d)) for d in dirs)
    cfg.write_text(f"models_dirs = [{listed}]\n{toml}")
    return Catalog.from_config(load_config(cfg, env={}))


def test_flat_dir_keys_are_stems_matched_case_insensitively(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (a,) = make_gguf(root / "Qwen3-8B-Q4_K_M.gguf")
    make_gguf(root / "tiny.gguf", tensors=3)
    (root / "notes.txt").write_text("not a model")
    cat = catalog_for(tmp_path, "", root)
    assert [e.key for e in cat.entries()] == ["Qwen3-8B-Q4_K_M", "tiny"]
    e = cat.resolve("qwen3-8b-q4_k_m")
    assert e.key == "Qwen3-8B-Q4_K_M" and e.path == a and e.model_dir == root
    assert e.engine == "llama-server" and e.llama_servable and e.kind == "gguf"
    assert e.file_bytes == a.stat().st_size
    assert e.gguf_files == ("Qwen3-8B-Q4_K_M.gguf",)  # a flat dir: only its own file
    assert e.settings.key == e.key and e.aliases == () and not e.pinned and e.mmproj is None
    assert cat.resolve("TINY").file_bytes > e.file_bytes  # three tensors against one


def test_nested_repos_get_repo_keys_and_owner_on_collision(tmp_path: Path) -> None:
    root = tmp_path / "models"
    make_gguf(root / "alice" / "llama-gguf" / "llama-q4.gguf")
    make_gguf(root / "bob" / "llama-gguf" / "llama-q8.gguf")
    make_gguf(root / "carol" / "phi-gguf" / "phi.gguf")
    cat = catalog_for(tmp_path, "", root)
    assert sorted(e.key for e in cat.entries()) == ["alice~llama-gguf", "bob~llama-gguf", "phi-gguf"]
    assert cat.resolve("bob~llama-gguf").path.name == "llama-q8.gguf"
    with pytest.raises(UnknownModel) as err:
        cat.resolve("llama-gguf")
    assert err.value.name == "llama-gguf"
    assert {"alice~llama-gguf", "bob~llama-gguf"} <= set(err.value.close_matches)
    assert "did you mean" in str(err.value)


def test_two_quantizations_in_one_repo_with_mmproj(tmp_path: Path) -> None:
    repo = tmp_path / "models" / "google" / "gemma-3-4b-it-GGUF"
    (q4,) = make_gguf(repo / "gemma-3-4b-it-Q4_K_M.gguf")
    (q8,) = make_gguf(repo / "gemma-3-4b-it-Q8_0.gguf", tensors=2)
    make_gguf(repo / "mmproj-model-f32.gguf")
    (f16,) = make_gguf(repo / "mmproj-model-f16.gguf")
    cat = catalog_for(tmp_path, "", tmp_path / "models")
    assert [e.key for e in cat.entries()] == ["gemma-3-4b-it-Q4_K_M", "gemma-3-4b-it-Q8_0"]  # projectors not listed
    for e, own in zip(cat.entries(), (q4, q8)):
        assert e.path == own and e.model_dir == repo
        assert e.mmproj == f16  # f16 preferred over f32
        assert e.gguf_files == ("gemma-3-4b-it-Q4_K_M.gguf", "gemma-3-4b-it-Q8_0.gguf")
    with pytest.raises(UnknownModel):
        cat.resolve("mmproj-model-f16")


def test_mmproj_in_a_flat_dir_goes_to_the_matching_model(tmp_path: Path) -> None:
    root = tmp_path / "models"
    make_gguf(root / "llava-v1.6-Q4_K_M.gguf")
    make_gguf(root / "llava-v1.6-Q8_0.gguf")
    make_gguf(root / "qwen3-0.6b.gguf")
    (proj,) = make_gguf(root / "mmproj-llava-v1.6-f16.gguf")
    cat = catalog_for(tmp_path, "", root)
    assert cat.resolve("llava-v1.6-Q4_K_M").mmproj == proj
    assert cat.resolve("llava-v1.6-Q8_0").mmproj == proj
    assert cat.resolve("qwen3-0.6b").mmproj is None
    assert len(cat) == 3


def test_split_gguf_is_one_model(tmp_path: Path) -> None:
    root = tmp_path / "models"
    shards = make_gguf(root / "big.gguf", tensors=3, split_max_tensors=1)
    assert [p.name for p in shards] == [f"big-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    cat = catalog_for(tmp_path, "", root)
    (e,) = cat.entries()
    assert e.key == "big" and e.path == shards[0] and e.files == tuple(shards)
    assert e.file_bytes == sum(p.stat().st_size for p in shards)
    shards[1].unlink()
    cat = catalog_for(tmp_path, "", root)
    assert cat.entries() == ()
    assert any("big" in n and "lacks part(s) 00002" in n for n in cat.notes)


def test_hf_dir_is_listed_but_not_servable_by_llama_server(tmp_path: Path) -> None:
    root = tmp_path / "models"
    hf = make_hf(root / "Qwen" / "Qwen3-0.6B")
    cat = catalog_for(tmp_path, "", root)
    e = cat.resolve("qwen3-0.6b")
    assert (e.kind, e.engine, e.llama_servable, e.path) == ("hf", "transformers", False, hf)
    assert e.file_bytes == (hf / "model.safetensors").stat().st_size
    with pytest.raises(ConfigError, match=r"models\.Qwen3-0\.6B\.engine = 'llama-server'.*cannot load.*"
                                          r"use engine 'transformers'"):
        catalog_for(tmp_path, '[models."Qwen3-0.6B"]\nengine = "llama-server"', root)


def test_an_engine_no_registry_has_is_refused_with_those_there_are(tmp_path: Path) -> None:
    root = tmp_path / "models"
    make_hf(root / "Qwen" / "Qwen3-0.6B")
    with pytest.raises(ConfigError, match=r"models\.Qwen3-0\.6B\.engine = 'ollama': unknown engine 'ollama'; "
                                          r"available engines: " + re.escape(", ".join(sorted(REGISTRY)))):
        catalog_for(tmp_path, '[models."Qwen3-0.6B"]\nengine = "ollama"', root)


def test_a_diffusers_pipeline_is_one_hf_model_with_its_components_weights(tmp_path: Path) -> None:
    root = tmp_path / "models"
    pipe = root / "tiny-ddpm"
    make_hf(pipe / "unet")
    (pipe / "scheduler").mkdir()
    (pipe / "scheduler" / "scheduler_config.json").write_text("{}")
    (pipe / "model_index.json").write_text(json.dumps({"_class_name": "DDPMPipeline", "unet": ["diffusers", "U"]}))
    cat = catalog_for(tmp_path, "", root)
    e = cat.resolve("tiny-ddpm")
    assert (e.kind, e.engine, e.path) == ("hf", "transformers", pipe)
    assert e.file_bytes == (pipe / "unet" / "model.safetensors").stat().st_size
    with pytest.raises(UnknownModel):
        cat.resolve("unet")  # a component is not a model of its own


def test_hf_hub_cache_layout(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--unsloth--Qwen3-0.6B-GGUF"
    blob = repo / "blobs" / "abc123"
    make_gguf(blob.parent / "tmp.gguf")
    (blob.parent / "tmp.gguf").rename(blob)
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "Qwen3-0.6B-Q4_K_M.gguf").symlink_to(os.path.relpath(blob, snap))
    (q4,) = make_gguf(tmp_path / "src" / "M-Q4_K_M.gguf")
    (q8,) = make_gguf(tmp_path / "src" / "M-Q8_0.gguf", tensors=2)
    write_hf_repo(tmp_path / "hub", "bob/M-GGUF", {"M-Q4_K_M.gguf": q4}, revision="1" * 40)
    write_hf_repo(tmp_path / "hub", "bob/M-GGUF", {"M-Q4_K_M.gguf": q4, "M-Q8_0.gguf": q8}, revision="2" * 40)
    cat = catalog_for(tmp_path, "", tmp_path / "hub")
    e = cat.resolve("unsloth/Qwen3-0.6B-GGUF")  # the name the store reader gives, in a models dir too
    assert e.aliases == ("Qwen3-0.6B-GGUF", "unsloth~Qwen3-0.6B-GGUF") and e.store == "models-dir"  # older keys
    assert e.model_dir == snap and e.file_bytes == blob.stat().st_size
    # the snapshot's link into blobs/ stays inside the cached repo, so it may be picked
    assert resolve_gguf_file(e, "Qwen3-0.6B-Q4_K_M.gguf") == snap / "Qwen3-0.6B-Q4_K_M.gguf"
    q8e = cat.resolve("bob/M-GGUF:Q8_0")  # refs/main's snapshot, one model per quantization
    assert q8e.model_dir.name == "2" * 40 and cat.resolve("M-Q8_0") is q8e and cat.resolve("bob~M-GGUF~M-Q8_0") is q8e
    assert sorted(x.key for x in cat.entries()) == ["bob/M-GGUF:Q4_K_M", "bob/M-GGUF:Q8_0", "unsloth/Qwen3-0.6B-GGUF"]
    write_hf_repo(tmp_path / "hub", "alice/Qwen3-0.6B-GGUF", {"x.gguf": q8})  # two repos of one name
    with pytest.raises(AmbiguousModel) as err:
        catalog_for(tmp_path, "", tmp_path / "hub").resolve("Qwen3-0.6B-GGUF")  # the older key is neither's
    assert err.value.candidates == ("alice/Qwen3-0.6B-GGUF", "unsloth/Qwen3-0.6B-GGUF")


def test_config_entries_add_and_adjust(tmp_path: Path) -> None:
    root = tmp_path / "models"
    make_gguf(root / "tiny.gguf")
    (listed,) = make_gguf(root / "Phi-4-mini-Q4_0.gguf")
    (outside,) = make_gguf(tmp_path / "elsewhere" / "qwen.gguf")
    toml = f"""
[models.qwen]
path = "{outside}"
aliases = ["gpt-4o-mini"]
pin = true
ctx = 8192

[models.TINY]
ctx = 2048

[models.phi]
path = "models/Phi-4-mini-Q4_0.gguf"
"""
    cat = catalog_for(tmp_path, toml, root)
    assert [e.key for e in cat.entries()] == ["phi", "qwen", "TINY"]
    q = cat.resolve("GPT-4o-mini")
    assert q.key == "qwen" and q.path == outside and q.pinned and q.settings.ctx == 8192
    assert cat.resolve("tiny").settings.ctx == 2048
    phi = cat.resolve("phi")  # a discovered file named by an entry is listed once, its old key an alias
    assert phi.path == listed and phi.aliases == ("Phi-4-mini-Q4_0",)
    assert cat.resolve("phi-4-mini-q4_0") is phi


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[models.tiny2]\nctx = 1", r"models\.tiny2: no path given and no model with that key.*did you mean tiny\?"),
        ('[models.x]\npath = "nowhere.gguf"', r"models\.x\.path = '.*nowhere\.gguf': no such file"),
        ('[models.x]\npath = "models/mmproj-x.gguf"', r"models\.x\.path = .*projector \(mmproj\)"),
        ('[models.x]\npath = "models/tiny.gguf"\nmmproj = "none.gguf"', r"models\.x\.mmproj = '.*none\.gguf': no such file"),
        (
            '[models.x]\npath = "models/tiny.gguf"\n[models.y]\npath = "models/mmproj-x.gguf"',
            r"models\.y\.path",
        ),
        ('[models.x]\npath = "elsewhere"\naliases = ["tiny"]', r"name 'tiny' is already the key of model 'tiny'"),
        ('[models.tiny]\naliases = ["other"]', r"models\.tiny: name 'other' is already the key of model 'other' \(.*other\.gguf\)"),
    ],
    ids=["unknown-key", "missing-path", "projector-as-model", "missing-mmproj", "second-bad", "alias-vs-key", "alias-vs-discovered-key"],
)
def test_config_entry_errors_name_the_key(tmp_path: Path, toml: str, message: str) -> None:
    root = tmp_path / "models"
    make_gguf(root / "tiny.gguf")
    make_gguf(root / "other.gguf")
    make_gguf(root / "mmproj-x.gguf")
    make_gguf(tmp_path / "elsewhere" / "m.gguf")
    with pytest.raises(ConfigError, match=message):
        catalog_for(tmp_path, toml, root)


def test_missing_models_dir_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"models_dirs: '.*absent' is not a folder"):
        catalog_for(tmp_path, "", tmp_path / "absent")


def test_first_models_dir_wins_a_tie(tmp_path: Path) -> None:
    (a,) = make_gguf(tmp_path / "a" / "same.gguf")
    make_gguf(tmp_path / "b" / "same.gguf")
    cat = catalog_for(tmp_path, "", tmp_path / "a", tmp_path / "b")
    assert cat.resolve("same").path == a and len(cat) == 1
    assert any("already taken" in n for n in cat.notes)


# ----------------------------------------------------------------------------- gguf_file


@pytest.fixture
def repo_model(tmp_path: Path):
    root = tmp_path / "models"
    repo = root / "org" / "m-GGUF"
    make_gguf(repo / "m-Q4_0.gguf")
    make_gguf(repo / "m-Q8_0.gguf")
    make_gguf(repo / "mmproj-m-f16.gguf")
    make_gguf(repo / "s.gguf", tensors=2, split_max_tensors=1)
    make_gguf(tmp_path / "secret" / "outside.gguf")
    make_gguf(root / "flat.gguf")
    cat = catalog_for(tmp_path, "", root)
    return cat, repo, tmp_path


def test_gguf_file_picks_a_sibling_quantization(repo_model) -> None:
    cat, repo, _ = repo_model
    e = cat.resolve("m-Q4_0")
    assert e.gguf_files == ("m-Q4_0.gguf", "m-Q8_0.gguf", "s-00001-of-00002.gguf")
    assert resolve_gguf_file(e, "m-Q8_0.gguf") == repo / "m-Q8_0.gguf"
    assert resolve_gguf_file(e, "s-00001-of-00002.gguf") == repo / "s-00001-of-00002.gguf"


def test_gguf_file_link_inside_the_folder_is_allowed(repo_model) -> None:
    cat, repo, tmp_path = repo_model
    (repo / "m-latest.gguf").symlink_to("m-Q8_0.gguf")
    e = catalog_for(tmp_path, "", tmp_path / "models").resolve("m-Q4_0")
    assert resolve_gguf_file(e, "m-latest.gguf") == repo / "m-latest.gguf"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("../../secret/outside.gguf", "'..' is refused"),
        ("../m-GGUF/m-Q8_0.gguf", "'..' is refused"),
        ("{tmp}/secret/outside.gguf", "absolute paths are refused"),
        ("C:\\models\\x.gguf", "absolute paths are refused"),
        ("sub\\m-Q8_0.gguf", "use '/'"),
        ("escape.gguf", "outside the model's folder"),
        ("mmproj-m-f16.gguf", "projector (mmproj)"),
        ("m-Q2_K.gguf", "no such file"),
        ("m-Q4_0", "not a .gguf file"),
        ("s-00002-of-00002.gguf", "name the first part"),
        ("", "give one of the model's files"),
    ],
)
def test_gguf_file_refusals(repo_model, name: str, message: str) -> None:
    cat, repo, tmp_path = repo_model
    (repo / "escape.gguf").symlink_to(tmp_path / "secret" / "outside.gguf")
    e = catalog_for(tmp_path, "", tmp_path / "models").resolve("m-Q4_0")
    with pytest.raises(GgufFileError) as err:
        resolve_gguf_file(e, name.format(tmp=tmp_path))
    assert message in str(err.value)
    assert "'m-Q4_0'" in str(err.value)


def test_gguf_file_in_a_flat_dir_is_only_the_models_own(repo_model) -> None:
    cat, _, tmp_path = repo_model
    e = cat.resolve("flat")
    assert resolve_gguf_file(e, "flat.gguf") == tmp_path / "models" / "flat.gguf"
    with pytest.raises(GgufFileError, match="not one of this model's files; choices: flat.gguf"):
        resolve_gguf_file(e, "org/m-GGUF/m-Q8_0.gguf")


def test_gguf_file_on_an_hf_model(tmp_path: Path) -> None:
    make_hf(tmp_path / "models" / "org" / "hfm")
    e = catalog_for(tmp_path, "", tmp_path / "models").resolve("hfm")
    with pytest.raises(GgufFileError, match="not GGUF"):
        resolve_gguf_file(e, "x.gguf")


def test_config_path_to_a_folder(tmp_path: Path) -> None:
    (one,) = make_gguf(tmp_path / "single" / "only-Q4_0.gguf")
    (proj,) = make_gguf(tmp_path / "single" / "mmproj-only-bf16.gguf")
    make_gguf(tmp_path / "two" / "a.gguf")
    make_gguf(tmp_path / "two" / "b.gguf")
    hf = make_hf(tmp_path / "hf")
    cat = catalog_for(tmp_path, '[models.one]\npath = "single"\n[models.h]\npath = "hf"')
    e = cat.resolve("one")
    assert (e.path, e.mmproj, e.model_dir, e.gguf_files) == (one, proj, one.parent, ("only-Q4_0.gguf",))
    assert cat.resolve("h").path == hf and cat.resolve("h").engine == "transformers"
    with pytest.raises(ConfigError, match=r"models\.t\.path = '.*two': the folder holds 2 GGUF models \(a\.gguf, b\.gguf\)"):
        catalog_for(tmp_path, '[models.t]\npath = "two"')


def test_single_model_one_level_down_is_keyed_by_its_folder(tmp_path: Path) -> None:
    make_gguf(tmp_path / "models" / "phi-4" / "phi-4-Q4_K_M.gguf")
    assert [e.key for e in catalog_for(tmp_path, "", tmp_path / "models").entries()] == ["phi-4"]


def test_two_entries_may_share_one_file(tmp_path: Path) -> None:
    (f,) = make_gguf(tmp_path / "models" / "m.gguf")
    cat = catalog_for(tmp_path, '[models.short]\npath = "models/m.gguf"\nctx = 512\n'
                                '[models.long]\npath = "models/m.gguf"\nctx = 32768', tmp_path / "models")
    assert [(e.key, e.path, e.settings.ctx) for e in cat.entries()] == [("long", f, 32768), ("short", f, 512)]
    assert cat.resolve("m").key == "short"  # the discovered key is an alias of the first entry that claims it


def test_symlinked_folders_and_files_are_followed(tmp_path: Path) -> None:
    # a symlinked HF folder and a symlinked folder of GGUF files are listed as if they were there
    elsewhere = tmp_path / "elsewhere"
    make_hf(elsewhere / "hf-model")
    make_gguf(elsewhere / "gguf-folder" / "tiny.gguf")
    models = tmp_path / "models"
    models.mkdir()
    (models / "hf-linked").symlink_to(elsewhere / "hf-model", target_is_directory=True)
    (models / "gguf-linked").symlink_to(elsewhere / "gguf-folder", target_is_directory=True)
    cat = Catalog.scan([models])
    assert {"hf-linked", "gguf-linked"} <= set(cat.names())
    assert cat.resolve("hf-linked").kind == "hf" and cat.resolve("gguf-linked").kind == "gguf"


def test_a_symlink_loop_is_refused_with_its_path(tmp_path: Path) -> None:
    models = tmp_path / "models"
    make_gguf(models / "a" / "tiny.gguf")
    (models / "a" / "loop").symlink_to(models / "a", target_is_directory=True)
    cat = Catalog.scan([models])  # terminates: the loop is read once
    assert [e.key for e in cat.entries()] == ["a"]
    assert any(str(models / "a" / "loop") in n and "symlink loop" in n for n in cat.notes), cat.notes


def test_two_keys_for_one_file_are_one_model_with_aliases(tmp_path: Path) -> None:
    models = tmp_path / "models"
    (real,) = make_gguf(models / "real.gguf")
    (models / "nickname.gguf").symlink_to(real)
    cat = Catalog.scan([models])
    (entry,) = cat.entries()
    assert {entry.key, *entry.aliases} == {"real", "nickname"}
    assert cat.resolve("nickname") is entry
    assert any("the same file" in n for n in cat.notes), cat.notes
