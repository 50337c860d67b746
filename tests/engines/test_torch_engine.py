"""The transformers adapter without torch: argv built and parsed by one pair, seat env, registry, walk documents,
and a front door that never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fitevict.engines import engine_class
from fitevict.engines.transformers.engine import TransformersEngine, footprint_from_walk, hf_config
from fitevict.engines.transformers.seat import FAILED_LINE, FOOTPRINT_LINE, parse_seat_argv
from fitevict.guard import check_walk
from fitevict.pricing.footprint import HOST
from fitevict.pricing.hf_price import HfLoadConfig
from fitevict.pricing.loadconfig import LoadConfig

HEAVY = ("torch", "transformers", "diffusers", "peft", "accelerate", "bitsandbytes")


def test_front_door_imports_no_torch() -> None:
    code = ("import sys, fitevict.cli, fitevict.server.app, fitevict.engines.transformers.engine, fitevict.zoo.hf, "
            "fitevict.cli.price_hf, fitevict.zoo.peft, fitevict.supervisor.loadreport; from fitevict.engines import engine_class; engine_class('transformers'); "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_registry_names_the_catalogs_engine() -> None:
    assert engine_class("transformers") is TransformersEngine


def test_launch_spec_round_trips_through_the_seats_parser(tmp_path: Path) -> None:
    cfg = HfLoadConfig(n_ctx=1000, dtype="bfloat16", quant="bnb4", bnb4_double_quant=True, device_map="split",
                       max_memory=(("CUDA0", 123456),))
    spec = TransformersEngine().launch_spec(tmp_path / "m", cfg, 4321, test_keep_tensor="lm_head.weight")
    assert spec.argv[1:3] == ("-m", "fitevict.engines.transformers.seat")
    a = parse_seat_argv(spec.argv[3:])
    assert (a.model, a.port, a.cfg, a.test_keep) == (tmp_path / "m", 4321, cfg, "lm_head.weight")
    assert spec.env["MALLOC_MMAP_THRESHOLD_"] == "65536"


def test_a_cpu_seat_hides_cuda_and_returns_freed_memory_to_the_kernel(tmp_path: Path) -> None:
    spec = TransformersEngine().launch_spec(tmp_path / "m", LoadConfig(n_ctx=512), 1)
    assert spec.env["CUDA_VISIBLE_DEVICES"] == ""
    assert spec.env["MALLOC_MMAP_THRESHOLD_"] == "65536"
    assert parse_seat_argv(spec.argv[3:]).cfg == HfLoadConfig(n_ctx=512)
    assert hf_config(LoadConfig(devices=("CUDA0",))).device_map == "CUDA0"


def test_an_hf_base_seat_is_started_with_its_peft_adapters_in_order(tmp_path: Path) -> None:
    loras = (str(tmp_path / "b.adapters" / "poem"), str(tmp_path / "b.adapters" / "sql"))
    spec = TransformersEngine().launch_spec(tmp_path / "b", LoadConfig(n_ctx=512, loras=loras), 7,
                                            extra_args=("--dtype", "bfloat16"))
    argv = list(spec.argv)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--adapter"] == list(loras)  # request ids index these
    assert parse_seat_argv(spec.argv[3:]).cfg == HfLoadConfig(n_ctx=512, dtype="bfloat16", adapters=loras)


def test_model_extra_args_in_the_seats_flags_set_the_priced_config(tmp_path: Path) -> None:
    extra = ("--dtype", "bfloat16", "--quant", "bnb4", "--double-quant")
    cfg = hf_config(LoadConfig(n_ctx=2048), extra_args=extra)
    assert cfg == HfLoadConfig(n_ctx=2048, dtype="bfloat16", quant="bnb4", bnb4_double_quant=True)
    spec = TransformersEngine().launch_spec(tmp_path / "m", LoadConfig(n_ctx=2048), 9, extra_args=extra)
    assert parse_seat_argv(spec.argv[3:]).cfg == cfg


def _doc(devices: dict) -> dict:
    mem = {"committed_bytes": 300, "mapped_bytes": 200, "rss_bytes": 600, "source": "smaps_rollup"}
    return {"walk": {"devices": devices, "weight_bytes": 0, "declared_bytes": 0},
            "process": {"baseline": {**mem, "committed_bytes": 100}, "loaded": mem}}


def test_measured_footprint_from_the_logged_walk() -> None:
    doc = _doc({"cpu": {"total": 1000}, "cuda:0": {"total": 5000}})
    log = "noise\n" + FOOTPRINT_LINE + json.dumps(doc) + "\nmore noise\n"
    fp = TransformersEngine().measured_footprint(log)
    assert fp is not None
    assert [(d.name, d.model.bytes, d.model.source) for d in fp.devices] == [(HOST, 1000, "measured"),
                                                                             ("CUDA0", 5000, "measured")]
    assert fp.devices[0].context.source == "unavailable"  # KV is allocated per request, never 0
    assert all(d.output.source == "unavailable" and "per request" in d.output.reason for d in fp.devices)
    gpu_only = footprint_from_walk(_doc({"cuda:0": {"total": 5000}})).devices[0]  # the walk saw no host tensor
    assert (gpu_only.name, gpu_only.model.bytes, gpu_only.model.reason) == (
        HOST, 0, "the object walk found no tensor on the host")
    assert (fp.host_committed_bytes, fp.host_mapped_bytes, fp.host_source) == (300, 200, "measured")
    assert TransformersEngine().measured_footprint("no footprint line") is None


def test_a_walk_with_adapters_measures_them_as_their_own_term() -> None:
    doc = {**_doc({"cpu": {"total": 1300, "adapter": 300}}),
           "adapters": [{"name": "sql", "load_seconds": 0.01, "bytes": 300}]}
    fp = footprint_from_walk(doc)
    cpu = fp.devices[0]
    assert (cpu.model.bytes, cpu.adapters.bytes, cpu.adapters.source) == (1000, 300, "measured")
    assert footprint_from_walk(_doc({"cpu": {"total": 1000}})).devices[0].to_json().get("adapter_bytes") is None


def test_no_weights_is_refused_with_the_seats_reason() -> None:
    log = FAILED_LINE + json.dumps({"reason": "no weights: 0 B from the checkpoint"}) + "\n"
    reason = TransformersEngine.failure(log)
    v = check_walk(None, reason=reason or "")
    assert (v.accepted, v.check) == (False, "no-weights") and "0 B from the checkpoint" in v.reason
    assert check_walk(0).accepted is False
    assert check_walk(1024).accepted is True
