"""The life-size Qwen2.5-0.5B (real qwen2 vocabulary, 0.5 GB of Q8_0 weights) through the real engine: it
tokenizes as the real tokenizer does, and `fitevict serve` answers a chat completion for it through the openai SDK.
The file is written once into fitevict's cache (about 2 s) and reused by later runs."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from _frontdoor import front_door
from _server import running_server

from fitevict.engines.llama_cpp.install import source_dir
from fitevict.zoo.lifesize import vocab_file, write_life_size

pytestmark = pytest.mark.e2e

NAME = "qwen2.5-0.5b"
SEPARATOR = "\n__ggml_vocab_test__\n"


@pytest.fixture(scope="module")
def qwen(llama_server: Path) -> Path:
    src = source_dir()
    if not vocab_file(src, "qwen2").is_file():
        pytest.fail(f"no engine source at {src}. Run: fitevict engine install llama.cpp")
    (w,) = write_life_size(src, only=[NAME])
    return w.model.path


def _engine_cases() -> list[tuple[str, list[int]]]:
    """The engine's own tokenizer cases for the qwen2 vocabulary (its test-tokenizer-0 reads the same files)."""
    models = vocab_file(source_dir(), "qwen2").parent
    raw = (models / "ggml-vocab-qwen2.gguf.inp").read_bytes().decode()  # as it is: some cases hold "\r"
    texts = raw.removesuffix(SEPARATOR).split(SEPARATOR)
    ids = (models / "ggml-vocab-qwen2.gguf.out").read_text().split("\n")[:len(texts)]
    assert len(texts) == len(ids) > 20
    return [(t, [int(i) for i in line.split()]) for t, line in zip(texts, ids)]


def test_life_size_qwen_tokenizes_as_the_real_tokenizer(qwen: Path, llama_server: Path) -> None:
    with running_server(llama_server, qwen, "-dev", "none", "-c", "512", "-np", "1", timeout=120) as srv:
        meta = httpx.get(f"{srv.base_url}/v1/models", timeout=10).json()["data"][0]["meta"]
        got = [(text, httpx.post(f"{srv.base_url}/tokenize", timeout=30, json={
            "content": text, "add_special": False, "parse_special": False}).json()["tokens"])
            for text, _ in _engine_cases()]
    assert (meta["n_vocab"], meta["n_embd"], meta["n_params"]) == (151936, 896, 494032768)
    assert got == _engine_cases()


def test_life_size_qwen_answers_through_fitevict(qwen: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / f"{NAME}.gguf").symlink_to(qwen)
    with front_door(tmp_path, "--models-dir", str(models)) as fd:
        client = openai.OpenAI(base_url=fd.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
        assert NAME in [m.id for m in client.models.list().data]
        r = client.chat.completions.create(model=NAME, max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "Hello there!"}])
    message = r.choices[0].message
    assert message.role == "assistant" and isinstance(message.content, str)
    assert r.usage is not None and 0 < r.usage.completion_tokens <= 4
    assert r.usage.prompt_tokens > 10  # the qwen2 vocabulary's chat template, with its default system message
