"""llama-server's saved slots (``POST /slots/{id}?action=save``): the prompt a file holds, read from its header.

The pinned build writes ``llama_state_seq_save_file``: ``u32 magic 'ggsq'``, ``u32 version (3)``, ``u32 n``, then
``n`` 32-bit words of the slot's packed tokens, then the KV state. The server packs its tokens as
``LLAMA_TOKEN_NULL (-1)``, ``u32 state version (1)``, ``u32 count`` and the tokens, then its media chunks; a file
from an older server holds the plain tokens. Only the tokens are read here: which prompt a file would restore.
"""

from __future__ import annotations

import struct
from pathlib import Path

MAGIC = 0x67677371  # 'ggsq'
FILE_VERSION = 3
TOKENS_STATE_VERSION = 1
TOKEN_NULL = -1


class SlotFileError(ValueError):
    """A file that is not a saved slot of the pinned llama-server, named with what was wrong."""


def read_tokens(path: Path) -> list[int]:
    """The prompt tokens a saved slot file holds (without its KV state)."""
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 12:
            raise SlotFileError(f"{path}: {len(head)} bytes, shorter than the 12-byte header")
        magic, version, n = struct.unpack("<III", head)
        if magic != MAGIC or version != FILE_VERSION:
            raise SlotFileError(f"{path}: magic {magic:#x} version {version}, not a llama-server slot file "
                                f"(magic {MAGIC:#x} version {FILE_VERSION})")
        raw = f.read(4 * n)
    if len(raw) < 4 * n:
        raise SlotFileError(f"{path}: the header says {n} token words, the file holds {len(raw) // 4}")
    words = struct.unpack(f"<{n}i", raw)
    if not words or words[0] != TOKEN_NULL:
        return list(words)  # an older server's plain token list
    if n < 3 or words[1] != TOKENS_STATE_VERSION:
        raise SlotFileError(f"{path}: packed tokens of state version {words[1] if n > 1 else '?'}, "
                            f"this reader knows {TOKENS_STATE_VERSION}")
    count = words[2]
    if count > n - 3:
        raise SlotFileError(f"{path}: {count} tokens announced, {n - 3} words follow")
    return list(words[3:3 + count])


__all__ = ["SlotFileError", "read_tokens"]
