"""Writing the zoo: GGUF metadata, files written atomically, a manifest of sha256 per recipe fingerprint."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict
from importlib.metadata import version as _dist_version
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from fitevict.zoo import hybrid as zoo_hybrid
from fitevict.zoo.recipes import (BOS_ID, EOS_ID, IM_END_ID, UNK_ID, CHAT_TEMPLATE, GENERATOR_VERSION, MANIFEST_NAME,
                                  ZOO_VERSION, ZooError, ZooModel, FILE_TYPE, LATER_FIELDS, LAYOUTS, Recipe,
                                  recipe, recipes)
from fitevict.zoo.tensors import tensor_data, tensor_shapes, spm_vocab


# ---------------------------------------------------------------------------------------------- writing


def add_model_metadata(w: gguf.GGUFWriter, r: Recipe) -> None:
    """Every key of a recipe's model but its tokenizer: name, file type, sizes, attention, experts, windows."""
    w.add_name(f"fitevict zoo {r.name}")
    w.add_file_type(FILE_TYPE[r.weight_type])
    w.add_context_length(r.n_ctx_train)
    w.add_embedding_length(r.n_embd)
    w.add_block_count(r.n_layer)
    w.add_layer_norm_rms_eps(r.rms_eps)
    if r.ssm:
        d_conv, d_inner, d_state, dt_rank = r.ssm[:4]
        w.add_ssm_conv_kernel(d_conv)
        w.add_ssm_inner_size(d_inner)
        w.add_ssm_state_size(d_state)
        w.add_ssm_time_step_rank(dt_rank)
    if r.arch in ("mamba", "mamba2"):
        w.add_head_count(0)
        w.add_head_count_kv(0)
        w.add_feed_forward_length(0)
    else:
        w.add_feed_forward_length(list(r.n_ff) if isinstance(r.n_ff, tuple) else r.n_ff)
        w.add_head_count(r.n_head)
        w.add_head_count_kv(list(r.n_head_kv) if isinstance(r.n_head_kv, tuple) else r.n_head_kv)
        w.add_rope_dimension_count(r.mla[2] if r.mla else (r.head_dim or r.n_embd // r.n_head))
        w.add_rope_freq_base(r.rope_base)
    if r.head_dim:
        w.add_key_length(r.head_dim)
        w.add_value_length(r.head_dim)
    if r.mla:  # the cache holds the compressed latent plus the rope part, one "head"
        kv_lora, q_lora, rope, nope, v_head = r.mla
        w.add_key_length(kv_lora + rope)
        w.add_value_length(kv_lora)
        w.add_key_length_mla(nope + rope)
        w.add_value_length_mla(v_head)
        w.add_kv_lora_rank(kv_lora)
        w.add_q_lora_rank(q_lora)
    if r.arch in LAYOUTS and LAYOUTS[r.arch].layer_norm:
        w.add_layer_norm_eps(1e-5)
    if r.n_expert:
        w.add_expert_count(r.n_expert)
        w.add_expert_used_count(r.n_expert_used)
    if r.n_ff_exp:
        w.add_expert_feed_forward_length(r.n_ff_exp)
    if r.n_ff_shexp:
        w.add_expert_shared_feed_forward_length(r.n_ff_shexp)
    if r.n_expert_shared:
        w.add_expert_shared_count(r.n_expert_shared)
    if r.n_dense_lead:
        w.add_leading_dense_block_count(r.n_dense_lead)
    if r.n_nextn:
        w.add_nextn_predict_layers(r.n_nextn)
    if r.sliding_window:
        w.add_sliding_window(r.sliding_window)
    for key, value in r.extra:
        getattr(w, f"add_{key}")(value)
    zoo_hybrid.metadata(w, r)


def _add_metadata(w: gguf.GGUFWriter, r: Recipe) -> None:
    add_model_metadata(w, r)
    tokens, scores, types = spm_vocab(r.n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_eot_token_id(IM_END_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def write_gguf(r: Recipe, path: Path) -> None:
    """Write one recipe to ``path`` (the caller renames it into place)."""
    w = gguf.GGUFWriter(path, r.arch)
    try:
        _add_metadata(w, r)
        for name, shape, kind in tensor_shapes(r):
            data, qt = tensor_data(r, name, shape, kind)
            w.add_tensor(name, data, raw_dtype=qt if qt not in (QT.F32, QT.F16) else None)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


def fingerprint(r: Recipe) -> str:
    """Identity of a recipe's output: recipe fields, generator version, gguf and numpy versions."""
    fields = {k: (v.name if isinstance(v, QT) else v) for k, v in asdict(r).items()
              if k not in LATER_FIELDS or v != LATER_FIELDS[k]}
    blob = json.dumps(
        {"recipe": fields, "generator": GENERATOR_VERSION, "gguf": _dist_version("gguf"), "numpy": np.__version__},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_manifest(dest: Path) -> dict[str, dict[str, object]]:
    p = dest / MANIFEST_NAME
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}  # no manifest, or an unreadable one: every model is checked by rewriting it
    return data if isinstance(data, dict) else {}


def _write_manifest(dest: Path, manifest: dict[str, dict[str, object]]) -> None:
    tmp = dest / f".{MANIFEST_NAME}.tmp-{os.getpid()}"
    try:
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, dest / MANIFEST_NAME)
    finally:
        tmp.unlink(missing_ok=True)


def _is_current(path: Path, entry: dict[str, object] | None, fingerprint: str) -> bool:
    if entry is None or entry.get("fingerprint") != fingerprint:
        return False
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    return size == entry.get("bytes") and sha256_file(path) == entry.get("sha256")


def _quant_label(r: Recipe) -> str:
    return r.weight_type.name


def check_dest(dest: Path) -> None:
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ZooError(f"cannot create the zoo directory {dest}: {err.strerror}; pick a writable DIR") from err
    if not dest.is_dir():
        raise ZooError(f"{dest} exists and is not a directory; pick another DIR")
    if not os.access(dest, os.W_OK | os.X_OK):
        raise ZooError(
            f"the zoo directory {dest} is not writable by this user; pick a writable DIR or fix its permissions"
        )


def resolve_names(only: Iterable[str] | None, version: int = ZOO_VERSION) -> list[str]:
    """The zoo names to write, in zoo order; an unknown name raises ZooError listing the allowed ones."""
    names = [r.name for r in recipes(version)]
    if only is None:
        return names
    wanted = list(dict.fromkeys(only))
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise ZooError(f"unknown zoo model {', '.join(unknown)} in zoo v{version}; allowed: {', '.join(names)}")
    return [n for n in names if n in wanted]


def write_zoo(
    dest: Path,
    *,
    only: Iterable[str] | None = None,
    progress: Callable[[str], None] | None = None,
    version: int = ZOO_VERSION,
) -> list[ZooModel]:
    """Write the zoo's models (all, or those in ``only``) as ``<name>.gguf`` under ``dest``. ``version`` 2 (the
    default) has realistic shapes; 1 writes the first zoo's files byte for byte (the known answers' models).

    A model whose file already matches the manifest (same recipe fingerprint, size and sha256) is not rewritten.
    ``progress`` receives one line per model ("writing NAME" / "up to date NAME").
    """
    dest = Path(dest)
    names = resolve_names(only, version)
    check_dest(dest)
    manifest = _read_manifest(dest)
    written: list[ZooModel] = []
    for name in names:
        r = recipe(name, version)
        path = dest / f"{name}.gguf"
        fp = fingerprint(r)
        entry = manifest.get(name)
        if _is_current(path, entry if isinstance(entry, dict) else None, fp):
            if progress:
                progress(f"up to date {name}")
        else:
            if progress:
                progress(f"writing {name}")
            tmp = dest / f".{name}.gguf.tmp-{os.getpid()}"
            try:
                write_gguf(r, tmp)
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            manifest[name] = {
                "fingerprint": fp,
                "generator": GENERATOR_VERSION,
                "sha256": sha256_file(path),
                "bytes": path.stat().st_size,
            }
            _write_manifest(dest, manifest)
        written.append(
            ZooModel(
                name=name,
                path=path,
                arch=r.arch,
                quant=_quant_label(r),
                description=r.description,
                file_bytes=path.stat().st_size,
            )
        )
    return written


def rewrite_arch(src: Path, dst: Path, arch: str) -> Path:
    """A copy of ``src`` whose architecture (and key prefix) is ``arch``: same tensors, same bytes.

    Useful to check how fitevict prices an architecture it has no rules for but the engine has.
    """
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
