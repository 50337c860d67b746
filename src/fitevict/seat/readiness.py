"""What a seat that answered its health check starts with, before the scheduler marks it ready: the repack crash it
was loaded after (if any), what ``policy.shrink_ctx`` decided for its context (the desk's), the saved prompts of its
signature that a request may restore (the prompt keep's, under ``policy.prompt_cache``), and the engine overhead it is
counted with (the build's calibration for an engine whose overhead is calibrated; its own process, as priced, for
one whose process is its own).

``Readiness`` works with four parts: the desk's shrink decisions (by model and context loaded), the prompt keep, the
configuration and the price book.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fitevict.config import Config
from fitevict.engines import traits
from fitevict.prices.book import PriceBook
from fitevict.prices.overhead import host_overhead, overhead_label
from fitevict.pricing.footprint import HOST
from fitevict.seat.crash import RepackCrash
from fitevict.seat.running import SeatState
from fitevict.seat.parts import PromptFiles


class Readiness:
    def __init__(self, shrinks: dict[tuple[str, int], dict[str, Any]], kv: PromptFiles, config: Config,
                 prices: PriceBook) -> None:
        self.shrinks, self.kv, self.config, self.prices = shrinks, kv, config, prices

    async def ready(self, seat: SeatState, crash: RepackCrash | None) -> None:
        cfg, prices = seat.config, self.prices
        seat.repack_crash = crash
        seat.shrunk_from = self.shrinks.pop((seat.key, cfg.n_ctx), None)
        if traits(seat.engine).keeps_prompts and self.config.policy.prompt_cache:
            seat.kv_candidates = await asyncio.to_thread(self.kv.matching, seat.signature)
        fixed = prices.engine_overhead.get(HOST, 0)
        if traits(seat.engine).overhead == "calibrated":
            seat.overhead = host_overhead(seat.predicted, prices.engine_overhead)
        else:  # a seat whose process is its own (a torch seat's), never the llama-server build's calibration
            seat.overhead = seat.predicted_overhead  # None until this machine measured one such seat
        origin = prices.overhead_origin if traits(seat.engine).overhead == "calibrated" else prices.torch_origin
        seat.overhead_label = overhead_label(seat.engine, fixed, origin, seat.predicted_overhead)
        seat.gpu_overhead = {d: n for d, n in prices.engine_overhead.items() if d in cfg.devices}
