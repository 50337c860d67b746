"""ggml tensor types and their sizes, read from gguf's GGML_QUANT_SIZES table (never from if-chains).

A ggml type stores ``block_size`` elements in ``type_size`` bytes; a row of ``n`` elements therefore takes
``n // block_size * type_size`` bytes (llama.cpp's ``ggml_row_size``). Pure.
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

CPU_TENSOR_ALIGNMENT = 32  # ggml-cpu's TENSOR_ALIGNMENT: every CPU buffer pads each tensor to this


class GgmlTypeError(ValueError):
    """A ggml type name or shape that has no size."""


def type_by_name(name: str) -> GGMLQuantizationType:
    """``"q8_0"`` / ``"F16"`` -> the gguf enum member; an unknown name lists the known ones."""
    key = name.strip().upper()
    try:
        return GGMLQuantizationType[key]
    except KeyError:
        known = ", ".join(t.name.lower() for t in GGML_QUANT_SIZES)
        raise GgmlTypeError(f"unknown ggml type {name!r}; known: {known}") from None


def block_size(t: GGMLQuantizationType) -> int:
    return GGML_QUANT_SIZES[t][0]


def type_size(t: GGMLQuantizationType) -> int:
    return GGML_QUANT_SIZES[t][1]


def row_size(t: GGMLQuantizationType | str, n: int) -> int:
    """Bytes of one row of ``n`` elements (``ggml_row_size``); ``n`` must be a whole number of blocks."""
    if isinstance(t, str):
        t = type_by_name(t)
    bs, ts = GGML_QUANT_SIZES[t]
    if n % bs:
        raise GgmlTypeError(f"a {t.name} row needs a multiple of {bs} elements, got {n}")
    return n // bs * ts


def nbytes(t: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    """Bytes of a contiguous tensor of ``shape`` (ne0 first, as GGUF stores it)."""
    if not shape:
        return type_size(t)
    rows = 1
    for d in shape[1:]:
        rows *= d
    return row_size(t, shape[0]) * rows


def is_quantized(t: GGMLQuantizationType | str) -> bool:
    """True for block-quantized types (block size > 1), as ggml_is_quantized decides."""
    if isinstance(t, str):
        t = type_by_name(t)
    return block_size(t) > 1


def pad(n: int, to: int) -> int:
    return -(-n // to) * to
