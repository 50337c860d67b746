"""The ASGI app: OpenAI-compatible inference routes relayed to seats on the fast path (``fastpath``) and the
polled routes (``plain``: /health, /v1/models, /metrics), ahead of the FastAPI app (``api``) that serves the admin
API, the Ollama routes and the dashboard.

Requests are validated before anything changes: a bad body, an unknown model, a bad load contract,
an oversized body or a wrong key is answered with a 4xx in OpenAI's envelope and no state changes.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.datastructures import State

from fitevict.config import Config
from fitevict.request.catalog import Catalog
from fitevict.server.door import Door
from fitevict.server.fastpath import FastPath
from fitevict.store.retention import RowBounds
from fitevict.server.metrics import Metrics
from fitevict.server.rescan import CatalogWatch
from fitevict.server.sampler import MemorySampler
from fitevict.server.heapkeep import HeapKeep
from fitevict.server.upkeep import Upkeep
from fitevict.supervisor.bounded import STEP_SECONDS, bounded
from fitevict.engines.upstream import Upstream
from fitevict.pricing.gguf import use_shelf
from fitevict.store import Store
from fitevict.store.structures import StoredStructures
from fitevict.supervisor import Supervisor

__all__ = ["create_app"]


def create_app(config: Config, *, engine_binary: Path, catalog: Catalog | None = None,
               store: Store | None = None, own_store: bool | None = None) -> Any:
    """The front door, an ASGI app: the fast path for inference and polled routes, FastAPI for the rest (built
    on its first request), CORS around both when configured. ``own_store``: close the store at shutdown
    (default: when this call opened it)."""
    catalog = catalog or Catalog.from_config(config)
    own_store = store is None if own_store is None else own_store
    store = store or Store.open(config.store_url)
    store.history_rows = config.logs.history_rows or None  # the row bound holds at every event (store.retention)
    store.row_bounds = RowBounds.of(config.logs.records_per_signature, config.logs.records_rows)  # and at every record
    sup = Supervisor(config=config, catalog=catalog, store=store, engine_binary=engine_binary)
    pool = Upstream()  # kept-alive connections per seat, for the fast path and the translated (Ollama) routes
    sup.fx.silent_for = pool.silent_for  # a stuck seat is one the door waits on (seat.frozen)
    metrics = Metrics()
    sup.on_event.append(metrics.observe_event)
    sampler = MemorySampler(sup, store, config.server.sample_seconds)
    upkeep = Upkeep(store, config)
    heapkeep = HeapKeep(config.server.heap_trim_seconds)
    door = Door(config, catalog, store, sup, metrics, pool, sampler, upkeep, heapkeep)
    sup.on_event.append(sampler.poke)
    watch = CatalogWatch(config, catalog)
    watch.on_change.append(lambda added, _removed: rescanned(added))

    def rescanned(added: list[str]) -> None:
        """Files may have changed on disk: every sheet is read again; the added models' prices are read ahead (their
        dry runs too, with ``read_prices_ahead``; else their sheets alone), once each."""
        if config.server.read_prices_ahead:
            sup.prices.forget()
            sup.read_ahead(added)
        else:
            sup.prices.rescanned(e for k in added if (e := catalog.get(k)))

    structures = StoredStructures(store)
    unshelve: list[Callable[[], None]] = []
    state = State({"supervisor": sup, "catalog": catalog, "store": store, "config": config, "sampler": sampler,
                   "catalog_watch": watch})

    async def startup() -> None:
        # the GGUF structures this host's earlier runs parsed: listing models needs no parse after a restart
        await asyncio.to_thread(structures.preload)
        unshelve.append(use_shelf(structures))
        await sup.start()
        if config.server.read_prices_ahead:
            sup.read_ahead(e.key for e in catalog.entries())
        sampler.start()
        upkeep.start()
        heapkeep.start()
        watch.start()
        gc.collect()
        gc.freeze()  # what start-up built lives as long as the server: full collections no longer walk it

    async def shutdown() -> None:
        for name, part in (("the catalog watch", watch), ("the memory sampler", sampler), ("the upkeep", upkeep),
                           ("the heap keeper", heapkeep)):
            await bounded(f"stopping {name}", part.stop(), STEP_SECONDS)
        await sup.shutdown()  # each of its steps bounded in turn
        pool.close()
        while unshelve:
            unshelve.pop()()
        if own_store:
            store.close()

    def build() -> Any:
        from fitevict.server.api import build_api

        return build_api(door, state)

    front = FastPath(door, build=build, startup=startup, shutdown=shutdown, state=state)
    if config.server.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        cors = CORSMiddleware(front, allow_origins=list(config.server.cors_origins), allow_methods=["*"],
                              allow_headers=["*"])
        cors.state = state  # type: ignore[attr-defined]  # what ``serve`` reads, as on the front door itself
        return cors
    return front
