"""Ollama's model store, read in place: ``manifests/<registry>/<namespace>/<name>/<tag>`` (a Docker distribution
manifest, v2) lists a model's layers, each a blob ``blobs/sha256-<hex>``.

Names are Ollama's: ``name:tag``, with ``registry.ollama.ai/library/`` left out; other namespaces keep
``namespace/name:tag`` and other registries their host. ``name`` is an alias of ``name:latest``. The layers used:
``model`` (the GGUF), ``projector`` (its mmproj), ``adapter`` (LoRA adapters applied on it), ``params`` (JSON
request defaults), ``system`` (the default system message) and ``template`` (a Go template, kept for the record:
llama-server applies the GGUF's own chat template). Nothing is written to the store.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fitevict.sources.record import StoreModel, StoreScan

STORE = "ollama"
DEFAULT_REGISTRY = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
MEDIA_PREFIX = "application/vnd.ollama.image."
_TEXT_LAYERS = ("system", "template")


def default_root(env: Mapping[str, str]) -> Path:
    """``$OLLAMA_MODELS``, else ``~/.ollama/models``."""
    if env.get("OLLAMA_MODELS"):
        return Path(env["OLLAMA_MODELS"]).expanduser()
    return (Path(env["HOME"]) if env.get("HOME") else Path.home()) / ".ollama" / "models"


def served_name(registry: str, namespace: str, name: str, tag: str) -> str:
    """``name:tag`` on Ollama's registry and namespace; ``namespace/name:tag`` in another namespace;
    ``registry/namespace/name:tag`` elsewhere."""
    if registry != DEFAULT_REGISTRY:
        return f"{registry}/{namespace}/{name}:{tag}"
    return f"{name}:{tag}" if namespace == DEFAULT_NAMESPACE else f"{namespace}/{name}:{tag}"


def blob_path(root: Path, digest: str) -> Path:
    """``sha256:<hex>`` -> ``blobs/sha256-<hex>``."""
    return root / "blobs" / digest.replace(":", "-")


def _is_gguf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"GGUF"


def _layers(doc: Any, root: Path, where: str, notes: list[str]) -> dict[str, list[Path]] | None:
    """The manifest's layers by kind (``model``, ``projector``, ...); None when a blob is missing or the manifest
    is not one."""
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list):
        notes.append(f"{where}: not an image manifest (no layers); skipped")
        return None
    out: dict[str, list[Path]] = {}
    for layer in layers:
        media, digest = layer.get("mediaType", ""), layer.get("digest", "")
        if not (isinstance(media, str) and media.startswith(MEDIA_PREFIX) and isinstance(digest, str)):
            continue
        blob = blob_path(root, digest)
        if not blob.is_file():
            notes.append(f"{where}: its {media[len(MEDIA_PREFIX):]} layer {blob} is missing; skipped")
            return None
        out.setdefault(media[len(MEDIA_PREFIX):], []).append(blob)
    return out


def _params(blobs: list[Path], where: str, notes: list[str]) -> Mapping[str, Any]:
    got: dict[str, Any] = {}
    for blob in blobs:
        try:
            doc = json.loads(blob.read_text())
        except (OSError, ValueError) as e:
            notes.append(f"{where}: params layer {blob} is not JSON ({e}); not used")
            continue
        if isinstance(doc, dict):
            got.update(doc)
    return MappingProxyType(got)


def read_manifest(root: Path, manifest: Path, name: str, notes: list[str]) -> StoreModel | None:
    where = f"ollama model {name!r} ({manifest})"
    try:
        doc = json.loads(manifest.read_text())
    except (OSError, ValueError) as e:
        notes.append(f"{where}: the manifest cannot be read ({e}); skipped")
        return None
    layers = _layers(doc, root, where, notes)
    if layers is None:
        return None
    models = layers.get("model", [])
    if not models:
        notes.append(f"{where}: no model layer; skipped")
        return None
    if len(models) > 1 or not _is_gguf(models[0]):
        notes.append(f"{where}: the model is not one GGUF file; skipped (llama-server serves GGUF)")
        return None
    text = {k: "\n".join(p.read_text(errors="replace") for p in layers[k]) for k in _TEXT_LAYERS if k in layers}
    projectors = layers.get("projector", [])
    if len(projectors) > 1:
        notes.append(f"{where}: {len(projectors)} projector layers; the first, {projectors[0].name}, is used")
    tagless, tag = name.rsplit(":", 1)
    return StoreModel(
        STORE, name, "gguf", models[0], (models[0],), models[0].parent, (),
        mmproj=projectors[0] if projectors else None, adapters=tuple(layers.get("adapter", [])),
        aliases=(tagless,) if tag == "latest" else (), params=_params(layers.get("params", []), where, notes),
        system=text.get("system"), template=text.get("template"))


def read(root: Path) -> StoreScan:
    """Every manifest under ``root/manifests`` (four levels: registry, namespace, name, tag)."""
    notes: list[str] = []
    models: list[StoreModel] = []
    top = root / "manifests"
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        parts = Path(dirpath).relative_to(top).parts
        for tag in sorted(f for f in filenames if not f.startswith(".")):
            if len(parts) != 3:
                notes.append(f"{Path(dirpath) / tag}: not at manifests/<registry>/<namespace>/<name>/<tag>; skipped")
                continue
            m = read_manifest(root, Path(dirpath) / tag, served_name(*parts, tag), notes)
            if m is not None:
                models.append(m)
    templated = [m.name for m in models if m.template]
    if templated:
        notes.append(f"{root}: {len(templated)} ollama model(s) carry a template layer ({', '.join(templated[:3])}"
                     f"{', ...' if len(templated) > 3 else ''}), a Go template llama-server cannot use; each is served "
                     "with its GGUF's own chat template")
    return StoreScan(STORE, root, tuple(models), tuple(notes))
