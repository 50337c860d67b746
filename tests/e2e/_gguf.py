"""Small GGUF rewrites for e2e tests."""

from __future__ import annotations

from pathlib import Path


def rewrite_arch(src: Path, dst: Path, arch: str) -> Path:
    """A copy of ``src`` whose architecture (and key prefix) is ``arch``: same tensors, same bytes."""
    import gguf

    r = gguf.GGUFReader(src)
    old = str(r.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        key = arch + name[len(old):] if name.startswith(old + ".") else name
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), f.types[0])
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=[int(x) for x in reversed(t.shape.tolist())], raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
