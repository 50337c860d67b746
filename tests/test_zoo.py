"""The demo zoo: deterministic, idempotent, and structurally valid GGUF files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import pytest
import typer
from gguf import GGMLQuantizationType as QT
from typer.testing import CliRunner

from fitevict.cli import zoo as zoo_cli
from fitevict.zoo import MANIFEST_NAME, ZOO_NAMES, ZooError, ZooModel, write_zoo

# The names other code and tests rely on.
REQUIRED = ("llama-gqa", "llama-tied", "llama-moe", "gemma2-swa", "llama-q8_0", "llama-q4_0", "llama-medium")
SMALL = tuple(n for n in ZOO_NAMES if n != "llama-medium")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Gguf:
    """A read-back GGUF: metadata by key (arch prefix resolved) and tensors by name."""

    def __init__(self, path: Path) -> None:
        self.reader = gguf.GGUFReader(path)
        self.arch: str = self.reader.fields["general.architecture"].contents()
        self.tensors = {t.name: t for t in self.reader.tensors}

    def get(self, key: str, default: object = None) -> object:
        field = self.reader.fields.get(key) or self.reader.fields.get(f"{self.arch}.{key}")
        return default if field is None else field.contents()

    def per_layer(self, key: str) -> list[int]:
        v = self.get(key)
        n = self.get("block_count")
        return list(v) if isinstance(v, list) else [v] * n

    def shape(self, name: str) -> list[int]:
        """ggml ne order: ne0 first."""
        return [int(d) for d in self.tensors[name].shape]


@pytest.fixture(scope="module")
def read(zoo: dict[str, ZooModel]):
    cache: dict[str, Gguf] = {}

    def get(name: str) -> Gguf:
        if name not in cache:
            cache[name] = Gguf(zoo[name].path)
        return cache[name]

    return get


def test_zoo_has_the_public_names(zoo: dict[str, ZooModel]) -> None:
    assert set(REQUIRED) <= set(ZOO_NAMES)
    assert list(zoo) == list(ZOO_NAMES)
    for name, m in zoo.items():
        assert m.path.name == f"{name}.gguf"
        assert m.file_bytes == m.path.stat().st_size > 0


def test_writing_twice_gives_identical_bytes(zoo: dict[str, ZooModel], tmp_path: Path) -> None:
    again = {m.name: m for m in write_zoo(tmp_path)}
    for name, m in zoo.items():
        assert again[name].path != m.path
        assert _sha(again[name].path) == _sha(m.path), name


def test_rerun_skips_current_files_and_repairs_changed_ones(tmp_path: Path) -> None:
    lines: list[str] = []
    first = write_zoo(tmp_path, only=["llama-gqa", "mamba"], progress=lines.append)
    assert lines == ["writing llama-gqa", "writing mamba"]
    stamps = {m.name: m.path.stat().st_mtime_ns for m in first}
    good = _sha(first[0].path)

    lines.clear()
    write_zoo(tmp_path, only=["mamba", "llama-gqa"], progress=lines.append)
    assert lines == ["up to date llama-gqa", "up to date mamba"]
    assert {m.name: m.path.stat().st_mtime_ns for m in first} == stamps

    # a damaged file (same size, one byte flipped) is detected by its sha256 and rewritten
    data = bytearray(first[0].path.read_bytes())
    data[-1] ^= 0xFF
    first[0].path.write_bytes(bytes(data))
    lines.clear()
    write_zoo(tmp_path, only=["llama-gqa", "mamba"], progress=lines.append)
    assert lines == ["writing llama-gqa", "up to date mamba"]
    assert _sha(first[0].path) == good
    # no temporary files remain, only the models and the manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["llama-gqa.gguf", "mamba.gguf", MANIFEST_NAME])


def test_unknown_name_lists_the_allowed_ones(tmp_path: Path) -> None:
    with pytest.raises(ZooError) as e:
        write_zoo(tmp_path, only=["llama-gqa", "gpt-9"])
    assert "gpt-9" in str(e.value)
    for name in ZOO_NAMES:
        assert name in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_dir_is_a_named_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ZooError, match="a-file"):
        write_zoo(blocker / "zoo", only=["llama-gqa"])


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_every_model_reads_back_consistently(read, name: str) -> None:
    """Metadata agrees with the tensor shapes exactly as llama.cpp's loader checks them."""
    g = read(name)
    n_embd, n_layer = g.get("embedding_length"), g.get("block_count")
    tokens = g.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens)
    assert g.shape("token_embd.weight") == [n_embd, n_vocab]
    assert g.shape("token_embd_norm.weight" if g.arch == "lfm2" else "output_norm.weight") == [n_embd]  # lfm2's name
    assert n_vocab & (n_vocab - 1) != 0, "n_vocab should not be a power of two"
    # tokenizer: SPM with byte tokens, control tokens, scores and types for every token, a chat template
    assert g.get("tokenizer.ggml.model") == "llama"
    assert all(f"<0x{b:02X}>" in tokens for b in range(256))
    assert len(g.get("tokenizer.ggml.scores")) == len(g.get("tokenizer.ggml.token_type")) == n_vocab
    assert tokens[g.get("tokenizer.ggml.bos_token_id")] == "<s>"
    assert tokens[g.get("tokenizer.ggml.eos_token_id")] == "</s>"
    assert "add_generation_prompt" in g.get("tokenizer.chat_template")
    assert g.get("context_length") >= 4096
    n_head = g.get("attention.head_count")
    kv = g.per_layer("attention.head_count_kv")
    ff = g.per_layer("feed_forward_length")
    for il in range(n_layer):
        if kv[il] == 0 and g.arch == "lfm2":  # a short-convolution layer
            l_cache = g.get("shortconv.l_cache")
            assert g.shape(f"blk.{il}.shortconv.conv.weight") == [l_cache, n_embd]
            assert g.shape(f"blk.{il}.shortconv.in_proj.weight") == [n_embd, 3 * n_embd]
            continue
        if kv[il] == 0 and g.arch == "granitehybrid":  # a mamba2 layer: z, x, B, C and dt from one projection
            d_inner, d_state, n_group = g.get("ssm.inner_size"), g.get("ssm.state_size"), g.get("ssm.group_count")
            n_ssm_head = g.get("ssm.time_step_rank")
            assert d_inner == 2 * n_embd and d_inner % n_ssm_head == 0 and d_inner % n_group == 0
            assert g.shape(f"blk.{il}.ssm_in.weight") == [n_embd, 2 * d_inner + 2 * n_group * d_state + n_ssm_head]
            assert g.shape(f"blk.{il}.ssm_conv1d.weight") == [g.get("ssm.conv_kernel"),
                                                               d_inner + 2 * n_group * d_state]
            assert g.shape(f"blk.{il}.ssm_norm.weight") == [d_inner // n_group, n_group]
            continue
        if kv[il] == 0:  # a recurrent (mamba) layer
            d_inner = g.get("ssm.inner_size")
            assert d_inner == 2 * n_embd  # the only expansion factor llama.cpp supports
            assert g.shape(f"blk.{il}.ssm_in.weight") == [n_embd, 2 * d_inner]
            assert g.shape(f"blk.{il}.ssm_conv1d.weight") == [g.get("ssm.conv_kernel"), d_inner]
            assert f"blk.{il}.attn_k.weight" not in g.tensors
            continue
        # head size: attention.key_length when written (qwen3, gemma3, MLA), else n_embd / n_head
        head_dim = g.get("attention.key_length", n_embd // n_head)
        assert n_head % kv[il] == 0
        if g.get("attention.key_length_mla"):  # MLA: one latent "head" of kv_lora_rank + rope dims
            kv_lora, rope = g.get("attention.kv_lora_rank"), g.get("rope.dimension_count")
            assert head_dim == kv_lora + rope and kv[il] == 1
            assert g.get("attention.value_length") == kv_lora
            assert g.shape(f"blk.{il}.attn_kv_a_mqa.weight") == [n_embd, kv_lora + rope]
            nope = g.get("attention.key_length_mla") - rope
            assert g.shape(f"blk.{il}.attn_k_b.weight") == [nope, kv_lora, n_head]
        elif f"blk.{il}.attn_qkv.weight" in g.tensors:  # fused (phi3, gpt2, falcon, bloom)
            assert g.shape(f"blk.{il}.attn_qkv.weight") == [n_embd, head_dim * (n_head + 2 * kv[il])]
            assert g.get("rope.dimension_count") == head_dim
        else:
            assert g.get("rope.dimension_count") == head_dim
            assert g.shape(f"blk.{il}.attn_q.weight") == [n_embd, head_dim * n_head]
            assert g.shape(f"blk.{il}.attn_k.weight") == [n_embd, head_dim * kv[il]]
            assert g.shape(f"blk.{il}.attn_v.weight") == [n_embd, head_dim * kv[il]]
        if g.get("expert_count") and il >= g.get("leading_dense_block_count", 0):
            n_exp = g.get("expert_count")
            ff_exp = g.get("expert_feed_forward_length", ff[il])
            assert g.shape(f"blk.{il}.ffn_up_exps.weight") == [n_embd, ff_exp, n_exp]
            assert f"blk.{il}.ffn_up.weight" not in g.tensors
        else:
            fused_up = g.arch == "phi3"  # phi3 stores gate and up as one [n_embd, 2 * n_ff] matrix
            assert g.shape(f"blk.{il}.ffn_up.weight") == [n_embd, ff[il] * (2 if fused_up else 1)]
            assert g.shape(f"blk.{il}.ffn_down.weight") == [ff[il], n_embd]
            assert ff[il] % 512 != 0


def test_gqa_and_tied(read) -> None:
    gqa, tied = read("llama-gqa"), read("llama-tied")
    assert gqa.arch == tied.arch == "llama"
    assert gqa.get("attention.head_count") > gqa.get("attention.head_count_kv") > 0
    assert "output.weight" in gqa.tensors
    assert "output.weight" not in tied.tensors
    # the tied model differs only by the missing output tensor
    assert set(gqa.tensors) - set(tied.tensors) == {"output.weight"}


def test_moe_has_experts(read) -> None:
    g = read("llama-moe")
    n_exp, used = g.get("expert_count"), g.get("expert_used_count")
    assert 0 < used < n_exp
    n_embd = g.get("embedding_length")
    for il in range(g.get("block_count")):
        assert g.shape(f"blk.{il}.ffn_gate_inp.weight") == [n_embd, n_exp]
        for kind in ("gate", "up", "down"):
            assert g.shape(f"blk.{il}.ffn_{kind}_exps.weight")[2] == n_exp
        assert f"blk.{il}.ffn_up.weight" not in g.tensors


def test_swa_metadata(read) -> None:
    g = read("gemma2-swa")
    assert g.arch == "gemma2"
    window = g.get("attention.sliding_window")
    assert 0 < window <= 128 < g.get("context_length")
    assert "output.weight" not in g.tensors  # gemma2 always ties the output to token_embd


def test_per_layer_head_count_kv(read) -> None:
    g = read("deci-kvarray")
    kv = g.get("attention.head_count_kv")
    assert isinstance(kv, list) and len(kv) == g.get("block_count") and len(set(kv)) > 1


def test_recurrent_and_hybrid(read) -> None:
    mamba, jamba = read("mamba"), read("jamba-hybrid")
    assert mamba.get("attention.head_count_kv") == 0
    assert "blk.0.ssm_a" in mamba.tensors and "blk.0.ffn_up.weight" not in mamba.tensors
    kv = jamba.get("attention.head_count_kv")
    # both kinds of layer: recurrent (0 kv heads) and attention
    assert 0 in kv and any(k > 0 for k in kv)
    for il, k in enumerate(kv):
        assert (f"blk.{il}.ssm_in.weight" in jamba.tensors) == (k == 0)
        assert (f"blk.{il}.attn_q.weight" in jamba.tensors) == (k > 0)
        assert f"blk.{il}.ffn_up.weight" in jamba.tensors


@pytest.mark.parametrize(
    ("name", "weight_type"),
    [("llama-gqa", QT.F16), ("llama-tied", QT.F32), ("llama-q8_0", QT.Q8_0), ("llama-q4_0", QT.Q4_0),
     ("gemma3-q4_0", QT.Q4_0)],
)
def test_weight_types(read, zoo: dict[str, ZooModel], name: str, weight_type: QT) -> None:
    g = read(name)
    assert zoo[name].quant == weight_type.name
    for t in g.reader.tensors:
        expected = QT.F32 if len(t.shape) == 1 else weight_type
        assert t.tensor_type == expected, t.name
        # bytes from the block table: ne0 / block_size * type_size per row
        block, type_size = gguf.GGML_QUANT_SIZES[expected]
        rows = int(t.n_elements) // int(t.shape[0])
        assert int(t.n_bytes) == rows * int(t.shape[0]) // block * type_size


def test_medium_is_about_200_mb(zoo: dict[str, ZooModel]) -> None:
    m = zoo["llama-medium"]
    assert 150e6 <= m.file_bytes <= 260e6
    assert m.quant == "F16"
    assert max(zoo[n].file_bytes for n in SMALL) < 20e6  # the rest are small (zoo v2: 1 to 17 MB)


def _cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """root"""

    zoo_cli.register(app)
    return app


def test_cli_writes_and_lists(tmp_path: Path) -> None:
    r = CliRunner().invoke(_cli(), ["demo-models", str(tmp_path), "--only", "llama-tied", "--only", "llama-q4_0"])
    assert r.exit_code == 0, r.output
    assert "file-size" in r.output
    assert "llama-tied" in r.output and "llama-q4_0" in r.output and "Q4_0" in r.output
    assert sorted(p.name for p in tmp_path.glob("*.gguf")) == ["llama-q4_0.gguf", "llama-tied.gguf"]


def test_cli_rejects_unknown_name(tmp_path: Path) -> None:
    r = CliRunner().invoke(_cli(), ["demo-models", str(tmp_path), "--only", "nope"])
    assert r.exit_code == 2
    assert "nope" in r.output and "llama-medium" in r.output


def test_cli_unwritable_dir_is_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    r = CliRunner().invoke(_cli(), ["demo-models", str(blocker / "zoo"), "--only", "llama-gqa"])
    assert r.exit_code == 2
    assert "cannot create the zoo directory" in r.output and "a-file" in r.output


def test_rewrite_arch_keeps_tensors_and_renames_keys(tmp_path) -> None:
    import gguf

    from fitevict.zoo import rewrite_arch, write_zoo

    (m,) = write_zoo(tmp_path / "z", only=["llama-gqa"])
    out = rewrite_arch(m.path, tmp_path / "x.gguf", "xverse")
    a, b = gguf.GGUFReader(m.path), gguf.GGUFReader(out)
    assert str(b.fields["general.architecture"].contents()) == "xverse"
    assert b.fields["xverse.block_count"].contents() == a.fields["llama.block_count"].contents()
    assert not any(k.startswith("llama.") for k in b.fields)
    assert [(t.name, t.data.tobytes()) for t in a.tensors] == [(t.name, t.data.tobytes()) for t in b.tensors]


# ---------------------------------------------------------------------------------------------- the life-size zoo


@pytest.fixture(scope="module")
def engine_source() -> Path:
    """The engine's llama.cpp source, whose models/ holds the real vocabularies the life-size zoo copies."""
    from fitevict.engines.llama_cpp.install import source_dir

    src = source_dir()
    if not (src / "models").is_dir():
        pytest.skip(f"no engine source at {src}: run `fitevict engine install llama.cpp`")
    return src


def _record(reader: gguf.GGUFReader, key: str) -> bytes:
    """A key-value as the file stores it (key, type, value), located by gguf's own reader."""
    f = reader.fields[key]
    return b"".join(p.tobytes() for p in f.parts)


def _qwen_tensors() -> dict[str, tuple[list[int], QT]]:
    """Qwen2.5-0.5B's 290 tensors (ggml ne, type) as written out in its GGUF: tied, q/k/v biases, Q8_0 weights."""
    e, ff, kv, vocab = 896, 4864, 2 * 64, 151936
    out = {"token_embd.weight": ([e, vocab], QT.Q8_0), "output_norm.weight": ([e], QT.F32)}
    for i in range(24):
        p = f"blk.{i}."
        out |= {p + "attn_norm.weight": ([e], QT.F32), p + "ffn_norm.weight": ([e], QT.F32),
                p + "attn_q.weight": ([e, e], QT.Q8_0), p + "attn_q.bias": ([e], QT.F32),
                p + "attn_k.weight": ([e, kv], QT.Q8_0), p + "attn_k.bias": ([kv], QT.F32),
                p + "attn_v.weight": ([e, kv], QT.Q8_0), p + "attn_v.bias": ([kv], QT.F32),
                p + "attn_output.weight": ([e, e], QT.Q8_0), p + "ffn_gate.weight": ([e, ff], QT.Q8_0),
                p + "ffn_up.weight": ([e, ff], QT.Q8_0), p + "ffn_down.weight": ([ff, e], QT.Q8_0)}
    return out


def test_life_size_qwen_has_the_real_vocabulary_and_shape(engine_source: Path, tmp_path: Path) -> None:
    import numpy as np

    from fitevict.zoo.lifesize import vocab_file, write_life_size

    lines: list[str] = []
    (w,) = write_life_size(engine_source, tmp_path, only=["qwen2.5-0.5b"], progress=lines.append)
    assert not w.reused and lines[0] == "writing qwen2.5-0.5b (Q8_0)"
    g = Gguf(w.model.path)
    # every tokenizer key is the vocabulary file's, byte for byte: the records gguf's reader finds in the model
    # are, in order, the vocabulary file's last bytes (its tokenizer keys end its key-values; zero padding after)
    vocab = vocab_file(engine_source, "qwen2").read_bytes()
    keys = [k for k in g.reader.fields if k.startswith("tokenizer.")]
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.chat_template"} <= set(keys)
    copied = b"".join(_record(g.reader, k) for k in keys)
    at = vocab.rfind(copied)
    assert at > 0 and not vocab[at + len(copied):].strip(b"\0") and len(vocab) - at - len(copied) < 32
    assert len(g.get("tokenizer.ggml.tokens")) == 151936
    # the public model's shape and types, tensor by tensor
    assert (g.arch, g.get("block_count"), g.get("embedding_length"), g.get("feed_forward_length")) == \
        ("qwen2", 24, 896, 4864)
    assert (g.get("attention.head_count"), g.get("attention.head_count_kv"), g.get("context_length")) == \
        (14, 2, 32768)
    assert g.get("rope.freq_base") == 1e6
    assert {n: (g.shape(n), t.tensor_type) for n, t in g.tensors.items()} == _qwen_tensors()
    # finite, small weights: the blocks' f16 scales and what they dequantize to
    for name in ("token_embd.weight", "blk.23.ffn_down.weight"):
        w8 = gguf.quants.dequantize(g.tensors[name].data[:64], QT.Q8_0)
        assert np.isfinite(w8).all() and 0.005 < float(w8.std()) < 0.05 and float(abs(w8).max()) < 0.1
    assert all((g.tensors[n].data == 1).all() for n in g.tensors if n.endswith("norm.weight"))
    # written once: the next call reuses the file, and no temporary file is left
    stamp = w.model.path.stat().st_mtime_ns
    lines.clear()
    (again,) = write_life_size(engine_source, tmp_path, only=["qwen2.5-0.5b"], progress=lines.append)
    assert again.reused and lines == ["up to date qwen2.5-0.5b"] and again.model.path.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lifesize", "qwen2.5-0.5b.gguf"]


def test_life_size_embedder_copies_every_tokenizer_key(engine_source: Path, tmp_path: Path) -> None:
    from fitevict.zoo.lifesize import vocab_file, write_life_size

    (w,) = write_life_size(engine_source, tmp_path, only=["bge-small-en-v1.5"])
    g, v = Gguf(w.model.path), gguf.GGUFReader(vocab_file(engine_source, "bert-bge"))
    theirs = {k: f.contents() for k, f in v.fields.items() if k.startswith("tokenizer.")}
    assert {k: f.contents() for k, f in g.reader.fields.items() if k.startswith("tokenizer.")} == theirs
    assert (g.arch, g.get("pooling_type"), g.get("attention.causal")) == ("bert", 2, False)
    assert g.shape("position_embd.weight") == [384, 512] and g.shape("token_types.weight") == [384, 2]
    assert len(g.tensors) == 5 + 12 * 16 and "output.weight" not in g.tensors
    # same recipe, same vocabulary, same bytes
    (again,) = write_life_size(engine_source, tmp_path / "again", only=["bge-small-en-v1.5"])
    assert _sha(again.model.path) == _sha(w.model.path)


def test_life_size_is_rewritten_when_its_vocabulary_changes(engine_source: Path, tmp_path: Path) -> None:
    import shutil

    from fitevict.zoo.lifesize import vocab_file, write_life_size

    src = tmp_path / "llama.cpp"
    mine = vocab_file(src, "bert-bge")
    mine.parent.mkdir(parents=True)
    shutil.copyfile(vocab_file(engine_source, "bert-bge"), mine)
    lines: list[str] = []
    write_life_size(src, tmp_path / "out", only=["bge-small-en-v1.5"], progress=lines.append)
    with mine.open("ab") as f:
        f.write(b"\0" * 32)  # other bytes, the same key-values: another file, so another key
    write_life_size(src, tmp_path / "out", only=["bge-small-en-v1.5"], progress=lines.append)
    assert [line.split(":")[0] for line in lines if not line.startswith("wrote")] == \
        ["writing bge-small-en-v1.5 (F16)"] * 2


def test_life_size_names_the_missing_vocabulary_and_the_remedy(tmp_path: Path) -> None:
    from fitevict.zoo.lifesize import write_life_size
    from fitevict.zoo.lifesize_recipes import LifeSizeError

    with pytest.raises(LifeSizeError) as e:
        write_life_size(tmp_path / "no-engine", tmp_path / "out", only=["gemma-3-1b"])
    assert "ggml-vocab-gemma-4.gguf" in str(e.value) and "fitevict engine install llama.cpp" in str(e.value)
    assert not (tmp_path / "out").exists()
    with pytest.raises(LifeSizeError, match="allowed: qwen2.5-0.5b"):
        write_life_size(tmp_path / "no-engine", tmp_path / "out", only=["gpt-9"])


def test_cli_life_size_without_the_engine_says_what_to_run(tmp_path: Path) -> None:
    r = CliRunner().invoke(_cli(), ["demo-models", str(tmp_path / "out"), "--life-size", "--only", "qwen2.5-0.5b"],
                           env={"FITEVICT_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "400"})
    assert r.exit_code == 2, r.output
    assert "ggml-vocab-qwen2.gguf" in r.output and "fitevict engine install llama.cpp" in r.output
