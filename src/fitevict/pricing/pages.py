"""An engine binary's own file pages, counted once across the seats that run it. Pure.

Every seat of one engine binary maps the same file: the binary's text and data (and, in a build with shared
libraries, its own ``libggml*``/``libllama*`` files). The kernel keeps one copy of those pages; PSS splits them
among the processes that map them, so N seats of one binary read them once between them, not N times. A price
that counted them whole in every seat would over-count by (N - 1) copies.

So a seat's price leaves them out, and they are carried by one seat of the binary: the first placed (the oldest
seat that is not stopping). The others carry nothing of them. When the carrier stops, the next oldest seat of
the same binary carries them (``carriers``). A load of a binary no seat runs carries them itself.

``SharedPages`` names the pages (``group``: the binary's identity, the same for every seat of it) and their size:
measured on this machine (the Rss of the binary's own file mappings in a seat at its filled peak, calibrated with
the engine's overhead) or, until then, a labelled rule (the files' sizes on disk: no mapping can hold more).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SharedPages:
    """The file pages every seat of one engine binary shares: ``group`` names the binary, ``bytes`` their size,
    ``source`` what that figure is (``measured: ...`` or ``rule: ...``), ``files`` the names of the files they are
    pages of (the binary and its own libraries)."""

    group: str
    bytes: int
    source: str
    files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.bytes < 0:
            raise ValueError(f"shared pages of {self.group}: {self.bytes} B is negative; a size is 0 or more bytes")

    def to_json(self) -> dict:
        return {"group": self.group, "bytes": self.bytes, "source": self.source, "files": list(self.files)}

    @staticmethod
    def from_json(d: Mapping | None) -> "SharedPages | None":
        if not d:
            return None
        return SharedPages(str(d["group"]), int(d["bytes"]), str(d.get("source", "")),
                           tuple(str(f) for f in d.get("files", ())))

    def maps(self, path: str) -> bool:
        """Whether a mapping of ``path`` is of these pages (one of ``files`` by name)."""
        return path.rsplit("/", 1)[-1] in self.files


@dataclass(frozen=True, slots=True)
class Holder:
    """One seat as the attribution sees it: its key, its binary's pages (None: it shares none) and when it was
    placed (the order that decides who carries)."""

    key: str
    pages: SharedPages | None
    since: float


def carriers(seats: Iterable[Holder]) -> dict[str, int]:
    """The bytes of shared pages each seat carries: per group, the first placed seat (ties: the key) carries its
    group's pages whole, every other seat of the group 0. Pass the seats that hold memory now (not those
    stopping): a carrier that stops is left out, and the next oldest of its group carries them."""
    out: dict[str, int] = {}
    first: dict[str, Holder] = {}
    for s in seats:
        out[s.key] = 0
        if s.pages is None or not s.pages.group:
            continue
        top = first.get(s.pages.group)
        if top is None or (s.since, s.key) < (top.since, top.key):
            first[s.pages.group] = s
    for s in first.values():
        assert s.pages is not None
        out[s.key] = s.pages.bytes
    return out

