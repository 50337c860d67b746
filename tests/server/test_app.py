"""The ASGI app without engines: envelopes, CORS, auth and admin validation (real app, real SQLite store).

The engine binary is only probed for its flags here, so a stand-in script is enough; every route that would
start a seat is covered end to end in tests/e2e/test_front_door.py.
"""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient


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
    health = c.get("/health")  # health needs no key
    assert health.status_code == 200
    heap = health.json()["heap"]  # what the door does to keep its heap to what it holds (server.heapkeep)
    assert heap["trim_seconds"] == 60.0 and heap["rounds"] == 0 and heap["allocator"]
    assert heap["held"]["python_blocks"] > 0  # what it is made of, by the allocators' own counts


def _requests_total(c: TestClient) -> dict[tuple[str, str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, str, str], float] = {}
    for fam in text_string_to_metric_families(c.get("/metrics").text):
        for s in fam.samples:
            if s.name == "fitevict_requests_total":
                out[(s.labels["model"], s.labels["endpoint"], s.labels["status"])] = s.value
    return out


def test_metrics_and_models_list(make_client, tmp_path: Path) -> None:
    """/metrics counts each inference request under its model, endpoint and status; /v1/models lists the catalog
    with each file's size."""
    c = make_client()
    assert _requests_total(c) == {}
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert c.post("/v1/chat/completions", json={"model": "nope", **chat}).status_code == 404
    assert c.post("/v1/chat/completions", json={"model": "nope", **chat}).status_code == 404
    # the stand-in engine exits at once: the load fails, and that request is counted under its model
    assert c.post("/v1/chat/completions", json={"model": "llama-gqa", **chat}).status_code == 502
    assert _requests_total(c) == {("-", "chat", "404"): 2.0, ("llama-gqa", "chat", "502"): 1.0}
    m = c.get("/metrics")
    assert m.status_code == 200 and "fitevict_requests_total" in m.text
    assert 'fitevict_budget_bytes{device="CPU",source="derived: ' in m.text  # a fresh budget reading, with source
    assert 'fitevict_free_bytes{device="CPU",source="meminfo MemAvailable"}' in m.text
    models = c.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["llama-gqa"]
    f = models[0]["fitevict"]
    assert f["resident"] is False and f["file"]["source"] == "file-size"
    assert f["file"]["bytes"] == (tmp_path / "models" / "llama-gqa.gguf").stat().st_size


def test_metrics_need_a_key_when_keys_are_configured_unless_opened(make_client) -> None:
    closed = make_client(**{"server.api_keys": ["u1"]})
    assert closed.get("/metrics").status_code == 401
    assert closed.get("/metrics", headers={"Authorization": "Bearer u1"}).status_code == 200
    opened = make_client(**{"server.api_keys": ["u1"], "server.metrics_public": True})
    assert opened.get("/metrics").status_code == 200
    assert opened.get("/v1/models").status_code == 401  # only /metrics is opened


def test_dashboard_shows_the_budget_catalog_and_sources(make_client) -> None:
    c = make_client()
    assert c.get("/", follow_redirects=False).headers["location"] == "/dashboard"
    page = c.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    assert "meminfo MemTotal" in html and "meminfo MemAvailable" in html  # every figure says where it came from
    assert 'data-kind="measured"' in html and 'data-kind="machine"' in html
    assert '<tr data-model="llama-gqa" data-action="' in html and ">fits" in html  # the dry run, per model
    assert 'data-act="load"' in html  # no keys configured: everyone may load
    assert "http://" not in html and "https://" not in html  # nothing fetched from elsewhere
    assert c.get("/dashboard/report").status_code == 200
    assert c.get("/dashboard/report.json").json() == {"rows": [], "windows": []}


def test_dashboard_needs_a_key_when_keys_are_configured(make_client) -> None:
    c = make_client(**{"server.api_keys": ["u1"], "server.admin_keys": ["a1"]})
    shell = c.get("/dashboard")
    assert shell.status_code == 200 and "meminfo" not in shell.text and "Enter a key" in shell.text
    assert c.get("/dashboard/live").status_code == 401
    user = c.get("/dashboard/live", headers={"Authorization": "Bearer u1"})
    assert user.status_code == 200 and "meminfo" in user.text and "data-act=" not in user.text
    admin = c.get("/dashboard/live", headers={"Authorization": "Bearer a1"})
    assert 'data-act="load"' in admin.text


def test_store_models_by_name_slashes_included_and_ambiguous_names(make_client, tmp_path: Path) -> None:
    from fitevict.zoo.stores import write_lmstudio_repo

    gqa = tmp_path / "models" / "llama-gqa.gguf"
    write_lmstudio_repo(tmp_path / "lms", "pub/Two-GGUF", {"Two-Q4_0.gguf": gqa, "Two-Q8_0.gguf": gqa})
    c = make_client(**{"stores.lmstudio": str(tmp_path / "lms")})
    listed = {m["id"]: m["fitevict"]["store"] for m in c.get("/v1/models").json()["data"]}
    assert listed == {"llama-gqa": "models-dir", "pub/Two-GGUF:Q4_0": "lmstudio", "pub/Two-GGUF:Q8_0": "lmstudio"}
    assert c.get("/v1/models/pub/Two-GGUF:Q8_0").json()["id"] == "pub/Two-GGUF:Q8_0"  # a slash in a route's id
    tags = {m["name"]: m["fitevict"]["store"] for m in c.get("/api/tags").json()["models"]}
    assert tags["pub/Two-GGUF:Q4_0"] == "lmstudio"
    chat = {"model": "pub/Two-GGUF", "messages": [{"role": "user", "content": "hi"}]}
    r = c.post("/v1/chat/completions", json=chat)
    assert r.status_code == 400 and r.json()["error"]["code"] == "ambiguous_model"
    assert r.json()["error"]["candidates"] == ["pub/Two-GGUF:Q4_0", "pub/Two-GGUF:Q8_0"]
    r = c.post("/api/chat", json=chat)
    assert r.status_code == 400 and "pub/Two-GGUF:Q4_0, pub/Two-GGUF:Q8_0" in r.json()["error"]
    assert c.post("/v1/models/Two-GGUF/unload").status_code == 400
    assert c.post("/v1/models/pub/Two-GGUF:Q4_0/unload").json() == {"model": "pub/Two-GGUF:Q4_0", "unloaded": False,
                                                                     "reason": "not resident"}


def test_a_model_file_that_cannot_be_read_is_answered_at_the_door(make_client, tmp_path: Path) -> None:
    """The door builds what a request asks of a seat before it waits (``Door.ask``): a model whose file cannot be
    read is a 500 that names the model and what to do, on both doors, and nothing is queued or started."""
    (tmp_path / "models" / "broken.gguf").write_bytes(b"GGUF" + bytes(60))  # a header that ends at once
    c = make_client()
    assert "broken" in {m["id"] for m in c.get("/v1/models").json()["data"]}
    r = c.post("/v1/chat/completions", json={"model": "broken", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 500 and r.json()["error"]["code"] == "model_unreadable", r.text
    assert "'broken'" in r.json()["error"]["message"] and "rescan" in r.json()["error"]["message"]
    r = c.post("/api/chat", json={"model": "broken", "messages": [{"role": "user", "content": "hi"}], "stream": False})
    assert r.status_code == 500 and "'broken'" in r.json()["error"], r.text
    sup = c.app.state.supervisor
    assert sup.queue_view() == {} and sup.resident_views() == []


def test_a_gguf_file_the_model_lacks_is_refused_at_both_doors(make_client) -> None:
    c = make_client()
    asked = {"model": "llama-gqa", "messages": [{"role": "user", "content": "hi"}], "fitevict": {"gguf_file": "nope.gguf"}}
    r = c.post("/v1/chat/completions", json=asked)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_gguf_file", r.text
    r = c.post("/api/chat", json={**asked, "stream": False})
    assert r.status_code == 400 and "nope.gguf" in r.json()["error"] and "choices" in r.json()["error"], r.text
    assert c.app.state.supervisor.queue_view() == {}
