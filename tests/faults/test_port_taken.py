"""A seat's port taken by another program between fitevict's choice and the engine's bind: the engine fails to
bind at once, and the load is retried on another port; the client sees a normal load."""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path

import pytest

from fitevict.config import load_config
from fitevict.engines.process import free_port
from fitevict.request.catalog import Catalog
from fitevict.store import Store
from fitevict.supervisor import Supervisor
from fitevict.engines.llama_cpp.server import BIND_FAILED

from faultrows import FaultSeen

pytestmark = pytest.mark.e2e


@pytest.mark.fault(
    fault="a seat's port taken by another program between fitevict's choice and the engine's bind",
    kind="collaborator with stand-ins")
def test_a_taken_port_is_retried_on_another(tmp_path: Path, zoo: dict, llama_server: Path,
                                            fault_seen: FaultSeen) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "tiny.gguf")
    cfg = load_config(None, env={}, overrides={
        "data_dir": str(tmp_path / "data"), "models_dirs": [str(models)], "budget.ram_limit": 4 * 1024**3,
        "budget.ram_reserve": 0, "policy.prompt_cache": False})
    store = Store.open(cfg.store_url)
    squatter = socket.socket()  # another program, listening on the port fitevict is about to choose
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    chosen: list[int] = []

    def ports() -> int:  # the OS's free port, except that the first choice is the taken one
        chosen.append(taken if not chosen else free_port())
        return chosen[-1]

    async def scenario() -> tuple[int, int, bool]:
        sup = Supervisor(config=cfg, catalog=Catalog.from_config(cfg), store=store, engine_binary=llama_server,
                         ports=ports)
        await sup.start()
        try:
            async with sup.acquire(sup.ask("tiny")) as seat:
                return seat.port, seat.pid, Path(f"/proc/{seat.pid}").exists()
        finally:
            await sup.shutdown()

    try:
        port, pid, ran = asyncio.run(scenario())
        assert fault_seen.client(ran, "a seat acquired (in the process, no HTTP)") is True
        assert fault_seen.running(port != taken, "the seat on another port") is True and chosen == [taken, port]
        assert fault_seen.running(len(chosen), "engine starts") == 2
        # the squatter still owns its port: fitevict took nothing from it
        assert fault_seen.running(squatter.getsockname()[1] == taken, "the other program still owns its port")
        with socket.create_connection(("127.0.0.1", taken), timeout=5):
            pass
    finally:
        squatter.close()
    events = store.events()
    load = next(e for e in events if e.event == "load")
    assert fault_seen.history(load.details["port"] == port, "the `load` on the second port") is True
    assert load.details["pid"] == pid
    # the bind failure is no failed load
    assert fault_seen.history([e.event for e in events if e.event == "fail"], "`fail` events") == []
    logs = [p.read_text(errors="replace") for p in (tmp_path / "data" / "seats").glob("tiny-*.log")]
    assert len(logs) == 2  # the failed attempt's log kept beside the seat's own, and it says why
    assert fault_seen.history(sum(BIND_FAILED in text for text in logs), "seat logs that say the bind failed") == 1
