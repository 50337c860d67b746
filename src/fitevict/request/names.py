"""The naming rule: how a name a client sends finds a model, and what is said when it finds none or several.

A model's names are its key and its aliases, matched case-insensitively and never taken apart to guess:

- ``/`` separates a namespace from a name: ``Qwen/Qwen3-0.6B-GGUF``, ``alice/tiny:latest``,
  ``hf.co/bob/tiny:Q8_0``;
- ``:`` separates a model from its variant: an Ollama tag (``qwen2.5:7b``), a quantization
  (``Qwen/Qwen3-0.6B-GGUF:Q4_K_M``) or a LoRA adapter (``llama-gqa:sql``).

A name that is no model's key or alias is served by nothing. When it is a shortening of other models' names (the
variant left out, ``org/name`` for ``org/name:Q4_K_M`` and ``org/name:Q8_0``; or the namespace left out,
``Qwen3-0.6B-GGUF`` for ``alice/Qwen3-0.6B-GGUF`` and ``bob/Qwen3-0.6B-GGUF``), the answer lists them: several
make the name ambiguous (``AmbiguousModel``), one is offered as the name to use.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class UnknownModel(LookupError):
    """No model has this key or alias."""

    def __init__(self, name: str, close_matches: Sequence[str] = ()) -> None:
        self.name = name
        self.close_matches = tuple(close_matches)
        hint = f"; did you mean {', '.join(self.close_matches)}?" if self.close_matches else ""
        super().__init__(f"no model named {name!r}{hint} (GET /v1/models or `fitevict ps` lists the models)")

    def __str__(self) -> str:
        return str(self.args[0])


class AmbiguousModel(UnknownModel):
    """A name that is no model's own but a shortening of several models' names: each is a candidate."""

    def __init__(self, name: str, candidates: Sequence[str]) -> None:
        LookupError.__init__(self, f"model name {name!r} is ambiguous: it could be {', '.join(candidates)}; "
                                   "name one of them")
        self.name = name
        self.candidates = self.close_matches = tuple(candidates)


def shortenings(name: str) -> set[str]:
    """The shorter names ``name`` answers to as a candidate: without its variant (after the first ``:``), and
    without leading namespaces (before each ``/``), lower-cased; not ``name`` itself."""
    low = name.lower()
    out: set[str] = set()
    for whole in {low, low.split(":", 1)[0]}:
        out.add(whole)
        parts = whole.split("/")
        out.update("/".join(parts[i:]) for i in range(1, len(parts)))
    out.discard(low)
    return out


def candidates(name: str, models: Iterable[tuple[str, Sequence[str]]]) -> list[str]:
    """The keys of the models (``(key, names)`` pairs) that ``name`` is a shortening of one of the names of."""
    low = name.lower()
    return [key for key, names in models if any(low in shortenings(n) for n in names)]
