"""Every zoo model loads in the real llama-server (CPU only) and answers a chat completion."""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import httpx
import pytest
from _server import running_server

from fitevict.zoo import ZOO_NAMES, ZooModel

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_model_serves_chat(name: str, zoo: dict[str, ZooModel], llama_server: Path, tmp_path: Path) -> None:
    model = zoo[name]
    log = tmp_path / "llama-server.log"
    with running_server(
        llama_server, model.path, "-dev", "none", "-c", "512", "-np", "1", "-lv", "4", timeout=120, log_path=log
    ) as srv:
        r = httpx.post(
            f"{srv.base_url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hello there!"}], "max_tokens": 4, "temperature": 0},
            timeout=60,
        )
        assert r.status_code == 200, f"{r.status_code} {r.text[:500]}\n{srv.log_tail()}"
        body = r.json()
        message = body["choices"][0]["message"]
        assert message["role"] == "assistant", body
        assert isinstance(message.get("content"), str), body
        assert 0 < body["usage"]["completion_tokens"] <= 4, body
        # llama.cpp's own view of the model agrees with the file
        meta = httpx.get(f"{srv.base_url}/v1/models", timeout=10).json()["data"][0]["meta"]
        assert srv.proc.poll() is None, srv.log_tail()
    # the server is stopped and reaped when the block ends
    assert srv.proc.returncode is not None
    reader = gguf.GGUFReader(model.path)
    assert meta["n_vocab"] == len(reader.fields["tokenizer.ggml.tokens"].contents())
    assert meta["n_embd"] == reader.fields[f"{model.arch}.embedding_length"].contents()
    # the architecture llama.cpp loaded is the one the zoo wrote (print_info needs -lv 4)
    archs = re.findall(r"print_info: arch\s+= (\S+)", log.read_text(errors="replace"))
    assert archs and set(archs) == {model.arch}, log.read_text(errors="replace")[-3000:]


def test_server_that_fails_to_load_reports_its_log(llama_server: Path, tmp_path: Path) -> None:
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF" + bytes(28))
    with pytest.raises(AssertionError, match=r"exited with code \d+ before becoming healthy") as e:
        with running_server(llama_server, bad, "-dev", "none", timeout=60, log_path=tmp_path / "log"):
            pytest.fail("a server with an invalid model must not become healthy")
    assert "not-a-model.gguf" in str(e.value)  # the log tail names the failing file
