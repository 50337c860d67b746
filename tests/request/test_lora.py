"""Adapters in the catalog, the load contract and the request body: real files (zoo base, its demo adapters,
a PEFT folder written with safetensors), no engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from fitevict.config import ConfigError, ModelConfig
from fitevict.engines.llama_cpp.server import load_args
from fitevict.pricing.gguf import load_structure
from fitevict.pricing.lora import listed_adapter_bytes
from fitevict.request.catalog import Catalog
from fitevict.request.ask import load_config_for, plan_request
from fitevict.request.contract import (Contract, ContractError, lora_field, parse_contract, seat_key, unservable,
                                       with_lora)
from fitevict.zoo import write_zoo
from fitevict.zoo.gguf_adapters import write_adapters


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("zoo")
    write_zoo(dest, only=["llama-gqa", "llama-tied"])
    write_adapters(dest, names=("sql", "poem"))
    hf = dest / "org" / "tiny-hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": np.zeros((4, 4), dtype=np.float32)}, str(hf / "model.safetensors"))
    peft = dest / "tiny-hf-chat"
    peft.mkdir()
    (peft / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "org/tiny-hf", "r": 2}))
    save_file({"base_model.model.w.lora_A.weight": np.zeros((2, 8), dtype=np.float16),
               "base_model.model.w.lora_B.weight": np.zeros((8, 2), dtype=np.float16),
               "base_model.model.head.weight": np.zeros((4, 4), dtype=np.float16)},  # a saved module copy
              str(peft / "adapter_model.safetensors"))
    return dest


def test_gguf_adapters_beside_a_base_are_models_of_that_base(zoo_dir: Path) -> None:
    cat = Catalog.scan([zoo_dir])
    keys = [e.key for e in cat]
    assert "llama-gqa:sql" in keys and "llama-gqa:poem" in keys
    assert not [k for k in keys if k in ("sql", "poem")]  # the adapters folder is not a models folder
    sql, base = cat.resolve("llama-gqa:sql"), cat.resolve("llama-gqa")
    assert (sql.kind, sql.base, sql.engine, sql.base_path) == ("lora", "llama-gqa", "llama-server", base.path)
    assert [p.name for p in base.loras] == ["poem.gguf", "sql.gguf"] and sql.loras == base.loras
    assert sql.file_bytes == (zoo_dir / "llama-gqa.adapters" / "sql.gguf").stat().st_size
    assert cat.resolve("llama-tied").loras == ()


def test_a_peft_folder_is_an_adapter_of_the_base_it_names(zoo_dir: Path) -> None:
    cat = Catalog.scan([zoo_dir])
    e = cat.resolve("tiny-hf:tiny-hf-chat")
    assert (e.kind, e.base, e.engine) == ("peft", "tiny-hf", "transformers")
    listed = listed_adapter_bytes(e.kind, e.files)
    # LoRA weights held in float32 whatever the file stores (peft's autocast); the module copy as stored
    assert (listed["bytes"], listed["source"]) == (2 * 16 * 4 + 16 * 2, "formula")
    why = unservable(e, ("llama-server",))
    assert why is not None and "transformers (torch) engine" in why and "tiny-hf" in why
    assert unservable(e, ("llama-server", "transformers")) is None  # served on its base's transformers seat
    assert cat.resolve("tiny-hf").loras == (e.path,)  # the base's seat starts with it
    assert unservable(cat.resolve("llama-gqa:sql"), ("llama-server",)) is None


def test_a_peft_adapter_of_a_gguf_base_says_to_convert_it(zoo_dir: Path, tmp_path: Path) -> None:
    peft = tmp_path / "gguf-chat"
    peft.mkdir()
    (peft / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "llama-gqa"}))
    (peft / "adapter_model.safetensors").write_bytes((zoo_dir / "tiny-hf-chat" / "adapter_model.safetensors").read_bytes())
    cat = Catalog.scan([zoo_dir, tmp_path])
    e = cat.resolve("llama-gqa:gguf-chat")
    why = unservable(e, ("llama-server", "transformers"))
    assert why is not None and "convert_lora_to_gguf.py" in why and "GGUF model" in why
    assert e.path not in cat.resolve("llama-gqa").loras  # llama-server is never started with a PEFT folder


def test_config_names_an_adapter_with_its_base(zoo_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "my-sql.gguf"
    elsewhere.write_bytes((zoo_dir / "llama-gqa.adapters" / "sql.gguf").read_bytes())
    cat = Catalog.scan([zoo_dir], {"sql2": ModelConfig(key="sql2", path=elsewhere, base="llama-gqa", aliases=("s2",)),
                                   "llama-gqa:poem": ModelConfig(key="llama-gqa:poem", aliases=("verse",))})
    e = cat.resolve("s2")
    assert e.key == "sql2" and e.base == "llama-gqa" and elsewhere in cat.resolve("llama-gqa").loras
    assert cat.resolve("verse").key == "llama-gqa:poem"
    with pytest.raises(ConfigError, match="no such model in the catalog"):
        Catalog.scan([zoo_dir], {"x": ModelConfig(key="x", path=elsewhere, base="nope")})
    with pytest.raises(ConfigError, match="lora adapter, which llama-server applies on a base of kind gguf"):
        Catalog.scan([zoo_dir], {"x": ModelConfig(key="x", path=elsewhere, base="tiny-hf")})
    with pytest.raises(ConfigError, match="neither a GGUF LoRA adapter"):
        Catalog.scan([zoo_dir], {"x": ModelConfig(key="x", path=zoo_dir / "llama-gqa.gguf", base="llama-gqa")})


def test_an_adapter_starts_its_base_seat_with_every_adapter(zoo_dir: Path) -> None:
    cat = Catalog.scan([zoo_dir])
    sql, poem, base = (cat.resolve(k) for k in ("llama-gqa:sql", "llama-gqa:poem", "llama-gqa"))
    cfgs = [load_config_for(e, None, "max-gpu") for e in (sql, poem, base)]
    assert cfgs[0] == cfgs[1] == cfgs[2]  # one seat configuration: switching adapters never reloads
    cfg, _mode, path = cfgs[0]
    assert path == base.path and cfg.loras == tuple(str(p) for p in base.loras)
    args = load_args(path, cfg)
    assert args[args.index("--lora") + 1] == ",".join(cfg.loras) and "--lora-init-without-apply" in args
    s = load_structure(path)
    req = plan_request(sql, cfg, "max-gpu", s, contract=Contract())
    assert req.key == seat_key(sql) == "llama-gqa" and "loras" in req.fixed
    assert "loras" not in plan_request(base, cfg, "max-gpu", s, contract=Contract()).fixed


def test_lora_field_sets_every_adapter_and_zeros_for_the_base() -> None:
    seat = ("/m/a.gguf", "/m/b.gguf", "/m/c.gguf")
    assert lora_field(seat, "/m/b.gguf") == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1.0}, {"id": 2, "scale": 0.0}]
    assert lora_field(seat, None) == [{"id": i, "scale": 0.0} for i in range(3)]
    assert lora_field(seat, "/m/c.gguf", 0.5)[2] == {"id": 2, "scale": 0.5}
    with pytest.raises(ValueError, match="not loaded on this seat"):
        lora_field(seat, "/m/d.gguf")


def test_with_lora_replaces_a_client_lora_and_leaves_plain_seats_alone(zoo_dir: Path) -> None:
    cat = Catalog.scan([zoo_dir])
    sql = cat.resolve("llama-gqa:sql")
    seat = tuple(str(p) for p in sql.loras)
    body = {"prompt": "x", "lora": [{"id": 0, "scale": 9}]}
    got = with_lora(body, seat, sql, parse_contract({"lora_scale": 0.25}))
    assert got["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.25}] and body["lora"][0]["scale"] == 9
    assert with_lora({"prompt": "x"}, (), cat.resolve("llama-tied"), None) == {"prompt": "x"}
    with pytest.raises(ContractError, match="lora_scale"):
        parse_contract({"lora_scale": "high"})


def test_demo_models_writes_the_adapters_of_llama_gqa(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from fitevict.cli import zoo as zoo_cli

    app = typer.Typer()
    app.callback()(lambda: None)
    zoo_cli.register(app)
    r = CliRunner().invoke(app, ["demo-models", str(tmp_path), "--only", "llama-gqa"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "llama-gqa.adapters").iterdir()) == [
        "chat.gguf", "math.gguf", "poem.gguf", "sql.gguf"]
    assert "llama-gqa:<name>" in r.output
    assert {e.key for e in Catalog.scan([tmp_path])} == {
        "llama-gqa", "llama-gqa:chat", "llama-gqa:math", "llama-gqa:poem", "llama-gqa:sql"}
    again = (tmp_path / "llama-gqa.adapters" / "sql.gguf").read_bytes()
    write_adapters(tmp_path, names=("sql",))
    assert (tmp_path / "llama-gqa.adapters" / "sql.gguf").read_bytes() == again  # deterministic
