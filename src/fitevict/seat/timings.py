"""A seat's engine timings: llama-server's own per-answer ``timings``, summed while the seat serves.

Each answer that carries ``timings`` (``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``) is added to its
seat's totals in memory once the answer has gone out; the totals join the history with the event that ends the seat
(evict, unload, idle-unload, crash), so serving a request never waits for a store write. Tokens per second are the
summed tokens over the summed milliseconds (each answer weighted by its length), as the engine measured them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MEASURED = "measured: the engine's own timings of each answer"
BULK_PROMPT = 256  # prompt tokens from which an answer's prefill counts for the seat's bulk prefill rate


@dataclass(eq=False)
class EngineTimings:
    """Running totals over the answers of one seat (mutable; owned by the event loop)."""

    answers: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    bulk_prompt_n: int = 0  # answers that prefilled at least BULK_PROMPT tokens: a cold prefill's rate
    bulk_prompt_ms: float = 0.0

    def add(self, t: Mapping[str, float]) -> None:
        """One answer's ``timings`` (as ``fastpath.engine_timings`` reads them); an answer without them is not
        counted."""
        if not any(k in t for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")):
            return
        self.answers += 1
        self.prompt_n += int(t.get("prompt_n", 0))
        self.prompt_ms += float(t.get("prompt_ms", 0.0))
        self.predicted_n += int(t.get("predicted_n", 0))
        self.predicted_ms += float(t.get("predicted_ms", 0.0))
        if int(t.get("prompt_n", 0)) >= BULK_PROMPT:
            self.bulk_prompt_n += int(t["prompt_n"])
            self.bulk_prompt_ms += float(t.get("prompt_ms", 0.0))

    def bulk_prefill_rate(self) -> float | None:
        """Tokens per second over the answers that prefilled at least BULK_PROMPT tokens (short prefills, such as
        the rest of a restored prompt, run far slower per token); None when there was none."""
        return round(self.bulk_prompt_n / self.bulk_prompt_ms * 1000, 2) if self.bulk_prompt_ms > 0 else None

    def to_json(self) -> dict | None:
        """The totals with each figure's source; None when no answer carried timings."""
        if not self.answers:
            return None
        prompt_tps, prompt_src = _rate(self.prompt_n, self.prompt_ms, "prompt")
        gen_tps, gen_src = _rate(self.predicted_n, self.predicted_ms, "generation")
        return {
            "answers": self.answers, "prompt_n": self.prompt_n, "prompt_ms": round(self.prompt_ms, 3),
            "prompt_per_second": prompt_tps, "predicted_n": self.predicted_n,
            "predicted_ms": round(self.predicted_ms, 3), "predicted_per_second": gen_tps,
            "sources": {"prompt_n": MEASURED, "prompt_ms": MEASURED, "prompt_per_second": prompt_src,
                        "predicted_n": MEASURED, "predicted_ms": MEASURED, "predicted_per_second": gen_src},
            "summed_over": f"{self.answers} answer(s) of this seat",
        }


def _rate(n: int, ms: float, what: str) -> tuple[float | None, str]:
    if ms > 0:
        return round(n / ms * 1000, 2), f"{MEASURED} (tokens over milliseconds, summed)"
    return None, f"unavailable, because the engine reported no {what} time"
