"""The transformers seat: price against the object walk, and a real seat process chatted with the openai SDK.

In-process tests load with torch here (tests are not the front door); e2e tests start the seat the way the
supervisor does, through the registry's adapter, and stop it through its own process group.
"""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import save_file

pytest.importorskip("torch", reason="the torch extra is not installed (pip install -e '.[torch]'): "
                    "transformers seats cannot run; ./run.sh installs it where a CPU torch wheel is at hand")

from fitevict.engines.process import free_port, stop_group  # noqa: E402
from fitevict.engines.transformers.engine import TransformersEngine  # noqa: E402
from fitevict.engines.transformers.seat import EXIT_NO_WEIGHTS  # noqa: E402
from fitevict.engines.transformers.seat import STOPPED_LINE  # noqa: E402
from fitevict.guard import check_walk
from fitevict.pricing.hf_price import HfLoadConfig, price_hf
from fitevict.pricing.safetensors import load_hf_structure

CONFIGS = {"auto": HfLoadConfig(n_ctx=256), "bf16": HfLoadConfig(n_ctx=256, dtype="bfloat16"),
           "bnb4": HfLoadConfig(n_ctx=256, quant="bnb4"),
           "bnb4-dq": HfLoadConfig(n_ctx=256, quant="bnb4", bnb4_double_quant=True),
           "bnb8": HfLoadConfig(n_ctx=256, quant="bnb8"),
           "f16+bnb4": HfLoadConfig(n_ctx=256, dtype="float16", quant="bnb4")}


def test_price_is_the_walk_to_the_byte(hf_zoo: dict) -> None:
    """Every demo folder under every configuration: predicted model bytes == the object walk's held bytes."""
    from fitevict.engines.transformers.seat.model import load
    from fitevict.engines.transformers.seat.walk import walk

    seen = []
    for name, z in hf_zoo.items():
        s = load_hf_structure(z.path)
        for label, cfg in CONFIGS.items():
            if s.kind == "diffusers" and cfg.quant != "none":
                continue
            loaded = load(z.path, cfg)
            w = walk(loaded.obj).to_json()
            seen.append((name, label, price_hf(s, cfg).model_bytes, w["held_bytes"]))
            if name == "hf-llama-tied":
                assert [t["path"] for t in w["tied"]] == ["lm_head.weight"]  # counted once
            if name == "hf-ddpm":
                assert w["devices"]["cpu"]["scheduler"] > 0  # scheduler tables, outside any module
            if cfg.quant == "bnb4":
                assert w["devices"]["cpu"]["quant_state"] > 0  # outside parameters()
            del loaded
            gc.collect()
    assert [x for x in seen if x[2] != x[3]] == []
    assert len(seen) == 4 * len(CONFIGS) + 2


def test_meta_tensors_are_declared_not_held(hf_zoo: dict) -> None:
    """A model never materialised (every tensor on the meta device) holds nothing: its sizes are declared, and a
    guard on the walk refuses it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from fitevict.engines.transformers.seat.walk import walk

    z = hf_zoo["hf-llama-gqa"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(z.path)))
    w = walk(model)
    doc = w.to_json()
    assert doc["held_bytes"] == 0 and w.weight_bytes == 0
    weights = price_hf(load_hf_structure(z.path), HfLoadConfig()).weight_bytes
    assert doc["declared_bytes"] - doc["devices"]["declared"]["buffer"] == weights
    assert not check_walk(w.weight_bytes).accepted


def test_split_device_map_covers_every_tensor_of_the_model(hf_zoo: dict) -> None:
    """The explicit device_map a split seat passes to from_pretrained names a device for every parameter and
    buffer (accelerate refuses a map with gaps), and puts the groups where the price put them."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from fitevict.engines.transformers.seat.model import device_map

    for name in ("hf-llama-gqa", "hf-qwen2-swa", "hf-mixtral-moe", "hf-llama-tied"):
        path = hf_zoo[name].path
        cfg = HfLoadConfig(device_map="split", max_memory=(("CUDA0", 300_000),))
        dm = device_map(path, cfg)
        assert isinstance(dm, dict)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(path)))
        names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
        assert [n for n in names if not any(n == k or n.startswith(k + ".") for k in dm)] == []
        priced = dict(price_hf(load_hf_structure(path), cfg).placement)
        assert {g: ("CPU" if d == "cpu" else f"CUDA{d}") for g, d in dm.items() if g in priced} == priced


def test_gptq_style_folder_prices_what_an_independent_reader_holds(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 4, "vocab_size": 300, "max_position_embeddings": 512, "dtype": "float16",
           "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32}}
    t = {"model.embed_tokens.weight": np.ones((300, 64), np.float16),
         "model.layers.0.mlp.up_proj.qweight": np.ones((8, 172), np.int32),
         "model.layers.0.mlp.up_proj.qzeros": np.ones((2, 22), np.int32),
         "model.layers.0.mlp.up_proj.scales": np.ones((2, 172), np.float16),
         "model.layers.0.mlp.up_proj.g_idx": np.ones(64, np.int32)}
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "config.json").write_text(json.dumps(cfg))
    save_file(t, str(tmp_path / "g" / "model.safetensors"))
    held = sum(x.numel() * x.element_size() for x in load_file(str(tmp_path / "g" / "model.safetensors")).values())
    assert price_hf(load_hf_structure(tmp_path / "g"), HfLoadConfig(dtype="float32")).weight_bytes == held


@dataclass
class Seat:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _wait_ready(seat: Seat, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as c:
        while time.monotonic() < deadline:
            try:
                if c.get(f"{seat.base}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            try:  # waits for the process to exit, at most a short poll interval
                rc = seat.proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                continue
            raise AssertionError(f"seat exited {rc} before it was ready:\n{seat.log_text()[-3000:]}")
    raise AssertionError(f"seat not ready after {timeout} s:\n{seat.log_text()[-3000:]}")


def _start(path: Path, cfg: HfLoadConfig, log: Path, **kw: str) -> Seat:
    spec = TransformersEngine().launch_spec(path, cfg, free_port(), **kw)  # type: ignore[arg-type]
    with log.open("wb") as f:
        proc = subprocess.Popen(spec.argv, env=dict(spec.env), stdin=subprocess.DEVNULL, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return Seat(proc, spec.port, log)


@contextmanager
def running_seat(path: Path, cfg: HfLoadConfig, log: Path, **kw: str) -> Iterator[Seat]:
    seat = _start(path, cfg, log, **kw)
    try:
        _wait_ready(seat)
        yield seat
    finally:
        stop_group(seat.proc)


@pytest.mark.e2e
def test_seat_serves_openai_routes_and_releases_cleanly(hf_zoo: dict, tmp_path: Path) -> None:
    from openai import OpenAI

    z = hf_zoo["hf-qwen2-swa"]
    cfg = HfLoadConfig(n_ctx=512)
    with running_seat(z.path, cfg, tmp_path / "seat.log") as seat:
        client = OpenAI(base_url=f"{seat.base}/v1", api_key="none", max_retries=0)
        msgs = [{"role": "user", "content": "tell me a story"}]
        r = client.chat.completions.create(model=z.name, messages=msgs, max_tokens=6)  # type: ignore[arg-type]
        assert r.usage is not None and r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"
        timings = r.model_extra["timings"]  # type: ignore[index]
        assert timings["prompt_n"] == r.usage.prompt_tokens and timings["predicted_n"] == 6
        assert timings["prompt_ms"] > 0 and timings["predicted_per_second"] > 0
        pieces = [c.choices[0].delta.content for c in client.chat.completions.create(
            model=z.name, messages=msgs, max_tokens=6, stream=True) if c.choices and c.choices[0].delta.content]  # type: ignore
        # greedy decoding: the stream spells what the plain request answered
        assert "".join(pieces) == r.choices[0].message.content
        comp = client.completions.create(model=z.name, prompt="the model fits", max_tokens=3)
        assert comp.usage is not None and comp.usage.completion_tokens == 3
        emb = client.embeddings.create(model=z.name, input=["hello", "world"])
        hidden = json.loads((z.path / "config.json").read_text())["hidden_size"]
        assert len(emb.data) == 2 and len(emb.data[0].embedding) == hidden

        doc = TransformersEngine.fetch_footprint(seat.port)
        assert doc["walk"]["held_bytes"] == price_hf(load_hf_structure(z.path), cfg).model_bytes
        assert doc["malloc_mmap_threshold"] == "65536"
        # as stored on the CPU the weights stay file-backed: the request touched the checkpoint's pages
        assert doc["process_now"]["model_files_pss_bytes"] > 0
        fp = TransformersEngine().measured_footprint(seat.log_text())
        assert fp is not None and fp.devices[0].model.bytes == doc["walk"]["held_bytes"]
        assert check_walk(doc["walk"]["weight_bytes"]).accepted

        report = TransformersEngine.unload(seat.port)
        assert report["leaks"] == [] and report["verdict"] in ("clean", "allocator-retention")
        assert report["watched_tensors"] == doc["walk"]["tensors"]
        assert seat.proc.wait(timeout=30) == 0  # the seat exits after its teardown
    assert TransformersEngine.teardown(seat.log_text()) == report


@pytest.mark.e2e
@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_hangs_up_stops_its_generation(hf_zoo: dict, tmp_path: Path, stream: bool) -> None:
    """A long generation whose client closes the connection (mid-stream, or while waiting for a whole answer)
    stops between two tokens, says so in the seat's log, and frees the seat for the next request."""
    z = hf_zoo["hf-qwen2-swa"]
    n = 100_000
    with running_seat(z.path, HfLoadConfig(n_ctx=n + 64), tmp_path / "seat.log") as seat:
        body = {"model": z.name, "prompt": "go", "max_tokens": n, "ignore_eos": True, "stream": stream}
        if stream:
            with httpx.stream("POST", f"{seat.base}/v1/completions", json=body, timeout=60) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        break  # the first text is in (the streamer sends whole words): hang up
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{seat.base}/v1/completions", json=body, timeout=1.0)
        # the seat answers the next request (the lock is free), and its log says where the first one stopped
        r2 = httpx.post(f"{seat.base}/v1/completions", json={"model": z.name, "prompt": "hi", "max_tokens": 2},
                        timeout=120)
        assert r2.status_code == 200, r2.text
        stopped = [line for line in seat.log_text().splitlines() if line.startswith(STOPPED_LINE)]
        assert len(stopped) == 1, seat.log_text()[-2000:]
        assert int(stopped[0].split(" after ")[1].split()[0]) < n


@pytest.mark.e2e
def test_a_seat_told_to_stop_mid_answer_cuts_it_then_tears_down_clean(hf_zoo: dict, tmp_path: Path) -> None:
    """SIGTERM while it streams: the answer ends at its next token without its last chunk (its reader sees it
    broken off, never whole), and only then is the model let go, so the leak breaker finds no tensor alive (the
    answer's thread held the model while the teardown ran, and its tensors were named as leaks)."""
    z = hf_zoo["hf-qwen2-swa"]
    n = 100_000
    with running_seat(z.path, HfLoadConfig(n_ctx=n + 64), tmp_path / "seat.log") as seat:
        body = {"model": z.name, "prompt": "go", "max_tokens": n, "ignore_eos": True, "stream": True}
        lines: list[str] = []
        with pytest.raises(httpx.RemoteProtocolError):  # the chunked answer ends without its last chunk
            with httpx.stream("POST", f"{seat.base}/v1/completions", json=body, timeout=60) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    lines.append(line)
                    if len(lines) == 1:
                        seat.proc.send_signal(signal.SIGTERM)  # the first text is in: stop the seat
        assert lines and "data: [DONE]" not in lines
        assert seat.proc.wait(timeout=60) == 0
    log = seat.log_text()
    stopped = [line for line in log.splitlines() if line.startswith(STOPPED_LINE)]
    assert len(stopped) == 1 and "the seat is stopping after" in stopped[0], log[-2000:]
    report = TransformersEngine.teardown(log)
    assert report is not None and report["leaks"] == [] and report["in_flight"].startswith("an answer was cut"), report


@pytest.mark.e2e
def test_leak_breaker_names_a_leaked_tensor(hf_zoo: dict, tmp_path: Path) -> None:
    z = hf_zoo["hf-llama-gqa"]
    leaked = "model.layers.1.mlp.up_proj.weight"
    with running_seat(z.path, HfLoadConfig(n_ctx=256, dtype="bfloat16"), tmp_path / "seat.log",
                      test_keep_tensor=leaked) as seat:
        report = TransformersEngine.unload(seat.port)
    assert report["verdict"] == "leak"
    c = json.loads((z.path / "config.json").read_text())
    assert report["leaks"] == [{"path": leaked, "bytes": c["intermediate_size"] * c["hidden_size"] * 2}]  # bf16


@pytest.mark.e2e
def test_a_load_without_weights_from_the_files_is_refused(tmp_path: Path, hf_zoo: dict) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    cfg = json.loads((hf_zoo["hf-llama-gqa"].path / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (folder / f).write_bytes((hf_zoo["hf-llama-gqa"].path / f).read_bytes())
    save_file({"unrelated.weight": np.ones(4, np.float32)}, str(folder / "model.safetensors"))
    seat = _start(folder, HfLoadConfig(n_ctx=256), tmp_path / "seat.log")
    try:
        assert seat.proc.wait(timeout=60) == EXIT_NO_WEIGHTS
    finally:
        stop_group(seat.proc)
    log = seat.log_text()
    assert TransformersEngine().measured_footprint(log) is None  # no process-memory figure stands in
    reason = TransformersEngine.failure(log)
    assert reason is not None and reason.startswith("no weights") and "missing from the files" in reason
    v = check_walk(None, reason=reason)
    assert (v.accepted, v.check) == (False, "no-weights")


@pytest.fixture(scope="module")
def peft_base(hf_zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[str, ...]]:
    """A copy of the HF demo base with its two demo PEFT adapters beside it (fitevict.zoo.peft)."""
    import shutil

    from fitevict.zoo.peft import write_peft_adapters

    base = tmp_path_factory.mktemp("peft") / "hf-llama-gqa"
    shutil.copytree(hf_zoo["hf-llama-gqa"].path, base)
    return base, tuple(str(a.path) for a in write_peft_adapters(base, ("sql", "poem")))


def test_peft_adapters_are_priced_to_the_byte_and_each_changes_the_output(peft_base: tuple) -> None:
    """On one resident base, under three load configurations: the walk finds each adapter's bytes as priced from
    its header (LoRA weights in float32 even on a bf16 or 4-bit base), greedy tokens differ between the adapters
    and the base, and the base with its adapters disabled is exactly the base loaded alone."""
    from dataclasses import replace

    from fitevict.engines.transformers.seat.seat import HfSeat as InProcess
    from fitevict.pricing.peft import adapter_held_bytes, load_peft_adapter

    base, folders = peft_base
    adapters = tuple(load_peft_adapter(f) for f in folders)
    s = load_hf_structure(base)
    body = {"max_tokens": 8}
    sql, poem = [{"id": 0, "scale": 1}, {"id": 1, "scale": 0}], [{"id": 0, "scale": 0}, {"id": 1, "scale": 1}]
    for label in ("auto", "bf16", "bnb4"):
        alone = InProcess(base, CONFIGS[label])
        alone.load()
        plain = alone.runner.generate("the cat sat on", body, special=True)[0]  # type: ignore[union-attr]
        alone.unload()
        cfg = replace(CONFIGS[label], adapters=folders)
        seat = InProcess(base, cfg)
        seat.load()
        cpu = price_hf(s, cfg, adapters=adapters).footprint.device("CPU")
        walked = seat.footprint["walk"]["devices"]["cpu"]
        assert (walked["adapter"], walked["total"] - walked["adapter"]) == (cpu.adapters.bytes, cpu.model.bytes), label
        assert [a["bytes"] for a in seat.footprint["adapters"]] == [adapter_held_bytes(a, None) for a in adapters]
        run = seat.runner
        assert run is not None
        texts, acts = {}, {}
        for name, lora in (("sql", sql), ("poem", poem), ("base", None), ("sql-again", sql), ("sql-again2", sql)):
            text, _t, _f, act = run.generate("the cat sat on", {**body, **({"lora": lora} if lora else {})},
                                             special=True)
            texts[name], acts[name] = text, act
        assert len({texts["sql"], texts["poem"], texts["base"]}) == 3, (label, texts)
        assert texts["base"] == plain and texts["sql-again"] == texts["sql"]
        assert (acts["poem"].adapter, acts["poem"].switched, acts["base"].adapter) == ("poem", True, None)
        assert acts["sql-again"].switched and not acts["sql-again2"].switched
        streamed = list(run.stream("the cat sat on", {**body, "lora": poem}, special=True))
        assert streamed[0].adapter == "poem" and "".join(p for p in streamed[1:-1]) == texts["poem"]  # type: ignore
        with pytest.raises(ValueError, match="a transformers seat applies one adapter per request"):
            run.generate("x", {**body, "lora": [{"id": 0, "scale": 1}, {"id": 1, "scale": 1}]}, special=True)
        with pytest.raises(ValueError, match="id 5 is not an adapter of this seat"):
            run.generate("x", {**body, "lora": [{"id": 5, "scale": 1}]}, special=True)
        del run
        report = seat.unload()
        assert report["leaks"] == [] and report["watched_tensors"] == seat.footprint["walk"]["tensors"]
