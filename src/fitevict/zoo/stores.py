"""Model stores laid out as their own tools lay them out, from files at hand (the demo zoo's): Ollama's manifests
and blobs, a Hugging Face hub cache (refs, snapshots linking into blobs) and LM Studio's folders. For tests and
demos of the store readers (fitevict.sources); the files are copied in, as a download would leave them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np

OLLAMA_MEDIA = "application/vnd.ollama.image."


def tiny_gguf(path: Path, *, tensors: int = 1, split_max_tensors: int = 0, adapter: bool = False) -> list[Path]:
    """A minimal valid GGUF (``tensors`` 4x8 f32 zeros; a split when ``split_max_tensors``; a LoRA adapter's header
    with ``adapter``) for tests of layouts, not of inference; returns the files written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    before = set(path.parent.iterdir())
    w = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    if adapter:
        w.add_type(gguf.GGUFType.ADAPTER)
        w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    for i in range(tensors):
        w.add_tensor(f"blk.{i}.w", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sorted(set(path.parent.iterdir()) - before)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _ollama_blob(root: Path, data: bytes, media: str) -> dict[str, Any]:
    digest = _digest(data)
    blob = root / "blobs" / digest.replace(":", "-")
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not blob.exists():
        blob.write_bytes(data)
    return {"mediaType": OLLAMA_MEDIA + media, "digest": digest, "size": len(data)}


def write_ollama_model(root: Path, name: str, model: Path, *, tag: str = "latest", namespace: str = "library",
                       registry: str = "registry.ollama.ai", projector: Path | None = None,
                       adapters: tuple[Path, ...] = (), params: Mapping[str, Any] | None = None,
                       system: str | None = None, template: str | None = None) -> Path:
    """One model in an Ollama store at ``root``: its blobs (shared by digest) and its manifest; returns the
    manifest's path."""
    layers = [_ollama_blob(root, model.read_bytes(), "model")]
    if projector is not None:
        layers.append(_ollama_blob(root, projector.read_bytes(), "projector"))
    layers += [_ollama_blob(root, a.read_bytes(), "adapter") for a in adapters]
    for media, text in (("template", template), ("system", system)):
        if text is not None:
            layers.append(_ollama_blob(root, text.encode(), media))
    if params is not None:
        layers.append(_ollama_blob(root, json.dumps(dict(params)).encode(), "params"))
    config = _ollama_blob(root, json.dumps({"model_format": "gguf"}).encode(), "config")
    config["mediaType"] = "application/vnd.docker.container.image.v1+json"
    doc = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
           "config": config, "layers": layers}
    manifest = root / "manifests" / registry / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps(doc))
    return manifest


def write_hf_repo(hub: Path, repo_id: str, files: Mapping[str, Path], *, revision: str = "0" * 40,
                  current: bool = True) -> Path:
    """A repository ``org/name`` in a hub cache at ``hub``: the files as blobs named by their sha256, a snapshot
    ``revision`` of links into them, and ``refs/main`` naming it (when ``current``); returns the snapshot."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / revision
    for rel, src in files.items():
        data = src.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(data)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if current:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return snap


def write_lmstudio_repo(root: Path, repo_id: str, files: Mapping[str, Path]) -> Path:
    """``root/<publisher>/<repo>/`` holding copies of ``files`` (name -> source)."""
    folder = root / repo_id
    folder.mkdir(parents=True, exist_ok=True)
    for name, src in files.items():
        shutil.copyfile(src, folder / name)
    return folder


__all__ = ["tiny_gguf", "write_hf_repo", "write_lmstudio_repo", "write_ollama_model"]
