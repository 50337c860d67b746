"""GGUF structures kept in the store, so that a file is parsed once per change, not once per process.

A row is one file on one host: its path, size, mtime_ns and inode (any change parses it again), the digest of the
parser that read it (a new fitevict with other rules parses it again), and the structure as JSON. A front door
reads its host's rows once at start-up, off the event loop (``preload``); after that ``get`` is a dictionary
lookup and ``put`` goes through the store's one writer without waiting, so listing models never waits on the
database. A put that fails (disk full, a locked database) costs only a parse in the next process: it is logged
with its reason, never raised into a request.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import fields
from functools import cache
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from gguf import GGMLQuantizationType
from sqlalchemy.engine import Connection

from fitevict.pricing import ggml_types, gguf, gguf_header, layers
from fitevict.pricing.gguf import EXPERT_RE, FileKey, GgufStructure, TensorInfo
from fitevict.store import schema as t
from fitevict.store.queries import upsert

log = logging.getLogger("fitevict.store.structures")

_TUPLES = {f.name for f in fields(GgufStructure)
           if f.name not in ("tensors", "metadata") and "tuple" in str(f.type)}


@cache
def parser_digest() -> str:
    """A digest of the code that turns a header into a structure: a stored row from other code is not used."""
    h = hashlib.sha256()
    for mod in (gguf, gguf_header, layers, ggml_types):
        h.update(Path(mod.__file__ or "").read_bytes())
    return h.hexdigest()[:16]


def structure_to_json(s: GgufStructure) -> str:
    d: dict[str, Any] = {f.name: getattr(s, f.name) for f in fields(s) if f.name != "tensors"}
    d["tensors"] = [[x.name, int(x.ggml_type), list(x.shape), x.nbytes, x.offset] for x in s.tensors]
    return json.dumps(d, separators=(",", ":"))


def structure_from_json(text: str) -> GgufStructure:
    d = json.loads(text)
    for name in _TUPLES:
        if isinstance(d.get(name), list):
            d[name] = tuple(d[name])
    d["metadata"] = tuple(tuple(kv) for kv in d.get("metadata", ()))
    d["tensors"] = tuple(_tensor(*row) for row in d["tensors"])
    return GgufStructure(**d)


def _tensor(name: str, ggml_type: int, shape: list[int], nbytes: int, offset: int) -> TensorInfo:
    m = gguf.BLOCK_RE.match(name)
    return TensorInfo(name=name, ggml_type=GGMLQuantizationType(ggml_type), shape=tuple(shape), nbytes=nbytes,
                      offset=offset, layer=int(m.group(1)) if m else None, expert=bool(EXPERT_RE.search(name)))


class StoredStructures:
    """The store's structures for this host, as a ``pricing.gguf.StructureShelf``."""

    def __init__(self, store: Any, host: str | None = None) -> None:
        self._store = store
        self.host = host or socket.gethostname()
        self._rows: dict[str, tuple[FileKey, str]] = {}  # path -> (its key when parsed, the structure's JSON)
        self._lock = threading.Lock()
        self.pending: set[Future] = set()

    def preload(self) -> int:
        """Read this host's rows written by this parser (blocking: call it off the event loop). Returns how many."""
        c = t.gguf_structures.c
        q = sa.select(c.path, c.size, c.mtime_ns, c.inode, c.structure_json).where(
            c.host == self.host, c.parser == parser_digest())

        def fn(conn: Connection) -> list[Any]:
            return list(conn.execute(q).all())

        rows = self._store.read(fn)
        with self._lock:
            for path, size, mtime_ns, inode, text in rows:
                self._rows[path] = ((path, int(size), int(mtime_ns), int(inode)), text)
        return len(rows)

    def get(self, key: FileKey) -> GgufStructure | None:
        with self._lock:
            row = self._rows.get(key[0])
        if row is None or row[0] != key:
            return None
        try:
            return structure_from_json(row[1])
        except (ValueError, TypeError, KeyError) as e:  # a damaged row: parse the file instead
            log.warning("stored structure of %s is unreadable (%s: %s); parsing the file", key[0], type(e).__name__, e)
            return None

    def put(self, key: FileKey, structure: GgufStructure) -> None:
        text = structure_to_json(structure)
        with self._lock:
            self._rows[key[0]] = (key, text)
        path, size, mtime_ns, inode = key
        values = {"host": self.host, "path": path, "size": size, "mtime_ns": mtime_ns, "inode": inode,
                  "parser": parser_digest(), "structure_json": text, "parsed_at": time.time()}
        try:
            fut = self._store.submit(upsert(t.gguf_structures, ("host", "path"), values))
        except RuntimeError as e:  # the store is closed: this process keeps its own copy
            log.info("structure of %s not stored: %s", path, e)
            return
        self.pending.add(fut)
        fut.add_done_callback(self._written)

    def _written(self, fut: Future) -> None:
        self.pending.discard(fut)
        if (err := fut.exception()) is not None:
            log.warning("a GGUF structure could not be stored (%s: %s); the next process parses the file again",
                        type(err).__name__, err)
