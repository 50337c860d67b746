"""The engine protocol: how the supervisor starts, checks and reads one kind of engine process."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fitevict.pricing.footprint import Footprint
from fitevict.pricing.loadconfig import LoadConfig


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start one engine process."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    port: int
    health_path: str = "/health"
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Unavailable:
    """An engine figure that could not be produced, and why."""

    reason: str


class Engine(Protocol):
    name: str

    def launch_spec(self, model_path: Path, config: LoadConfig, port: int, *,
                    extra_args: Sequence[str] = (), embeddings: bool = False,
                    mmproj: Path | None = None) -> LaunchSpec:
        """The argv and environment that start ``model_path`` under ``config`` on ``port``."""
        ...

    def measured_footprint(self, log_text: str) -> Footprint | None:
        """The engine's own account of its buffers, parsed from its load log (source: measured)."""
        ...
