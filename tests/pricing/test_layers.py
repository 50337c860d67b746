"""Layer kinds and recurrent state widths, as llama.cpp 0c1e570's load_arch_hparams and create_memory decide them."""

from __future__ import annotations

from fitevict.pricing.gguf import load_structure
from fitevict.pricing.kv import kv_layers, resolve_context
from fitevict.pricing.layers import layer_kinds, state_widths
from fitevict.pricing.loadconfig import LoadConfig

KV = (0, 2, 0, 2, 0, 2)
FF = (0, 0, 64, 64, 0, 0)


def test_pure_recurrent_architectures_hold_a_state_on_every_trunk_layer() -> None:
    for arch in ("mamba", "mamba2", "rwkv6", "rwkv7", "arwkv7", "rwkv6qwen2"):
        k = layer_kinds(arch, 4, 0, (0,) * 4, (0,) * 4)
        assert k.recurrent == (True,) * 4 and k.attention == (False,) * 4, arch


def test_kv0_hybrids_split_on_head_count_kv() -> None:
    for arch in ("jamba", "granitehybrid", "lfm2", "lfm2moe", "plamo2"):
        k = layer_kinds(arch, 6, 0, KV, FF)
        assert k.recurrent == (True, False, True, False, True, False), arch
        assert k.attention == (False, True, False, True, False, True), arch
        assert [k.kind(i) for i in range(2)] == ["recurrent", "attention"]


def test_nemotron_h_mlp_blocks_hold_neither() -> None:
    k = layer_kinds("nemotron_h", 6, 0, (0, 2, 0, 0, 0, 2), (0, 0, 64, 64, 0, 0))
    assert k.recurrent == (True, False, False, False, True, False)
    assert k.attention == (False, True, False, False, False, True)
    assert k.kind(2) == "none"


def test_falcon_h1_layers_hold_both() -> None:
    k = layer_kinds("falcon-h1", 3, 0, (2, 2, 2), (64, 64, 64))
    assert all(k.kind(i) == "attention+recurrent" for i in range(3))


def test_qwen3next_family_uses_the_interval_or_the_key() -> None:
    k = layer_kinds("qwen3next", 9, 1, (2,) * 9, (64,) * 9)  # the last block is MTP: neither
    assert [k.kind(i) for i in range(9)] == ["recurrent"] * 3 + ["attention"] + ["recurrent"] * 3 + \
        ["attention", "none"]
    keyed = layer_kinds("qwen35", 4, 0, (2,) * 4, (64,) * 4, recurrent_key=[1, 0, 0, 1])
    assert keyed.recurrent == (True, False, False, True) and keyed.attention == (False, True, True, False)
    every3 = layer_kinds("qwen35moe", 6, 0, (2,) * 6, (64,) * 6, full_attention_interval=3)
    assert every3.attention == (False, False, True, False, False, True)


def test_attention_models_filter_mtp_blocks_only() -> None:
    assert layer_kinds("llama", 3, 0, (2, 0, 2), (64,) * 3).attention == (True, True, True)
    assert layer_kinds("deepseek2", 4, 1, (1,) * 4, (64,) * 4).attention == (True, True, True, False)


def test_state_widths_follow_llama_hparams() -> None:
    common = dict(ssm_d_conv=4, ssm_d_inner=192, ssm_d_state=16, ssm_n_group=2)
    # RWKV: token shifts (default 2) x n_embd, and n_embd x wkv head size
    assert state_widths(96, wkv_head_size=32, token_shift_count=2, shortconv_l_cache=0, **common) == (192, 3072)
    # LFM2: (l_cache - 1) x n_embd of convolution history, no scan state
    assert state_widths(96, wkv_head_size=0, token_shift_count=2, shortconv_l_cache=3, ssm_d_conv=0, ssm_d_inner=0,
                        ssm_d_state=0, ssm_n_group=0) == (192, 0)
    # mamba2: (d_conv - 1) x (d_inner + 2 n_group d_state), d_state x d_inner
    assert state_widths(96, wkv_head_size=0, token_shift_count=2, shortconv_l_cache=0, **common) == (3 * 256, 3072)


def test_zoo_hybrids_price_their_states_per_slot(zoo: dict) -> None:
    """lfm2: 3 short-conv layers of f32 [(l_cache - 1) * n_embd, 4 slots] and an empty scan state;
    granitehybrid: 3 mamba2 layers of [(d_conv - 1) * (d_inner + 2 * n_group * d_state), 4] + [d_state * d_inner, 4]
    f32 (zoo v2: [2 * 384, 4] and [3 * (768 + 64), 4] + [12288, 4])."""
    cfg = LoadConfig(n_ctx=1000)
    lfm2 = load_structure(zoo["lfm2-shortconv"].path)
    kv = kv_layers(lfm2, resolve_context(lfm2, cfg), cfg)
    assert [(x.il, x.kind) for x in kv.layers] == [(0, "recurrent"), (1, "recurrent"), (2, "full"),
                                                     (3, "recurrent"), (4, "full")]
    assert kv.bytes_of("recurrent") == 3 * (lfm2.shortconv_l_cache - 1) * lfm2.n_embd * 4 * 4
    granite = load_structure(zoo["granitehybrid-moe"].path)
    kv = kv_layers(granite, resolve_context(granite, cfg), cfg)
    assert kv.layers_recurrent == 3 and kv.layers_full == 1
    g = granite
    conv = (g.ssm_d_conv - 1) * (g.ssm_d_inner + 2 * g.ssm_n_group * g.ssm_d_state)
    assert kv.bytes_of("recurrent") == 3 * (conv + g.ssm_d_state * g.ssm_d_inner) * 4 * 4


def test_price_json_lists_each_layer_kind(zoo: dict) -> None:
    from typer.testing import CliRunner

    from fitevict.cli import app

    for name, kinds in (("lfm2-shortconv", ["recurrent", "recurrent", "attention", "recurrent", "attention"]),
                        ("gemma2-swa", ["attention+swa", "attention"] * 2), ("mamba", ["recurrent"] * 2)):
        r = CliRunner().invoke(app, ["price", "--json", str(zoo[name].path), "-c", "1000"],
                               env={"FITEVICT_LLAMA_SERVER": "/nonexistent"})
        assert r.exit_code == 0, r.output
        assert __import__("json").loads(r.stdout)["layer_kinds"] == kinds, name
