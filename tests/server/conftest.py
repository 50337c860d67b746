"""The app without engines: a stand-in binary that only answers the flag probe, the demo model, real SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fitevict.config import load_config
from fitevict.request.catalog import Catalog
from fitevict.server.app import create_app
from fitevict.zoo import write_zoo



@pytest.fixture()
def make_client(tmp_path: Path):
    engine = tmp_path / "llama-server"
    engine.write_text("#!/bin/sh\necho 'usage: --fit --cache-ram --no-webui --log-verbosity'\n")
    engine.chmod(0o755)
    models = tmp_path / "models"
    write_zoo(models, only=["llama-gqa"])
    clients = []

    def make(**overrides) -> TestClient:
        cfg = load_config(None, env={}, overrides={"data_dir": str(tmp_path / "data"), "models_dirs": [str(models)],
                                                   **overrides})
        c = TestClient(create_app(cfg, engine_binary=engine, catalog=Catalog.from_config(cfg)))
        c.__enter__()
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)
