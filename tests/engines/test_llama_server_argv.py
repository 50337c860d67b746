"""The seat's argv for tensor overrides and embeddings parses back to the LoadConfig it was priced for."""

from __future__ import annotations

from pathlib import Path

from fitevict.engines.llama_cpp.server import LlamaServerEngine
from fitevict.pricing.cmdline import parse_server_argv
from fitevict.pricing.loadconfig import LoadConfig


def test_seat_argv_carries_overrides_in_order_and_embeddings(llama_server: Path, tmp_path: Path) -> None:
    cfg = LoadConfig(n_ctx=2048, n_parallel=2, n_cpu_moe=1, devices=("CUDA0",), n_gpu_layers=-1,
                     tensor_overrides=(("exps", "CUDA0"), (r"blk\.1\.attn", "CPU")), embeddings=True)
    spec = LlamaServerEngine(llama_server).launch_spec(tmp_path / "m.gguf", cfg, 8123)
    argv = list(spec.argv)
    # --n-cpu-moe's rules are checked first by llama.cpp, so it comes before every -ot
    assert argv.index("--n-cpu-moe") < argv.index("-ot")
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-ot"] == ["exps=CUDA0", r"blk\.1\.attn=CPU"]
    assert "--embeddings" in argv
    assert parse_server_argv(argv).config == cfg


def test_embeddings_from_model_settings_only_is_flagged(llama_server: Path, tmp_path: Path) -> None:
    spec = LlamaServerEngine(llama_server).launch_spec(tmp_path / "m.gguf", LoadConfig(), 8123, embeddings=True)
    assert "--embeddings" in spec.argv
    assert any("priced without it" in n for n in spec.notes)


def test_an_embeddings_seat_of_a_model_without_pooling_pools_by_mean(tmp_path: Path) -> None:
    """The pinned build's OpenAI embeddings route refuses pooling 'none' (a generative model's default)."""
    from dataclasses import replace

    import gguf

    from fitevict.engines.llama_cpp.server import load_args
    from fitevict.zoo import RECIPES, write_gguf

    plain, declared = tmp_path / "plain.gguf", tmp_path / "cls.gguf"
    write_gguf(RECIPES[0], plain)
    write_gguf(replace(RECIPES[0], extra=(("pooling_type", gguf.PoolingType.CLS),)), declared)
    emb = LoadConfig(embeddings=True)
    argv = load_args(plain, emb)
    assert argv[argv.index("--embeddings") + 1:argv.index("--embeddings") + 3] == ["--pooling", "mean"]
    assert "--pooling" not in load_args(declared, emb)  # the file's own pooling (CLS) stands
    assert load_args(plain, emb, ("--pooling", "last")).count("--pooling") == 1  # the model's extra args choose
    assert "--pooling" not in load_args(plain, LoadConfig())  # a chat seat: no pooling
    assert parse_server_argv(["llama-server", *load_args(plain, emb)]).config == emb


def test_an_embeddings_seat_of_a_reranker_names_rank_pooling(llama_server: Path, tmp_path: Path) -> None:
    """The pinned build serves /rerank only with --pooling rank on the command line, whatever the file declares."""
    from fitevict.engines.llama_cpp.install import engine_root
    from fitevict.engines.llama_cpp.server import load_args
    from fitevict.pricing.gguf import load_structure
    from fitevict.zoo.rerank import POOLING_RANK, write_reranker

    path = write_reranker(tmp_path, engine_root() / "src" / "vendor" / "llama.cpp")
    assert load_structure(path).pooling_type == POOLING_RANK
    argv = load_args(path, LoadConfig(embeddings=True))
    assert argv[argv.index("--pooling") + 1] == "rank"


def test_which_models_rerank_is_the_engines_rule() -> None:
    """llama-server reranks when the arguments ask for rank pooling (the file is then not read) or the file declares
    it; an engine without a rerank route never does, whatever it is given."""
    from fitevict.engines import engine_class
    from fitevict.engines.llama_cpp.server import POOLING_NONE, POOLING_RANK

    engine = engine_class("llama-server")

    def unread() -> int | None:
        raise AssertionError("the file was read although the arguments decide")

    assert engine.reranks(["--reranking"], unread) and engine.reranks(["--pooling", "rank"], unread)
    assert engine.reranks([], lambda: POOLING_RANK)
    assert not engine.reranks(["--pooling", "mean"], lambda: POOLING_NONE)
    assert not engine.reranks([], lambda: None)  # an unreadable file declares nothing
    assert not engine_class("transformers").reranks(["--reranking"], lambda: POOLING_RANK)
