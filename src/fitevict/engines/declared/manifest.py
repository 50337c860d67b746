"""A declared engine's manifest, ``fitevict-engine.toml`` in its model folder::

    model = "tiny-chat"                       # the name the server answers to ({model} on its command line)
    command = ["{python}", "{folder}/server.py", "--host", "{host}", "--port", "{port}", "--ctx", "{ctx}"]
    health = "/health"                        # optional: the path that answers 200 once it serves
    context = 4096                            # optional: its own context (tokens): what a configured ctx of 0 is

    [memory]
    bytes = "512MiB"                          # what its process holds at rest, as declared
    per_context_token = "16KiB"               # optional: what each token of context adds

    [env]                                     # optional: variables set for its process
    OMP_NUM_THREADS = "4"

Placeholders in ``command``: ``{host}`` (127.0.0.1), ``{port}`` (the seat's port), ``{folder}`` (the manifest's
folder, absolute), ``{ctx}`` (the seat's context), ``{model}`` and ``{python}`` (this Python). The process starts in
the door's working directory: name the folder's files through ``{folder}``.
"""

from __future__ import annotations

import hashlib
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from fitevict.units import parse_size

MANIFEST = "fitevict-engine.toml"
HOST = "127.0.0.1"
PLACES = ("host", "port", "folder", "ctx", "model", "python")


class ManifestError(ValueError):
    """A manifest that cannot be read or says something fitevict cannot use: the message names the file and the
    field, and what to write instead."""


@dataclass(frozen=True, slots=True)
class Manifest:
    folder: Path
    model: str
    command: tuple[str, ...]
    memory_bytes: int  # declared: the process at rest
    per_context_token: int  # declared: bytes each token of context adds
    health: str = "/health"
    context: int = 0  # its own context (tokens): what a configured ctx of 0 means; 0: none declared
    env: tuple[tuple[str, str], ...] = ()
    digest: str = ""  # of the manifest's bytes: a changed manifest is another signature

    def declared_bytes(self, n_ctx: int) -> tuple[int, int]:
        """(the process at rest, its context of ``n_ctx`` tokens), as declared."""
        return self.memory_bytes, self.per_context_token * max(0, n_ctx)

    def argv(self, port: int, n_ctx: int) -> tuple[str, ...]:
        """The command line with its placeholders filled for a seat on ``port`` serving ``n_ctx`` tokens."""
        values = {"host": HOST, "port": str(port), "folder": str(self.folder), "ctx": str(n_ctx),
                  "model": self.model, "python": sys.executable}
        return tuple(a.format_map(values) for a in self.command)


def _size(doc: dict, key: str, where: str, *, default: int | None = None) -> int:
    if key not in doc:
        if default is None:
            raise ManifestError(f"{where}: [memory] {key} is missing; declare the bytes the process holds, e.g. "
                                f'{key} = "512MiB"')
        return default
    try:
        return parse_size(doc[key], name=f"[memory] {key}")
    except ValueError as e:
        raise ManifestError(f"{where}: {e}") from None


def _command(doc: dict, where: str) -> tuple[str, ...]:
    cmd = doc.get("command")
    if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) for a in cmd):
        raise ManifestError(f"{where}: command must be a list of strings, got {cmd!r}; e.g. command = "
                            '["{python}", "{folder}/server.py", "--port", "{port}"]')
    if not any("{port}" in a for a in cmd):
        raise ManifestError(f"{where}: command {cmd!r} names no {{port}}; the door gives each seat its own port")
    for a in cmd:
        try:
            a.format_map({k: "" for k in PLACES})
        except (KeyError, ValueError, IndexError) as e:
            raise ManifestError(f"{where}: command argument {a!r} has a placeholder fitevict does not fill ({e}); "
                                f"use {', '.join('{' + p + '}' for p in PLACES)}, or double a literal brace") from None
    return tuple(cmd)


def read_manifest(folder: Path) -> Manifest:
    """The manifest of the declared model in ``folder``; raises ``ManifestError`` (a ValueError) naming what is wrong,
    or OSError when it cannot be read."""
    path = Path(folder) / MANIFEST
    raw = path.read_bytes()
    where = str(path)
    try:
        doc = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(f"{where}: not TOML ({e}); fix the file") from None
    memory = doc.get("memory")
    if not isinstance(memory, dict):
        raise ManifestError(f'{where}: no [memory] table; declare at least [memory] bytes = "512MiB"')
    model, health, context = doc.get("model", Path(folder).name), doc.get("health", "/health"), doc.get("context", 0)
    if not isinstance(model, str) or not model:
        raise ManifestError(f"{where}: model must be a name, got {model!r}")
    if not isinstance(health, str) or not health.startswith("/"):
        raise ManifestError(f"{where}: health must be a path starting with '/', got {health!r}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise ManifestError(f"{where}: context must be a number of tokens >= 0, got {context!r}")
    env = doc.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ManifestError(f"{where}: [env] must map names to strings, got {env!r}")
    return Manifest(folder=Path(folder).resolve(), model=model, command=_command(doc, where),
                    memory_bytes=_size(memory, "bytes", where), health=health, context=context,
                    per_context_token=_size(memory, "per_context_token", where, default=0),
                    env=tuple(sorted(env.items())), digest=hashlib.sha256(raw).hexdigest()[:16])
