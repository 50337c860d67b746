"""Clients to the seats on 127.0.0.1 share one TLS context (engines.loopback): httpx would otherwise load its CA
bundle into a new one for every client, ~20 ms of CPU and a heap's worth of small allocations each time."""

from __future__ import annotations

import asyncio
import http.server
import re
import ssl
import threading
from pathlib import Path

import pytest

import fitevict
from fitevict.engines import loopback


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every TLS context made from now on, counted (the shared one made before)."""
    loopback.tls()
    made: list[int] = []
    real = ssl.create_default_context

    def count(*a, **kw):
        made.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(ssl, "create_default_context", count)
    return made


@pytest.fixture
def server():
    class Echo(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        do_POST = do_GET  # noqa: N815

        def log_message(self, *a) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_clients_made_here_make_no_tls_context_of_their_own(counted: list[int], server: str) -> None:
    async def three() -> list[int]:
        codes = []
        for _ in range(3):
            async with loopback.aclient(server, 5) as c:
                codes.append((await c.get("/slots")).status_code)
        return codes

    assert asyncio.run(three()) == [200, 200, 200]
    assert loopback.get(server + "/health", 5).status_code == 200
    assert loopback.post(server + "/tokenize", 5, json={"content": "x"}).status_code == 200
    assert counted == []


def test_a_plain_httpx_client_would_make_one(counted: list[int]) -> None:
    """What the shared context saves: the check above can fail."""
    import httpx

    httpx.AsyncClient(base_url="http://127.0.0.1:9")
    assert len(counted) == 1


def test_the_door_makes_its_loopback_clients_here() -> None:
    """No module of the door (the CLI and the cluster's long-lived clients aside) makes an httpx client itself."""
    src = Path(fitevict.__file__).parent
    made = re.compile(r"httpx\.(AsyncClient|Client|get|post|put|delete|request|stream)\(")
    found = [f"{p.relative_to(src)}:{n}" for p in src.rglob("*.py")
             if p.name != "loopback.py" and p.parts[len(src.parts)] not in ("cli", "cluster")
             for n, line in enumerate(p.read_text().splitlines(), 1) if made.search(line)]
    assert found == [], found
