"""A GGUF file written as a stream: header, key-values (built with ``gguf.GGUFWriter``'s ``add_*`` calls, or copied
byte for byte out of another GGUF), tensor infos, then each tensor's bytes as a filler yields them. A file of
gigabytes never sits in memory, and a vocabulary of 262k tokens and 515k merges is copied without decoding one of
its strings (``gguf.GGUFReader`` takes seconds per 100k strings; this takes milliseconds).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

ALIGNMENT = 32  # general.alignment's default; the files written here do not set it
_SCALARS: dict[VT, str] = {
    VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I", VT.INT32: "<i",
    VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d",
}


class GgufFormatError(ValueError):
    """A file that is not the GGUF it should be (bad magic, a value type this reader does not know)."""


# ---------------------------------------------------------------------------------------------- key-values


def _string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _value(value: object, vtype: VT, sub_type: VT | None) -> bytes:
    if vtype == VT.STRING:
        return _string(value)  # type: ignore[arg-type]
    if vtype == VT.ARRAY:
        items = list(value)  # type: ignore[call-overload]
        sub = sub_type if sub_type is not None else VT.get_type(items[0])  # as GGUFWriter infers it
        return struct.pack("<IQ", sub, len(items)) + b"".join(_value(v, sub, None) for v in items)
    return struct.pack(_SCALARS[vtype], value)


def encode_kv(key: str, value: object, vtype: VT, sub_type: VT | None = None) -> bytes:
    """One key-value as GGUF stores it: key, value type, value."""
    return _string(key) + struct.pack("<I", vtype) + _value(value, vtype, sub_type)


def writer_kvs(w: gguf.GGUFWriter) -> list[bytes]:
    """The key-values a ``gguf.GGUFWriter`` was given (``general.architecture`` first), encoded, in its order."""
    return [encode_kv(k, v.value, v.type, v.sub_type) for kv in w.kv_data for k, v in kv.items()]


def _skip_value(buf: bytes, off: int, vtype: int) -> int:
    """The offset just past a value of type ``vtype`` at ``off``; strings are stepped over by their lengths."""
    if vtype == VT.STRING:
        return off + 8 + struct.unpack_from("<Q", buf, off)[0]
    if vtype == VT.ARRAY:
        sub, n = struct.unpack_from("<IQ", buf, off)
        off += 12
        if sub == VT.STRING:
            for _ in range(n):
                off += 8 + struct.unpack_from("<Q", buf, off)[0]
            return off
        if sub == VT.ARRAY:
            raise GgufFormatError("nested arrays are not supported")
        return off + struct.calcsize(_SCALARS[VT(sub)]) * n
    try:
        return off + struct.calcsize(_SCALARS[VT(vtype)])
    except (ValueError, KeyError) as err:
        raise GgufFormatError(f"unknown GGUF value type {vtype} at byte {off}") from err


def raw_kvs(path: Path, prefix: str) -> list[tuple[str, bytes]]:
    """(key, its encoded bytes) for every key-value of the GGUF at ``path`` whose key starts with ``prefix``, in
    the file's order, copied verbatim (key, type and value)."""
    buf = Path(path).read_bytes()
    if buf[:4] != b"GGUF":
        raise GgufFormatError(f"{path} is not a GGUF file (magic {buf[:4]!r})")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version < 2:
        raise GgufFormatError(f"{path} is GGUF version {version}; version 2 or later is needed")
    off, out = 24, []
    for _ in range(n_kv):
        start = off
        (klen,) = struct.unpack_from("<Q", buf, off)
        key = buf[off + 8: off + 8 + klen].decode()
        (vtype,) = struct.unpack_from("<I", buf, off + 8 + klen)
        off = _skip_value(buf, off + 12 + klen, vtype)
        if key.startswith(prefix):
            out.append((key, buf[start:off]))
    return out


# ---------------------------------------------------------------------------------------------- tensors


@dataclass(frozen=True, slots=True)
class Planned:
    """One tensor to write: its name, ggml ``ne`` (fastest dimension first) and type."""

    name: str
    ne: tuple[int, ...]
    qtype: QT

    @property
    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        n = 1
        for d in self.ne:
            n *= d
        if self.ne[0] % block:
            raise GgufFormatError(f"{self.name}: a row of {self.ne[0]} is not a whole number of {self.qtype.name} "
                                  f"blocks of {block}")
        return n // block * size


def _pad(n: int) -> int:
    return -n % ALIGNMENT


def _tensor_infos(tensors: Sequence[Planned]) -> bytes:
    out, offset = bytearray(), 0
    for t in tensors:
        out += _string(t.name) + struct.pack("<I", len(t.ne)) + struct.pack(f"<{len(t.ne)}Q", *t.ne)
        out += struct.pack("<IQ", t.qtype, offset)
        offset += t.nbytes + _pad(t.nbytes)
    return bytes(out)


def write_stream(path: Path, kvs: Sequence[bytes], tensors: Sequence[Planned],
                 fill: Callable[[Planned], Iterable[bytes | memoryview]]) -> int:
    """Write a GGUF (version 3) to ``path``: ``kvs`` as given, then ``tensors`` with the bytes ``fill`` yields for
    each (exactly its ``nbytes``). Returns the file's size."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + _tensor_infos(tensors)
    with open(path, "wb", buffering=1 << 20) as f:
        f.write(head + bytes(_pad(len(head))))
        for t in tensors:
            n = 0
            for chunk in fill(t):
                n += len(chunk)
                f.write(chunk)
            if n != t.nbytes:
                raise GgufFormatError(f"{t.name}: the filler gave {n} bytes, the tensor has {t.nbytes}")
            f.write(bytes(_pad(n)))
        return f.tell()
