"""The fast header reader against ``gguf.GGUFReader``: every field and tensor of every zoo file, and generated
files with long arrays of every type, in both byte orders."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fitevict.pricing.gguf_header import KEEP_ITEMS, HeaderError, read_header


def reader_value(field: gguf.ReaderField) -> object:
    """What GGUFReader holds for a field, in the header reader's terms (a tuple for an array)."""
    t = field.types[0]
    if t == GGUFValueType.ARRAY:
        if field.types[1] == GGUFValueType.STRING:
            return tuple(bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data)
        return tuple(field.parts[i].tolist()[0] for i in field.data)
    if t == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    return field.parts[field.data[0]].tolist()[0]


def assert_same_as_reader(path: Path) -> None:
    ours = read_header(path)
    theirs = GGUFReader(path, "r")
    pseudo = {"GGUF.version": ours.version, "GGUF.tensor_count": len(ours.tensors), "GGUF.kv_count": len(ours.fields)}
    assert {k: reader_value(theirs.fields[k]) for k in pseudo} == pseudo
    assert set(ours.fields) == set(theirs.fields) - set(pseudo), path.name
    for key, f in theirs.fields.items():
        if key in pseudo:
            continue
        mine = ours.fields[key]
        assert mine.type == f.types[0], key
        if f.types[0] == GGUFValueType.ARRAY:
            assert mine.item_type == f.types[1], key
            assert mine.count == len(f.data), key
            expected = reader_value(f)
            if mine.count <= KEEP_ITEMS:
                assert mine.value == expected, key
            else:
                assert mine.value is None, key
        else:
            assert mine.value == reader_value(f), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert a.ggml_type == int(b.tensor_type), a.name
        assert a.shape == tuple(int(x) for x in np.asarray(b.shape).tolist()), a.name
        assert a.offset == int(b.data_offset), a.name
    assert ours.data_offset == theirs.data_offset


def test_every_zoo_file_reads_as_gguf_reader_reads_it(zoo: dict) -> None:
    files = [m.path for m in zoo.values()]
    adapters = [p for m in zoo.values() for p in Path(m.path).parent.glob("*.adapters/*.gguf")]
    assert len(files) >= 20
    for p in [*files, *adapters]:
        assert_same_as_reader(Path(p))


ARRAY_TYPES = [GGUFValueType.UINT8, GGUFValueType.INT16, GGUFValueType.UINT32, GGUFValueType.INT32,
               GGUFValueType.FLOAT32, GGUFValueType.UINT64, GGUFValueType.INT64, GGUFValueType.FLOAT64,
               GGUFValueType.BOOL]
_NUMPY = {GGUFValueType.UINT8: np.uint8, GGUFValueType.INT16: np.int16, GGUFValueType.UINT32: np.uint32,
          GGUFValueType.INT32: np.int32, GGUFValueType.FLOAT32: np.float32, GGUFValueType.UINT64: np.uint64,
          GGUFValueType.INT64: np.int64, GGUFValueType.FLOAT64: np.float64, GGUFValueType.BOOL: np.bool_}


def write_file(path: Path, strings: list[str], numbers: tuple[GGUFValueType, int], big_endian: bool,
               n_tensors: int) -> None:
    order = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    w = gguf.GGUFWriter(path, "llama", endianess=order)
    w.add_block_count(2)
    w.add_key_value("tokenizer.ggml.tokens", strings, GGUFValueType.ARRAY, GGUFValueType.STRING)
    vtype, n = numbers
    w.add_array("test.numbers", [x for x in np.arange(n).astype(_NUMPY[vtype]).tolist()])
    w.add_key_value("test.typed", np.arange(n).astype(_NUMPY[vtype]).tolist(), GGUFValueType.ARRAY, vtype)
    w.add_string("test.after", "the key after the long arrays")
    for i in range(n_tensors):
        w.add_tensor(f"blk.{i}.w", np.ones((3, 5 + i), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_strings=st.sampled_from([1, 2, KEEP_ITEMS, KEEP_ITEMS + 1, 3 * KEEP_ITEMS + 7]),
       numbers=st.tuples(st.sampled_from(ARRAY_TYPES), st.sampled_from([1, KEEP_ITEMS, KEEP_ITEMS + 1])),
       big_endian=st.booleans(), n_tensors=st.integers(0, 3), text=st.text(max_size=6),
       odd_every=st.sampled_from([0, 1, 7, 1000]))
def test_long_arrays_are_counted_and_stepped_over(tmp_path: Path, n_strings: int, numbers: tuple, big_endian: bool,
                                                   n_tensors: int, text: str, odd_every: int) -> None:
    """Strings of every kind the fast step must not be fooled by: long ones (a two-byte length), empty ones, and
    ones holding runs of NUL bytes that look like length fields."""
    odd = ["x" * 300, "", "\x00" * 9 + "y", "\x00" * 7, "z" * 256 + "\x00" * 8]
    strings = [odd[i % len(odd)] if odd_every and i % odd_every == 0 else f"{text}{i}" for i in range(n_strings)]
    p = tmp_path / "long.gguf"
    write_file(p, strings, numbers, big_endian, n_tensors)
    assert_same_as_reader(p)
    h = read_header(p)
    assert h.byte_order == (">" if big_endian else "<")
    assert h.array_len("tokenizer.ggml.tokens") == n_strings
    assert h.scalar("test.after") == "the key after the long arrays"


def test_a_header_cut_anywhere_is_a_header_error(zoo: dict, tmp_path: Path) -> None:
    src = Path(zoo["llama-gqa"].path).read_bytes()
    end = read_header(zoo["llama-gqa"].path).data_offset - 32  # the last tensor entry ends within 32 bytes of this
    for cut in sorted({1, 7, 20, 24, 100, end // 3, end // 2, end - 8, end}):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(src[:cut])
        with pytest.raises(HeaderError):
            read_header(p)


def test_an_absurd_length_is_a_header_error_not_a_huge_read(tmp_path: Path) -> None:
    p = tmp_path / "bad.gguf"
    write_file(p, ["a", "b"], (GGUFValueType.UINT8, 1), False, 0)
    raw = bytearray(p.read_bytes())
    raw[24:32] = (2**62).to_bytes(8, "little")  # the first key's length
    p.write_bytes(bytes(raw))
    with pytest.raises(HeaderError, match="truncated"):
        read_header(p)
