"""The GGUF files of one folder: models (single files and complete splits) and projectors, and which projector
goes with which model (the catalog's scan; reads the folder's listing only); and which of a model's files a
request may pick (``gguf_file``)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol
from pathlib import Path, PurePosixPath, PureWindowsPath

HF_CACHE_RE = re.compile(r"^models--(?P<name>.+)$")  # a repository folder of a Hugging Face hub cache
SPLIT_RE = re.compile(r"^(?P<base>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$", re.IGNORECASE)
#: Projector precisions, most preferred first, when a folder holds several mmproj files.
_MMPROJ_PREFERENCE: tuple[str, ...] = ("f16", "bf16", "q8_0", "f32")


class GgufFileError(ValueError):
    """A requested ``gguf_file`` that is not one of the model's own files."""


def _hidden(name: str) -> bool:
    return name.startswith(".")


def is_hf_dir(names: Sequence[str]) -> bool:
    """A transformers folder (config.json beside *.safetensors) or a diffusers pipeline (model_index.json)."""
    return ("config.json" in names and any(n.endswith(".safetensors") for n in names)) or "model_index.json" in names


def hf_files(folder: Path, names: Sequence[str]) -> tuple[Path, ...]:
    """The weight files of an HF folder: its *.safetensors; a pipeline's are in its components' subfolders."""
    if "model_index.json" in names:
        return tuple(sorted(p for p in folder.glob("*/*.safetensors") if not _hidden(p.name)))
    return tuple(folder / n for n in sorted(names) if n.endswith(".safetensors") and not _hidden(n))


def is_mmproj(name: str) -> bool:
    return "mmproj" in name.lower()


@dataclass(frozen=True, slots=True)
class GgufModel:
    stem: str
    files: tuple[Path, ...]  # one file, or the shards in order


def gguf_models(folder: Path, names: Iterable[str], notes: list[str]) -> tuple[list[GgufModel], list[Path]]:
    """Group a folder's GGUF file names into models (splits merged) and projectors."""
    models: list[GgufModel] = []
    projectors: list[Path] = []
    splits: dict[tuple[str, int], dict[int, Path]] = {}
    for name in sorted(names):
        if _hidden(name) or not name.lower().endswith(".gguf") or not (folder / name).is_file():
            continue
        if is_mmproj(name):
            projectors.append(folder / name)
        elif m := SPLIT_RE.match(name):
            splits.setdefault((m["base"], int(m["n"])), {})[int(m["i"])] = folder / name
        else:
            models.append(GgufModel(name[: -len(".gguf")], (folder / name,)))
    for (base, n), shards in splits.items():
        missing = [i for i in range(1, n + 1) if i not in shards]
        if missing:
            notes.append(
                f"{folder / base}: split GGUF of {n} files lacks part(s) "
                f"{', '.join(f'{i:05d}' for i in missing)}; skipped until complete"
            )
            continue
        models.append(GgufModel(base, tuple(shards[i] for i in range(1, n + 1))))
    models.sort(key=lambda m: m.stem)
    return models, projectors


def pick_projector(projectors: Sequence[Path]) -> Path | None:
    def rank(p: Path) -> tuple[int, str]:
        low = p.name.lower()
        for i, tag in enumerate(_MMPROJ_PREFERENCE):
            if re.search(rf"(^|[^a-z0-9]){re.escape(tag)}([^a-z0-9]|$)", low):
                return (i, p.name)
        return (len(_MMPROJ_PREFERENCE), p.name)

    return min(projectors, key=rank) if projectors else None


def _mmproj_core(p: Path) -> str:
    stem = p.name[: -len(".gguf")]
    return re.sub(r"[-_.]?mmproj[-_.]?", "", stem, flags=re.IGNORECASE).lower()


def _common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


def attach_in_flat_dir(models: list[GgufModel], projectors: list[Path]) -> dict[str, Path]:
    """In a flat models dir, a projector goes to the model(s) whose stem shares its longest name prefix."""
    out: dict[str, Path] = {}
    for proj in projectors:
        core = _mmproj_core(proj)
        scores = {m.stem: _common_prefix(core, m.stem.lower()) for m in models}
        best = max(scores.values(), default=0)
        if best < 4:
            continue
        for stem, score in scores.items():
            if score == best:
                prev = out.get(stem)
                out[stem] = proj if prev is None else pick_projector([prev, proj]) or proj
    return out


# ----------------------------------------------------------------------------- gguf_file


def _containment_root(model_dir: Path) -> Path:
    """Where a model's files may live: its folder, or a whole HF cache repo (snapshots link into blobs/)."""
    if model_dir.parent.name == "snapshots" and HF_CACHE_RE.match(model_dir.parent.parent.name):
        return model_dir.parent.parent
    return model_dir


class ModelFiles(Protocol):
    """What ``resolve_gguf_file`` reads of a catalog entry (``request.catalog.CatalogEntry``, a stage above)."""

    key: str
    kind: str
    engine: str
    model_dir: Path
    gguf_files: Sequence[str]


def resolve_gguf_file(entry: ModelFiles, filename: str) -> Path:
    """The path of ``filename`` (a request's ``gguf_file``) inside ``entry``'s own folder.

    Refuses absolute paths, ``..``, names outside ``entry.gguf_files`` and symlinks that lead out of the
    model's folder, with a ``GgufFileError`` that lists the files one may pick.
    """
    choices = ", ".join(entry.gguf_files) or "(none)"
    said = f"gguf_file {filename!r} for model {entry.key!r}"
    if entry.kind != "gguf":
        raise GgufFileError(f"{said}: this model is {entry.engine} safetensors, not GGUF; drop gguf_file")
    if not isinstance(filename, str) or not filename.strip() or "\x00" in filename:
        raise GgufFileError(f"{said}: give one of the model's files: {choices}")
    if filename.startswith(("/", "\\")) or PureWindowsPath(filename).drive or PurePosixPath(filename).is_absolute():
        raise GgufFileError(f"{said}: absolute paths are refused; give a file name from {entry.model_dir.name}/: {choices}")
    if "\\" in filename:
        raise GgufFileError(f"{said}: use '/' between folder names; choices: {choices}")
    parts = PurePosixPath(filename).parts
    if ".." in parts:
        raise GgufFileError(f"{said}: '..' is refused; the file must be inside the model's folder; choices: {choices}")
    if not filename.lower().endswith(".gguf"):
        raise GgufFileError(f"{said}: not a .gguf file; choices: {choices}")
    if is_mmproj(PurePosixPath(filename).name):
        raise GgufFileError(f"{said}: that is a projector (mmproj), not a model; choices: {choices}")
    candidate = entry.model_dir.joinpath(*parts)
    try:
        real = candidate.resolve(strict=True)
    except (FileNotFoundError, RuntimeError):
        raise GgufFileError(f"{said}: no such file in {entry.model_dir}; choices: {choices}") from None
    root = _containment_root(entry.model_dir).resolve()
    if not real.is_relative_to(root):
        raise GgufFileError(f"{said}: it is a link to {real}, outside the model's folder {root}; refused")
    if PurePosixPath(*parts).as_posix() not in entry.gguf_files:
        split = SPLIT_RE.match(PurePosixPath(filename).name)
        fix = " (name the first part, -00001-of-…)" if split and split["i"] != "00001" else ""
        raise GgufFileError(f"{said}: not one of this model's files{fix}; choices: {choices}")
    return candidate
