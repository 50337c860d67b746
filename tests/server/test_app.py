"""The ASGI app without engines: envelopes, CORS, auth and admin validation (real app, real SQLite store).

The engine binary is only probed for its flags here, so a stand-in script is enough; every route that would
start a seat is covered end to end in tests/e2e/test_front_door.py.
"""

from __future__ import annotations



def test_unknown_route_and_method_use_the_envelope(make_client) -> None:
    c = make_client()
    r = c.get("/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = c.get("/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["message"]


def test_history_rejects_bad_filters_with_the_allowed_values(make_client) -> None:
    c = make_client()
    r = c.get("/v1/models/history", params={"event": "explode"})
    assert r.status_code == 400 and "idle-unload" in r.json()["error"]["message"]
    r = c.get("/v1/models/history", params={"limit": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"
    assert c.get("/v1/models/history").json() == {"object": "list", "data": []}


def test_cors_is_off_by_default_and_on_when_configured(make_client) -> None:
    pre = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"}
    off = make_client().options("/v1/chat/completions", headers=pre)
    assert "access-control-allow-origin" not in off.headers
    on = make_client(**{"server.cors_origins": ["http://localhost:3000"]}).options("/v1/chat/completions", headers=pre)
    assert on.headers.get("access-control-allow-origin") == "http://localhost:3000"


def test_keys_gate_inference_and_admin_separately(make_client) -> None:
    c = make_client(**{"server.api_keys": ["u1"], "server.admin_keys": ["a1"]})
    assert c.get("/v1/models").status_code == 401
    assert c.get("/v1/models", headers={"Authorization": "Bearer u1"}).status_code == 200
    plan = c.post("/v1/models/llama-gqa/plan", headers={"Authorization": "Bearer u1"})
    assert plan.status_code == 403 and plan.json()["error"]["code"] == "admin_key_required"
    ok = c.post("/v1/models/llama-gqa/plan", headers={"Authorization": "Bearer a1"})
    assert ok.status_code == 200 and ok.json()["plan"]["action"] in ("load", "ram")
    assert ok.json()["budget"]["devices"][0]["name"] == "CPU"
    assert c.get("/health").status_code == 200  # health needs no key


def test_metrics_and_models_list(make_client) -> None:
    c = make_client()
    m = c.get("/metrics")
    assert m.status_code == 200 and "fitevict_requests_total" in m.text
    models = c.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["llama-gqa"]
    assert models[0]["fitevict"]["resident"] is False and models[0]["fitevict"]["file"]["source"] == "file-size"


def test_dashboard_shows_the_budget_with_sources(make_client) -> None:
    c = make_client()
    assert c.get("/", follow_redirects=False).headers["location"] == "/dashboard"
    page = c.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    assert "meminfo MemTotal" in html and "meminfo MemAvailable" in html  # every figure says where it came from
    assert "<h2>Resident</h2>" in html and "none" in html
    assert "<script" not in html  # works offline, nothing to fetch


def test_dashboard_needs_a_key_when_keys_are_configured(make_client) -> None:
    c = make_client(**{"server.api_keys": ["u1"]})
    assert c.get("/dashboard").status_code == 401
    assert c.get("/dashboard", headers={"Authorization": "Bearer u1"}).status_code == 200
