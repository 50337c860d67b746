"""A GGUF header reader that reads what pricing needs and skips the rest by length.

``gguf.GGUFReader`` turns every array element into a numpy object, so opening a file with a real vocabulary
(150k-262k token strings, their scores, types and BPE merges) takes tens of seconds and hundreds of MB. Pricing
needs the hyper-parameters, the per-layer arrays and each tensor's name, type, shape and offset; of the vocabulary
it needs only the counts. This reader memory-maps the file, decodes every scalar, keeps arrays up to
``KEEP_ITEMS`` elements, and steps over longer ones: numeric arrays by ``count * itemsize``, string arrays by each
string's length prefix, without building a string. The format is the GGUF spec (versions 2 and 3, either byte
order), as llama.cpp's ``gguf.cpp`` reads it; ``tests/pricing/test_gguf_header.py`` checks every field and tensor
against ``gguf.GGUFReader`` on every zoo file.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gguf import GGUFValueType

KEEP_ITEMS = 4096
"""Arrays up to this many elements are decoded (per-layer arrays, patterns); longer ones keep only their count."""

DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT: the tensor data starts at a multiple of general.alignment

# Scalar value types: struct code and size.
_SCALARS: dict[int, str] = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}


class HeaderError(ValueError):
    """The bytes are not a well-formed GGUF header; the message says where and what."""


@dataclass(frozen=True, slots=True)
class Field:
    """One key's value. ``value`` is a scalar, a tuple for an array of at most ``KEEP_ITEMS`` elements, or None
    for a longer array, whose ``count`` and ``nbytes`` are still exact."""

    type: GGUFValueType
    value: object
    item_type: GGUFValueType | None = None  # arrays only
    count: int = 1
    nbytes: int = 0  # bytes of the value as stored in the file


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor's header entry: ``shape`` is ne0 first, ``offset`` absolute in the file."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True, slots=True)
class Header:
    version: int
    byte_order: str  # "<" or ">"
    fields: dict[str, Field]
    tensors: tuple[TensorEntry, ...]
    alignment: int
    data_offset: int  # where the tensor data starts (absolute)

    def scalar(self, key: str) -> object | None:
        """The value of ``key`` (a tuple for a short array), None when absent or a skipped long array."""
        f = self.fields.get(key)
        return None if f is None else f.value

    def array_len(self, key: str) -> int | None:
        f = self.fields.get(key)
        return f.count if f is not None and f.type == GGUFValueType.ARRAY else None


class _Cursor:
    """Reads GGUF values from a buffer at a moving offset; every read is bounds-checked."""

    def __init__(self, buf: memoryview | mmap.mmap, order: str, size: int) -> None:
        self.buf, self.order, self.size, self.off = buf, order, size, 0
        self._u64 = struct.Struct(order + "Q").unpack_from
        self._u32 = struct.Struct(order + "I").unpack_from

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.off + n > self.size:
            raise HeaderError(f"truncated at byte {self.off}: {what} needs {n} bytes, the file has "
                              f"{max(0, self.size - self.off)} more")

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = self._u32(self.buf, self.off)[0]
        self.off += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = self._u64(self.buf, self.off)[0]
        self.off += 8
        return v

    def string(self, what: str) -> str:
        n = self.u64(what)
        self.need(n, what)
        s = bytes(self.buf[self.off:self.off + n]).decode("utf-8", "replace")
        self.off += n
        return s

    def skip_strings(self, count: int, what: str) -> None:
        """Step over ``count`` length-prefixed strings without building them (the vocabulary's hot loop)."""
        try:
            if self.order == "<":
                self.off = _skip_short_strings(self.buf, self.off, count, self.size)
            else:
                u64, buf, off = self._u64, self.buf, self.off
                for _ in range(count):
                    off += 8 + u64(buf, off)[0]
                self.off = off
        except (struct.error, IndexError):
            raise HeaderError(f"truncated: {what} runs past the file's {self.size} bytes") from None
        if self.off > self.size:
            raise HeaderError(f"truncated: {what} runs to byte {self.off}, past the file's {self.size} bytes")

    def scalar(self, vtype: int, what: str) -> object:
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        code = _SCALARS.get(vtype)
        if code is None:
            raise HeaderError(f"{what}: unknown GGUF value type {vtype} at byte {self.off}")
        n = struct.calcsize(code)
        self.need(n, what)
        v = struct.unpack_from(self.order + code, self.buf, self.off)[0]
        self.off += n
        return v

    def array(self, what: str) -> Field:
        start = self.off
        itype = self.u32(what)
        count = self.u64(what)
        if itype == GGUFValueType.ARRAY:
            raise HeaderError(f"{what}: nested arrays are not supported by llama.cpp's reader")
        if itype == GGUFValueType.STRING:
            if count <= KEEP_ITEMS:
                value: object = tuple(self.string(what) for _ in range(count))
            else:
                self.skip_strings(count, what)
                value = None
        else:
            code = _SCALARS.get(itype)
            if code is None:
                raise HeaderError(f"{what}: unknown GGUF array item type {itype} at byte {start}")
            nb = struct.calcsize(code) * count
            self.need(nb, what)
            value = struct.unpack_from(f"{self.order}{count}{code}", self.buf, self.off) if count <= KEEP_ITEMS \
                else None
            self.off += nb
        return Field(GGUFValueType.ARRAY, value, GGUFValueType(itype), count, self.off - start - 12)


def _skip_short_strings(buf: memoryview | mmap.mmap, off: int, count: int, size: int) -> int:
    """Where ``count`` little-endian length-prefixed strings starting at ``off`` end, found a window at a time.

    A string shorter than 256 bytes has a length field of one byte and seven zeros. In a window, every position
    followed by seven zero bytes is a candidate field; a candidate whose field points at the next candidate is one
    step of the chain. Starting from a known field, each run of such steps is taken at once, and a string where
    the run breaks (a longer string, or zeros inside a string) is stepped over by its own field. Every step taken
    is checked, so the result is exact whatever the bytes; the windows make it numpy's work, not Python's.
    """
    arr = np.frombuffer(buf, dtype=np.uint8)
    u64 = struct.Struct("<Q").unpack_from
    while count:
        w = min(size - off, max(4096, min(count * 24, 2 << 20)))
        if w < 64:
            off += 8 + u64(buf, off)[0]
            count -= 1
            continue
        win = arr[off:off + w]
        zero = win == 0
        seven = zero[1:w - 6].copy()
        for s in range(2, 8):
            seven &= zero[s:w - 7 + s]
        cand = np.flatnonzero(seven)
        nxt = cand + 8 + win[cand]
        breaks = np.flatnonzero(nxt[:-1] != cand[1:])  # cand[i] -> cand[i + 1] is not one step
        pos = 0
        while count and pos < w - 64:
            j = int(np.searchsorted(cand, pos))
            if j == cand.size or cand[j] != pos:
                pos += 8 + u64(buf, off + pos)[0]
                count -= 1
                continue
            b = int(np.searchsorted(breaks, j))
            last = int(breaks[b]) if b < breaks.size else cand.size - 1  # steps verified from cand[j] to cand[last]
            take = min(last - j + 1, count)
            pos = int(nxt[j + take - 1])
            count -= take
        off += pos
    return off


def _byte_order(buf: memoryview | mmap.mmap) -> tuple[str, int]:
    """GGUF has no byte-order mark: a version whose low half is zero was written big-endian (as gguf-py decides)."""
    (version,) = struct.unpack_from("<I", buf, 4)
    if version & 0xFFFF == 0:
        return ">", struct.unpack_from(">I", buf, 4)[0]
    return "<", version


def parse_header(buf: memoryview | mmap.mmap, size: int) -> Header:
    """The header of the GGUF bytes ``buf`` (``size`` long). Raises HeaderError for anything malformed."""
    if size < 24 or bytes(buf[:4]) != b"GGUF":
        raise HeaderError(f"not a GGUF file (starts with {bytes(buf[:4])!r}, expected b'GGUF')")
    order, version = _byte_order(buf)
    if version not in (2, 3):
        raise HeaderError(f"GGUF version {version} is not supported (2 and 3 are)")
    cur = _Cursor(buf, order, size)
    cur.off = 8
    n_tensors = cur.u64("the tensor count")
    n_kv = cur.u64("the key count")
    if n_tensors > size or n_kv > size:
        raise HeaderError(f"implausible counts ({n_tensors} tensors, {n_kv} keys) for a {size}-byte file")
    fields: dict[str, Field] = {}
    for i in range(n_kv):
        key = cur.string(f"key #{i}")
        vtype = cur.u32(f"the type of {key}")
        start = cur.off
        if vtype == GGUFValueType.ARRAY:
            fields[key] = cur.array(key)
        else:
            value = cur.scalar(vtype, key)
            fields[key] = Field(GGUFValueType(vtype), value, None, 1, cur.off - start)
    alignment = fields["general.alignment"].value if "general.alignment" in fields else DEFAULT_ALIGNMENT
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise HeaderError(f"general.alignment is {alignment!r}; it must be a power of two")
    infos = [_tensor_info(cur, i) for i in range(n_tensors)]
    data_offset = cur.off + (-cur.off % alignment)
    tensors = tuple(TensorEntry(name, t, shape, data_offset + rel) for name, t, shape, rel in infos)
    return Header(version, order, fields, tensors, alignment, data_offset)


def _tensor_info(cur: _Cursor, i: int) -> tuple[str, int, tuple[int, ...], int]:
    name = cur.string(f"tensor #{i}'s name")
    n_dims = cur.u32(f"{name}'s dimension count")
    if n_dims > 8:
        raise HeaderError(f"{name}: {n_dims} dimensions (GGML_MAX_DIMS is 4)")
    shape = tuple(cur.u64(f"{name}'s shape") for _ in range(n_dims))
    ggml_type = cur.u32(f"{name}'s type")
    return name, ggml_type, shape, cur.u64(f"{name}'s offset")


def read_header(path: str | Path) -> Header:
    """Memory-map ``path`` and parse its header. OSError for an unreadable file, HeaderError for a malformed one."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise HeaderError("the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return parse_header(mm, size)
