"""The declared engine: starts the command line a model folder's manifest gives, on the seat's port, and waits for
its health path. It reports no buffers (the door measures its process) and has no words of its own for a failed
load, an exit code or a bind failure: its log tail says them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from fitevict.engines.base import EngineBase, LaunchSpec, Traits
from fitevict.engines.declared.manifest import read_manifest
from fitevict.pricing.footprint import Footprint
from fitevict.pricing.loadconfig import LoadConfig


class DeclaredEngine(EngineBase):
    name = "declared"
    traits = Traits(file_kinds=("declared",), overhead="own-process", reports_buffers=False)
    pricer = "fitevict.engines.declared.pricer:PRICER"

    def launch_spec(self, model_path: Path, config: LoadConfig, port: int, *, extra_args: Sequence[str] = (),
                    embeddings: bool = False, mmproj: Path | None = None,
                    slot_save_path: Path | None = None) -> LaunchSpec:
        m = read_manifest(model_path)
        n_ctx = config.n_ctx or m.context  # the context its price was made for (``DeclaredPricer.context``)
        notes = (f"declared by {model_path}: {m.memory_bytes} B at rest, {m.per_context_token} B per token of "
                 f"context",)
        return LaunchSpec((*m.argv(port, n_ctx), *extra_args), {**os.environ, **dict(m.env)}, port, m.health,
                          notes)

    def measured_footprint(self, log_text: str) -> Footprint | None:
        return None  # it reports nothing: its process is measured (``Traits.reports_buffers``)
