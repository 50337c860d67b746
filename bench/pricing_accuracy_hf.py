"""HF pricing accuracy against real transformers seats: writes the HF section of docs/accuracy.md.

For every HF demo folder (plus a ~120 MB bench-only Llama) and configuration it starts a real seat process through
the transformers adapter, chats once, and puts beside fitevict's price:

- the seat's object walk (weights, quant state, buffers): the price's model term should equal it to the byte;
- the seat's measured PSS (committed + mapped) after load and one request, against the predicted model term
  plus the engine's overhead learned once per seat kind (the first seat of each kind, dtype and quantization:
  its PSS less its walk);
- the file-size heuristic and transformers' ``get_memory_footprint()`` (parameters + buffers, no quant state);
- load, first-answer, teardown and exit seconds, and the committed memory the teardown returned.

    .venv/bin/python bench/pricing_accuracy_hf.py [--zoo DIR] [--no-write]
"""

from __future__ import annotations

import argparse
import gc
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _docs import write_section  # noqa: E402

from fitevict.engines.process import free_port, stop_group  # noqa: E402
from fitevict.engines.transformers.engine import TransformersEngine  # noqa: E402
from fitevict.pricing.hf_price import HfLoadConfig, price_hf  # noqa: E402
from fitevict.pricing.safetensors import load_hf_structure  # noqa: E402
from fitevict.units import MiB  # noqa: E402
from fitevict.zoo.hf import HfRecipe, build, write_hf_zoo  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "accuracy.md"
CONFIGS = {"auto": HfLoadConfig(n_ctx=512), "bf16": HfLoadConfig(n_ctx=512, dtype="bfloat16"),
           "bnb4": HfLoadConfig(n_ctx=512, quant="bnb4"), "bnb8": HfLoadConfig(n_ctx=512, quant="bnb8")}
MEDIUM = HfRecipe("hf-llama-medium", "llama", "Llama, hidden 512, 8 layers (bench only)",
                  (("bos_token_id", 1), ("eos_token_id", 2), ("hidden_size", 512), ("intermediate_size", 1536),
                   ("max_position_embeddings", 2048), ("num_attention_heads", 8), ("num_hidden_layers", 8),
                   ("num_key_value_heads", 2), ("pad_token_id", 0), ("tie_word_embeddings", False),
                   ("vocab_size", 300)), 21)


def mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / MiB:.2f}"


def pct(pred: int, actual: int) -> str:
    return "n/a" if not actual else f"{(pred - actual) / actual * 100:+.1f}%"


def host_now(doc: dict) -> int:
    """The seat's committed memory plus the pages of the model's own files it maps (shared libraries' mapped pages
    are split among every process that maps them, so they are left out)."""
    return int(doc["committed_bytes"]) + int(doc["model_files_pss_bytes"])


def get_memory_footprint(path: Path, cfg: HfLoadConfig) -> int | None:
    from fitevict.engines.transformers.seat.model import load

    loaded = load(path, cfg)
    fn = getattr(loaded.obj, "get_memory_footprint", None)
    out = int(fn()) if fn else None
    del loaded
    gc.collect()
    return out


def run_seat(path: Path, cfg: HfLoadConfig, log: Path, chat: bool) -> dict:
    spec = TransformersEngine().launch_spec(path, cfg, free_port())
    t0 = time.monotonic()
    with log.open("wb") as f:
        proc = subprocess.Popen(spec.argv, env=dict(spec.env), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{spec.port}"
    try:
        with httpx.Client(timeout=60) as c:
            while True:
                try:
                    if c.get(f"{base}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError(f"seat exited {proc.returncode}: {log.read_text()[-2000:]}")
                time.sleep(0.05)
            ready = time.monotonic() - t0
            t1 = time.monotonic()
            if chat:
                c.post(f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}],
                                                              "max_tokens": 8}).raise_for_status()
            answer = time.monotonic() - t1
            doc = c.get(f"{base}/footprint").json()
            t2 = time.monotonic()
            report = c.post(f"{base}/unload").json()
            unload = time.monotonic() - t2
            proc.wait(timeout=60)
            exited = time.monotonic() - t2
    finally:
        stop_group(proc)
    return {"doc": doc, "report": report, "ready": ready, "answer": answer, "unload": unload, "exited": exited}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", type=Path, default=None)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    zoo = args.zoo or Path(tempfile.mkdtemp(prefix="fitevict-hf-accuracy-"))
    t_start = time.monotonic()
    models = {m.name: m.path for m in write_hf_zoo(zoo)}
    if not (zoo / MEDIUM.name / "config.json").exists():
        build(MEDIUM, zoo)
    models[MEDIUM.name] = zoo / MEDIUM.name
    learned: dict[tuple[str, str, str], tuple[int, str]] = {}  # (kind, dtype, quant) -> (overhead, learned on)
    rows, times = [], []
    for name, path in models.items():
        s = load_hf_structure(path)
        for label, cfg in CONFIGS.items():
            if s.kind == "diffusers" and cfg.quant != "none":
                continue
            p = price_hf(s, cfg)
            r = run_seat(path, cfg, zoo / f"{name}-{label}.log", chat=s.kind == "transformers")
            doc = r["doc"]
            walk = doc["walk"]["held_bytes"]
            measured = host_now(doc["process_now"])
            key = (s.kind, cfg.dtype, cfg.quant)
            if key not in learned:
                learned[key] = (measured - p.host_model_bytes, name)  # the seat's own memory: all but the model
            overhead, on = learned[key]
            predicted = p.host_model_bytes + overhead
            gmf = get_memory_footprint(path, cfg) if s.kind == "transformers" else None
            rows.append(f"| {name} | {label} | {p.model_bytes} | {walk} | {p.model_bytes - walk} | "
                        f"{mib(overhead)}{' (learned here)' if on == name else ''} | {mib(predicted)} | "
                        f"{mib(measured)} | {pct(predicted, measured)} | "
                        f"{mib(s.file_bytes)} ({pct(s.file_bytes, walk)}) | "
                        f"{mib(gmf)}{f' ({pct(gmf, walk)})' if gmf else ''} |")
            t = r["report"]
            times.append(f"| {name} | {label} | {r['ready']:.2f} | {doc['load_seconds']:.3f} | {r['answer']:.3f} | "
                         f"{t['seconds']:.3f} | {r['exited']:.2f} | {mib(t['returned_bytes'])} | "
                         f"{mib(t['held_above_baseline_bytes'])} | {t['verdict']} |")
    out = [
        "## Hugging Face folders (transformers seats)", "",
        f"Run on {platform.machine()} / {platform.system()}, CPU only, 2 shared cores, {time.monotonic() - t_start:.0f} s.",
        "Each row is a real seat process started through the transformers adapter (`MALLOC_MMAP_THRESHOLD_=65536`),",
        "asked one 8-token chat request, then read: its object walk (`/footprint`) and its host memory: committed",
        "(Pss_Anon + Pss_Shmem) plus the Pss of its mappings of the model's own files, after the request touched",
        "them (shared libraries' mapped pages are split among all processes that map them: left out).", "",
        "Weights: the price's model term against the walk, in bytes (target: exact). Total: the price's host model",
        "bytes (the CPU model term, plus the checkpoint a bitsandbytes load keeps mapped) plus the seat's overhead,",
        "learned once per seat kind (the first folder of each dtype and quantization: its measured memory less its",
        "price; libraries, the first request's runtime state) against the measured memory. The price's context and",
        "compute terms (KV for the whole `-c 512`, activations) are reserved maxima, left out here. File size and",
        "transformers' `get_memory_footprint()` (parameters and buffers; it misses bnb's quant state) against the",
        "walk, for comparison.", "",
        "| model | config | predicted weights B | walk B | diff B | overhead MiB | predicted total MiB | "
        "measured MiB | error | file size MiB (vs walk) | get_memory_footprint MiB (vs walk) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows, "",
        "### Load and release timings", "",
        "Seconds from spawn to `/health` 200 (imports included), the load itself as the seat timed it, the first",
        "8-token answer, the in-process teardown (`del` + `gc.collect()`, leak check, `malloc_trim(0)`), and",
        "`/unload` to process exit; committed memory the teardown returned, and what stayed above the pre-load",
        "baseline (first-request runtime state such as thread pools stays; under 8 MiB is not retention).", "",
        "| model | config | ready s | load s | first answer s | teardown s | unload to exit s | returned MiB | "
        "held above baseline MiB | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *times, "",
    ]
    text = "\n".join(out)
    if args.no_write:
        print(text)
    else:
        write_section("hf", text, doc=DOC)
        print(f"wrote the HF section of {DOC}")


if __name__ == "__main__":
    main()
