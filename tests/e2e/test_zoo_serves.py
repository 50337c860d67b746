"""Every zoo model loads in the real llama-server (CPU only) and answers a chat completion."""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import httpx
import pytest
from _server import EngineCrashed, running_server

from fitevict.zoo import ZOO_NAMES, ZooModel

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_model_serves_chat(name: str, zoo: dict[str, ZooModel], llama_server: Path, tmp_path: Path) -> None:
    model = zoo[name]
    try:
        _serves_chat(model, llama_server, tmp_path / "llama-server.log", ())
    except EngineCrashed as crash:
        # the pinned engine's own crash (Intel AMX, quantized weights, repacking on): fitevict loads such a model
        # again with -nr (seat/crash.py), and so does this test; only a quantized model may do it
        assert model.quant not in ("F16", "F32"), crash
        _serves_chat(model, llama_server, tmp_path / "llama-server-nr.log", ("-nr",))


def _serves_chat(model: ZooModel, llama_server: Path, log: Path, extra: tuple[str, ...]) -> None:
    with running_server(
        llama_server, model.path, "-dev", "none", "-c", "512", "-np", "1", "-lv", "4", *extra, timeout=120,
        log_path=log,
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


def _without_tensor(src: Path, dst: Path, drop: str) -> Path:
    """A copy of ``src`` without the tensor ``drop``: a file fitevict can price and llama-server refuses to load."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, str(r.fields["general.architecture"].contents()))
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = {"sub_type": f.types[-1]} if f.types[0] == gguf.GGUFValueType.ARRAY else {}
        w.add_key_value(name, f.contents(), f.types[0], **sub)
    for t in r.tensors:
        if t.name != drop:
            w.add_tensor(t.name, t.data, raw_shape=[int(x) for x in reversed(t.shape.tolist())],
                         raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_server_that_fails_to_load_reports_its_log(zoo: dict[str, ZooModel], llama_server: Path,
                                                   tmp_path: Path) -> None:
    """A seat whose engine fails to load answers the request with the engine's own words from its log tail, and
    the history's fail event points at the full log."""
    from _frontdoor import front_door

    models = tmp_path / "models"
    models.mkdir()
    _without_tensor(zoo["llama-gqa"].path, models / "broken.gguf", "blk.1.ffn_up.weight")
    with front_door(tmp_path, "--models-dir", str(models)) as fd:
        r = httpx.post(f"{fd.base_url}/v1/chat/completions", timeout=120,
                       json={"model": "broken", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
        assert r.status_code == 502, r.text
        message = r.json()["error"]["message"]
        assert "tensor 'blk.1.ffn_up.weight' not found" in message, message
        fails = httpx.get(f"{fd.base_url}/v1/models/history", params={"event": "fail"}, timeout=10).json()["data"]
    assert [e["model"] for e in fails] == ["broken"]
    log = Path(fails[0]["details"]["log"])
    assert str(log) in message
    assert "tensor 'blk.1.ffn_up.weight' not found" in log.read_text(errors="replace")
