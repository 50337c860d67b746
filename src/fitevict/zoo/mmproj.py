"""A tiny multimodal projector (``mmproj``) for the zoo: a llava-style CLIP vision tower (``clip.projector_type``
``mlp``) whose projection ends in the text model's ``n_embd``, so llama-server loads it beside that model with
``--mmproj``. Random weights (fixed seeds), f16 matrices and f32 norms / biases, as the llava converter writes them.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

IMAGE_SIZE = 32
PATCH_SIZE = 8
N_EMBD = 64
N_FF = 128
N_HEAD = 4
N_LAYER = 2
N_HIDDEN = 80  # mm.0 output, mm.2 input


def _tensors(n_embd_text: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, kind); numpy shape is ggml's ne reversed."""
    e, n_pos = N_EMBD, (IMAGE_SIZE // PATCH_SIZE) ** 2
    out: list[tuple[str, tuple[int, ...], str]] = [
        ("v.patch_embd.weight", (e, 3, PATCH_SIZE, PATCH_SIZE), "weight"),
        ("v.patch_embd.bias", (e,), "zeros"),
        ("v.position_embd.weight", (n_pos, e), "weight"),
        ("v.pre_ln.weight", (e,), "ones"), ("v.pre_ln.bias", (e,), "zeros"),
    ]
    for il in range(N_LAYER):
        p = f"v.blk.{il}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out += [(p + name + ".weight", (e, e), "weight"), (p + name + ".bias", (e,), "zeros")]
        out += [(p + "ln1.weight", (e,), "ones"), (p + "ln1.bias", (e,), "zeros"),
                (p + "ln2.weight", (e,), "ones"), (p + "ln2.bias", (e,), "zeros"),
                (p + "ffn_up.weight", (N_FF, e), "weight"), (p + "ffn_up.bias", (N_FF,), "zeros"),
                (p + "ffn_down.weight", (e, N_FF), "weight"), (p + "ffn_down.bias", (e,), "zeros")]
    out += [("mm.0.weight", (N_HIDDEN, e), "weight"), ("mm.0.bias", (N_HIDDEN,), "zeros"),
            ("mm.2.weight", (n_embd_text, N_HIDDEN), "weight"), ("mm.2.bias", (n_embd_text,), "zeros")]
    return out


def write_mmproj(path: Path, n_embd_text: int) -> Path:
    """Write the projector for a text model of width ``n_embd_text`` to ``path`` (atomically)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    w = gguf.GGUFWriter(tmp, "clip")
    try:
        w.add_name("fitevict zoo mmproj")
        w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
        w.add_string("clip.projector_type", "mlp")
        w.add_bool("clip.has_vision_encoder", True)
        w.add_bool("clip.use_gelu", True)
        for key, value in (("embedding_length", N_EMBD), ("feed_forward_length", N_FF), ("block_count", N_LAYER),
                           ("projection_dim", n_embd_text), ("attention.head_count", N_HEAD)):
            w.add_uint32(f"clip.vision.{key}", value)
        w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
        w.add_uint32("clip.vision.image_size", IMAGE_SIZE)
        w.add_uint32("clip.vision.patch_size", PATCH_SIZE)
        w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
        w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
        for name, shape, kind in _tensors(n_embd_text):
            if kind == "ones":
                w.add_tensor(name, np.ones(shape, dtype=np.float32))
            elif kind == "zeros":
                w.add_tensor(name, np.zeros(shape, dtype=np.float32))
            else:
                rng = np.random.default_rng(zlib.crc32(f"mmproj/{name}".encode()))
                w.add_tensor(name, (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).astype(np.float16))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    os.replace(tmp, path)
    return path


assert QT.F16  # the matrices' type, as written above
