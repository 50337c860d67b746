"""The config's ``[aliases]``: names clients send of their own (``gpt-5``, ``claude-*``) mapped to catalog models.

Exact names match case-insensitively; a pattern's ``*`` matches any run of characters (and nothing else in it is
special). An exact name wins over every pattern, and a longer pattern over a shorter one (``claude-opus-*`` over
``claude-*``); of two patterns of one length, the first in the file. Pure.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Aliased:
    """A name that matched the table: ``alias`` is the table's key that matched it (the name, or a pattern),
    ``target`` the model name it maps to."""

    name: str
    alias: str
    target: str


class Aliases:
    def __init__(self, table: Mapping[str, str]) -> None:
        self.table = dict(table)
        self.exact = {k.lower(): (k, v) for k, v in table.items() if "*" not in k}
        ordered = sorted((k for k in table if "*" in k), key=lambda k: -len(k))  # stable: file order within a length
        self.patterns = tuple((k, re.compile(".*".join(map(re.escape, k.lower().split("*"))), re.S), table[k])
                              for k in ordered)

    def __bool__(self) -> bool:
        return bool(self.table)

    def match(self, name: str) -> Aliased | None:
        """What ``name`` maps to, or None when the table does not name it."""
        low = name.lower()
        hit = self.exact.get(low)
        if hit is not None:
            return Aliased(name, hit[0], hit[1])
        for key, rx, target in self.patterns:
            if rx.fullmatch(low):
                return Aliased(name, key, target)
        return None

    def close(self, name: str, n: int = 3) -> list[str]:
        """Exact names close to ``name`` (for an unknown model's hint)."""
        spelled = {k.lower(): k for k, _ in self.exact.values()}
        return [spelled[c] for c in difflib.get_close_matches(name.lower(), list(spelled), n=n, cutoff=0.5)]

    def of(self, names: tuple[str, ...]) -> tuple[list[str], list[str]]:
        """The exact names and the patterns that map to a model known by ``names`` (its key and aliases)."""
        low = {n.lower() for n in names}
        exact = [k for k, v in self.table.items() if "*" not in k and v.lower() in low]
        patterns = [k for k, v in self.table.items() if "*" in k and v.lower() in low]
        return exact, patterns
