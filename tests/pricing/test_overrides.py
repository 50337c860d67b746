"""Tensor overrides (-ot PATTERN=BUFT, --n-cpu-moe, -cmoe, --n-cpu-ffn): parsing, order, and where weights land.

Known answers from the zoo's shapes (f16 = 2 B, f32 = 4 B, Q4_0 = 18 B per 32); CUDA buffers pad each tensor to
128 B and a quantized tensor by one row of (512 - ne0 % 512) elements.
"""

from __future__ import annotations

import pytest

from fitevict.engines.llama_cpp.dryrun import server_args
from fitevict.pricing.cmdline import parse_overrides, parse_server_argv
from fitevict.pricing.gguf import GgufStructure, PricingError
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.hostbufs import rule_table
from fitevict.pricing.placement import place
from fitevict.pricing.price import price

X86_AVX512 = rule_table({"avx2", "avx512f"})  # the rules of an x86 CPU with AVX-512 and no AMX

GPU = ("CUDA0",)
EXPERT = 96 * 136 * 4 * 2  # llama-moe: one f16 ffn_{gate,down,up}_exps of 96 x 136 x 4 experts = 104448 B


def _sizes(s: GgufStructure, cfg: LoadConfig) -> dict[str, int]:
    return {b.name: b.bytes for b in place(s, cfg, X86_AVX512).buffers}


def test_ot_value_splits_like_arg_cpp() -> None:
    assert parse_overrides(r"blk\.0\.=CPU,exps=CUDA0") == [(r"blk\.0\.", "CPU"), ("exps", "CUDA0")]
    with pytest.raises(PricingError, match="has no '='"):
        parse_overrides("exps")


def test_command_line_collects_overrides_in_order() -> None:
    cmd = parse_server_argv(["-m", "x.gguf", "-ot", "a=CPU,b=CUDA0", "--override-tensor", "c=CPU",
                             "--embeddings", "--pooling", "mean"])
    assert cmd.config.tensor_overrides == (("a", "CPU"), ("b", "CUDA0"), ("c", "CPU"))
    assert cmd.config.embeddings is True
    assert cmd.dry_run_args == ("--pooling", "mean")
    # -cmoe is llama.cpp's single LLM_FFN_EXPS_REGEX rule; --n-cpu-ffn one dense-FFN rule per layer
    assert parse_server_argv(["-m", "x", "-cmoe"]).config.tensor_overrides == (
        (r"\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"),)
    assert parse_server_argv(["-m", "x", "-ncffn", "2"]).config.tensor_overrides == (
        (r"blk\.0\.ffn_(up|down|gate)\.", "CPU"), (r"blk\.1\.ffn_(up|down|gate)\.", "CPU"))


def test_leading_n_cpu_moe_stays_a_count_a_later_one_is_spelled_out() -> None:
    first = parse_server_argv(["-m", "x", "--n-cpu-moe", "2", "-ot", "exps=CUDA0"]).config
    assert first.n_cpu_moe == 2 and first.tensor_overrides == (("exps", "CUDA0"),)
    later = parse_server_argv(["-m", "x", "-ot", "exps=CUDA0", "--n-cpu-moe", "2"]).config
    assert later.n_cpu_moe == 0
    assert later.tensor_overrides == (("exps", "CUDA0"),
                                      (r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"),
                                      (r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"))


@pytest.mark.parametrize("cfg", [
    LoadConfig(n_ctx=1000, tensor_overrides=((r"blk\.[01]\.ffn_(up|down)_exps", "CPU"), ("a,b", "CPU"))),
    LoadConfig(n_ctx=2048, n_parallel=2, n_cpu_moe=1, devices=GPU, n_gpu_layers=-1,
               tensor_overrides=(("exps", "CUDA0"), ("token_embd", "CPU")), embeddings=True),
])
def test_argv_round_trip(cfg: LoadConfig) -> None:
    """What the dry run and the seat are started with parses back to the same LoadConfig."""
    if any("," in p for p, _ in cfg.tensor_overrides):
        cfg = cfg.with_(tensor_overrides=cfg.tensor_overrides[:1])  # llama.cpp cannot express a ',' in a pattern
    assert parse_server_argv(server_args("m.gguf", cfg)).config == cfg
    assert LoadConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("overrides, match", [
    ((("exps", "CUDA0"),), r"unknown buffer type 'CUDA0'; available buffer types: CPU \(llama-server"),
    ((("exps", "CPU_REPACK"),), "unknown buffer type 'CPU_REPACK'"),  # only device buffer types can be named
    ((("blk.(", "CPU"),), "not a regular expression"),
    ((("a,b", "CPU"),), "splits -ot values"),
])
def test_refused_overrides_name_the_problem(structures: dict[str, GgufStructure], overrides: tuple,
                                            match: str) -> None:
    with pytest.raises(PricingError, match=match):
        price(structures["llama-moe"], LoadConfig(n_ctx=1000, tensor_overrides=overrides), host=X86_AVX512)


def test_overrides_to_cpu_on_a_cpu_only_load_change_nothing(structures: dict[str, GgufStructure]) -> None:
    """Without a GPU every weight already comes from the CPU list, so -ot .=CPU (repack included) is a no-op."""
    for s in structures.values():
        cfg = LoadConfig(n_ctx=1000)
        assert place(s, cfg.with_(tensor_overrides=((".", "CPU"),)), X86_AVX512).buffers == place(s, cfg, X86_AVX512).buffers


def test_experts_to_cpu_equals_n_cpu_moe(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-moe"]  # 2 layers, experts 96 x 136 x 4 f16
    full = _sizes(s, LoadConfig(devices=GPU, n_gpu_layers=-1))
    by_ot = _sizes(s, LoadConfig(devices=GPU, n_gpu_layers=-1, tensor_overrides=(("_exps", "CPU"),)))
    assert by_ot == _sizes(s, LoadConfig(devices=GPU, n_gpu_layers=-1, n_cpu_moe=2))
    # 6 expert tensors of 104448 B (a multiple of 128) leave CUDA0 for the mapped span
    assert full["CUDA0"] - by_ot["CUDA0"] == 6 * EXPERT
    te, last = s.tensor("token_embd.weight"), s.tensor("blk.1.ffn_up_exps.weight")
    assert te is not None and last is not None
    assert by_ot["CPU_Mapped"] == last.end - te.offset  # span from token_embd to the last expert moved


def test_first_matching_rule_wins_and_n_cpu_moe_comes_first(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-moe"]
    # -ngl 0: every layer on the CPU. --n-cpu-moe 1 keeps layer 0's experts there; -ot moves the rest (layer 1's
    # three expert tensors) to CUDA0: 3 * 104448 B
    a = parse_server_argv(["-m", "x", "-dev", "CUDA0", "-ngl", "0", "--n-cpu-moe", "1", "-ot", "exps=CUDA0"])
    assert _sizes(s, a.config)["CUDA0"] == 3 * EXPERT
    # the other order: -ot matches every expert first, the --n-cpu-moe rules after it never fire: 6 * 104448 B
    b = parse_server_argv(["-m", "x", "-dev", "CUDA0", "-ngl", "0", "-ot", "exps=CUDA0", "--n-cpu-moe", "1"])
    assert _sizes(s, b.config)["CUDA0"] == 6 * EXPERT
    # the KV cache stays with its layer: overrides move weights only
    pa, pn = price(s, a.config, host=X86_AVX512), price(s, LoadConfig(devices=GPU), host=X86_AVX512)
    assert pa.kv == pn.kv and pa.footprint.device("CUDA0").context.bytes == 0  # type: ignore[union-attr]


def test_tied_output_copy_follows_token_embd_overrides(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-tied"]  # no output.weight: token_embd (f32 96 x 1003 = 385152 B) doubles as the output
    base = LoadConfig(devices=GPU, n_gpu_layers=-1)
    natural = _sizes(s, base)
    assert natural["CPU_Mapped"] == 385152  # token_embd stays on the CPU; its copy is in CUDA0
    # -ot token_embd=CUDA0 moves token_embd, and the copy (created under the same name) lands in the same
    # buffer, where the loader reuses it: CUDA0 is unchanged and the mapped span is gone
    moved = _sizes(s, base.with_(tensor_overrides=(("token_embd", "CUDA0"),)))
    assert "CPU_Mapped" not in moved and moved["CUDA0"] == natural["CUDA0"]
    # "output.weight" names no tensor of a tied model: the copy is token_embd.weight, so this moves nothing
    assert _sizes(s, base.with_(tensor_overrides=((r"^output\.weight", "CPU"),))) == natural
    # ... while token_embd=CPU keeps the copy on the CPU too, in the same mapped buffer: CUDA0 loses 385152 B
    kept = _sizes(s, base.with_(tensor_overrides=(("token_embd", "CPU"),)))
    assert natural["CUDA0"] - kept["CUDA0"] == 385152 and kept["CPU_Mapped"] == 385152


def test_cpu_override_next_to_a_gpu_takes_the_host_buffer(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-q4_0"]  # blk.0.ffn_{gate,down,up}: Q4_0 160 x 416 = 37440 B; ffn_norm f32 160 = 640 B
    cfg = LoadConfig(devices=GPU, n_gpu_layers=-1, mmap=False, tensor_overrides=((r"blk\.0\.ffn", "CPU"),))
    # with a GPU in use the CPU list starts with CUDA_Host, which takes everything before CPU_REPACK could:
    # token_embd (Q4_0 160 x 1003 = 90270 B, padded to 32: 90272) is there anyway, the override adds
    # 3 * 37440 + 640 = 112960 B (multiples of the 32 B CPU alignment). CUDA0 loses them as CUDA sized them:
    # gate / up (ne0 160): 37440 + 352 / 32 * 18 = 37638 -> 37760; down (ne0 416): 37440 + 96 / 32 * 18 = 37494
    # -> 37504; ffn_norm 640: 2 * 37760 + 37504 + 640 = 113664
    natural = _sizes(s, cfg.with_(tensor_overrides=()))
    moved = _sizes(s, cfg)
    assert natural["CUDA_Host"] == 90272 and moved["CUDA_Host"] == 90272 + 112960
    assert natural["CUDA0"] - moved["CUDA0"] == 113664
    assert "CPU_REPACK" not in moved


def test_override_to_a_gpu_pads_quantized_rows(structures: dict[str, GgufStructure]) -> None:
    s = structures["llama-q4_0"]  # blk.0.attn_q: Q4_0 160 x 160 = 14400 B
    cfg = LoadConfig(devices=GPU, n_gpu_layers=0, tensor_overrides=((r"blk\.0\.attn_q", "CUDA0"),))
    # CUDA pads one row of 512 - 160 = 352 elements (352 / 32 * 18 = 198 B), then 128 B: PAD(14598, 128) = 14720
    assert _sizes(s, cfg)["CUDA0"] == 14720
