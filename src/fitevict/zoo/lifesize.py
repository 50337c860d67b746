"""The life-size zoo: deterministic GGUF models at the shapes of public models (``lifesize_recipes.py``), with
every ``tokenizer.*`` key copied byte for byte from the vocabulary the engine's source ships
(``<llama.cpp>/models/ggml-vocab-*.gguf``) and random weights written directly as quantized blocks, so a GB takes
seconds. Q4_0 and Q8_0 blocks have small finite f16 scales (a weight's spread is about 0.02, as in the demo zoo);
norms are f32 ones; nothing is NaN or infinite. One K-quant (Q4_K_M) is made from a written model by the engine's
``llama-quantize``.

Files are written only when asked, as ``<root>/<name>.gguf`` (root: a DIR, else ``<cache>/lifesize``), each through
a temporary name and a rename. Each file's key, a sha256 of (recipe, vocabulary file, template, writer version,
and for a K-quant its source's key and the ``llama-quantize`` binary), is kept beside it in
``<root>/.lifesize/<name>.json`` with its size and mtime: a file whose key, size and mtime still match is reused.

The engine's source and ``llama-quantize`` are given by the caller (``llama_cpp.install.source_dir()`` and
``resolve_binary("llama-quantize")``): the zoo does not import the engines.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import version as _dist_version
from pathlib import Path

import gguf
from gguf import GGUFValueType as VT

from fitevict.paths import cache_dir
from fitevict.zoo.gguf_stream import encode_kv, raw_kvs, write_stream, writer_kvs
from fitevict.zoo.lifesize_data import fill, planned_tensors
from fitevict.zoo.lifesize_recipes import LifeSize, LifeSizeError, resolve_life_size
from fitevict.zoo.recipes import ZooModel
from fitevict.zoo.write import add_model_metadata, check_dest, fingerprint, sha256_file

WRITER_VERSION = 1
STAMP_DIR = ".lifesize"
REMEDY = "fitevict engine install llama.cpp"


@dataclass(frozen=True, slots=True)
class Written:
    """One life-size file: the zoo record, the seconds it took (0 when reused) and whether it was reused."""

    model: ZooModel
    seconds: float
    reused: bool


def default_root() -> Path:
    return cache_dir() / "lifesize"


def vocab_file(source: Path, vocab: str) -> Path:
    return Path(source) / "models" / f"ggml-vocab-{vocab}.gguf"


def _need(path: Path, what: str) -> Path:
    if not path.is_file():
        raise LifeSizeError(f"{what} {path} is missing: the life-size models copy their vocabularies from the "
                            f"engine's source (llama-cpp-python 0.3.36's vendor/llama.cpp/models); run "
                            f"`{REMEDY}` to download and build it")
    return path


# ---------------------------------------------------------------------------------------------- one file


def _template(m: LifeSize, source: Path) -> Path | None:
    return _need(Path(source) / "models" / "templates" / m.template, "the chat template") if m.template else None


def _metadata(m: LifeSize, source: Path) -> list[bytes]:
    """The key-values: the recipe's model keys, then every tokenizer key of the vocabulary, verbatim (and the
    family's chat template where the vocabulary has none)."""
    r = m.recipe
    w = gguf.GGUFWriter(None, r.arch)
    add_model_metadata(w, r)
    if r.weight_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tok = raw_kvs(_need(vocab_file(source, m.vocab), "the vocabulary file"), "tokenizer.")
    n_vocab = _array_len(dict(tok).get("tokenizer.ggml.tokens", b""))
    if n_vocab != r.n_vocab:
        raise LifeSizeError(f"{vocab_file(source, m.vocab)} has {n_vocab} tokens, {m.name} needs {r.n_vocab}: "
                            f"not the vocabulary this zoo was made for; run `{REMEDY} --force`")
    out = writer_kvs(w) + [b for _, b in tok]
    template = _template(m, source)
    if template is not None and "tokenizer.chat_template" not in dict(tok):
        out.append(encode_kv("tokenizer.chat_template", template.read_text(), VT.STRING))
    return out


def _array_len(record: bytes) -> int:
    """The item count of an encoded array key-value (0 for anything else)."""
    if not record:
        return 0
    klen = int.from_bytes(record[:8], "little")
    at = 8 + klen
    if int.from_bytes(record[at:at + 4], "little") != VT.ARRAY:
        return 0
    return int.from_bytes(record[at + 8:at + 16], "little")


def _write_direct(m: LifeSize, source: Path, tmp: Path) -> None:
    kvs = _metadata(m, source)
    planned = planned_tensors(m)
    kinds = {t.name: kind for t, kind in planned}
    pools: dict[gguf.GGMLQuantizationType, bytes] = {}
    write_stream(tmp, kvs, [t for t, _ in planned], lambda t: fill(m.recipe, t, kinds[t.name], pools))


def _write_kquant(m: LifeSize, src: Path, tmp: Path, quantize: Path | None) -> None:
    if quantize is None or not quantize.is_file():
        raise LifeSizeError(f"{m.name} is made by llama-quantize, which is missing ({quantize or 'not found'}); "
                            f"run `{REMEDY}`")
    argv = [str(quantize), "--allow-requantize", str(src), str(tmp), m.kquant, str(os.cpu_count() or 1)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LifeSizeError(f"llama-quantize {m.kquant} of {src.name} failed (exit {proc.returncode}): "
                            f"{(proc.stdout + proc.stderr)[-1500:]}")


# ---------------------------------------------------------------------------------------------- the cache


def cache_key(m: LifeSize, source: Path, *, source_key: str = "", quantize: Path | None = None) -> str:
    """What a file's bytes depend on: the recipe, the vocabulary file and template, this writer (and the gguf and
    numpy versions); for a K-quant, its source's key and the llama-quantize binary."""
    template = _template(m, source)
    parts = {
        "recipe": fingerprint(m.recipe),
        "vocab": sha256_file(_need(vocab_file(source, m.vocab), "the vocabulary file")),
        "template": sha256_file(template) if template else "",
        "rope_freqs": m.rope_freqs,
        "writer": WRITER_VERSION,
        "gguf": _dist_version("gguf"),
    }
    if m.kquant:
        parts |= {"kquant": m.kquant, "source": source_key,
                  "quantize": sha256_file(quantize) if quantize and quantize.is_file() else "missing"}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _stamp_path(root: Path, name: str) -> Path:
    return root / STAMP_DIR / f"{name}.json"


def _is_current(root: Path, name: str, key: str) -> bool:
    try:
        stamp = json.loads(_stamp_path(root, name).read_text())
        st = (root / f"{name}.gguf").stat()
    except (OSError, ValueError):
        return False  # no stamp, an unreadable one or no file: written again
    return isinstance(stamp, dict) and stamp.get("key") == key and stamp.get("bytes") == st.st_size \
        and stamp.get("mtime_ns") == st.st_mtime_ns


def _stamp(root: Path, name: str, key: str, seconds: float) -> None:
    st = (root / f"{name}.gguf").stat()
    path = _stamp_path(root, name)
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"key": key, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                                   "seconds": round(seconds, 3), "writer": WRITER_VERSION}, indent=2) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _ensure(m: LifeSize, root: Path, source: Path, keys: dict[str, str], quantize: Path | None,
            say: Callable[[str], None]) -> Written:
    key = cache_key(m, source, source_key=keys.get(m.source, ""), quantize=quantize)
    keys[m.name] = key
    path = root / f"{m.name}.gguf"
    reused = _is_current(root, m.name, key)
    seconds = 0.0
    if reused:
        say(f"up to date {m.name}")
    else:
        say(f"writing {m.name} ({m.quant})")
        tmp = root / f".{m.name}.gguf.tmp-{os.getpid()}"
        t0 = time.monotonic()
        try:
            if m.kquant:
                _write_kquant(m, root / f"{m.source}.gguf", tmp, quantize)
            else:
                _write_direct(m, source, tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        seconds = time.monotonic() - t0
        _stamp(root, m.name, key, seconds)
        say(f"wrote {m.name}: {path.stat().st_size / 1e9:.2f} GB in {seconds:.1f} s")
    r = m.recipe
    model = ZooModel(name=m.name, path=path, arch=r.arch, quant=m.quant, description=r.description,
                     file_bytes=path.stat().st_size)
    return Written(model, seconds, reused)


def write_life_size(source: Path, dest: Path | None = None, *, only: Iterable[str] | None = None,
                    quantize: Path | None = None, progress: Callable[[str], None] | None = None) -> list[Written]:
    """Write (or reuse) the life-size models, all or those in ``only`` (with any K-quant's source), as
    ``<name>.gguf`` under ``dest`` (default ``<cache>/lifesize``). ``source`` is the engine's llama.cpp source
    (its ``models/`` holds the vocabularies); ``quantize`` is ``llama-quantize``, needed for the K-quant only.
    ``progress`` gets a line per step ("writing NAME", "wrote NAME: ...", "up to date NAME")."""
    models = resolve_life_size(tuple(only) if only is not None else None)
    root = Path(dest) if dest is not None else default_root()
    for m in models:  # every input named before anything is written
        _need(vocab_file(source, m.vocab), "the vocabulary file")
        _template(m, source)
    check_dest(root)
    keys: dict[str, str] = {}
    say = progress or (lambda line: None)
    return [_ensure(m, root, Path(source), keys, quantize, say) for m in models]
