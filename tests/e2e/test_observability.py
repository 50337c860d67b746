"""What fitevict shows about itself, against a real `fitevict serve` with real llama-server seats under a RAM budget
that holds one medium model: /metrics after a real swap, the dashboard in a real headless Chromium, the CLI at 80
columns, and the memory report over a real serving window of two models (with an A/B of two KV cache types)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from _frontdoor import front_door, history as history_of
from _models import medium_host_bytes, swap_models
from fitevict.units import MiB, parse_size

pytestmark = pytest.mark.e2e

USER, ADMIN = "obs-user", "obs-admin"
RESERVE = 64 * MiB


@pytest.fixture(scope="module")
def models(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return swap_models(zoo, tmp_path_factory.mktemp("obs-models"))


@pytest.fixture(scope="module")
def thresholds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Declared before the server starts, so before any number of the run exists."""
    path = tmp_path_factory.mktemp("obs-thresholds") / "thresholds.toml"
    path.write_text('[default]\npeak_pss = "2GiB"\npeak_rss = "2GiB"\npeak_available_drop = "4GiB"\n'
                    '[models.med-b]\npeak_pss = "1MiB"\n')
    return path


@pytest.fixture(scope="module")
def door(models: Path, thresholds: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("obs-door")
    cfg = tmp / "fitevict.toml"
    cfg.write_text(f"""
[server]
api_keys = ["{USER}"]
admin_keys = ["{ADMIN}"]
sample_seconds = 0.2

[budget]
ram_reserve = {RESERVE}

[policy]
idle_unload_seconds = 0
""")
    limit = int(1.5 * medium_host_bytes(models))
    with front_door(tmp, "--config", str(cfg), "--models-dir", str(models), "--ram-limit", str(limit)) as fd:
        yield fd


def admin(fd) -> httpx.Client:
    return httpx.Client(base_url=fd.base_url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120)


def chat(fd, model: str, **extra) -> None:
    c = openai.OpenAI(base_url=fd.base_url + "/v1", api_key=USER, max_retries=0, timeout=120)
    c.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, **extra)


def history(fd, **params) -> list[dict]:
    return history_of(fd, key=ADMIN, **params)


def residents(fd) -> dict[str, dict]:
    with admin(fd) as c:
        return {r["key"]: r for r in c.get("/v1/models/residents").json()["data"]}


def scrape(fd) -> dict[tuple[str, tuple], float]:
    text = httpx.get(fd.base_url + "/metrics", headers={"Authorization": f"Bearer {USER}"}).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_follow_a_real_swap(door, models: Path) -> None:
    chat(door, "med-a")
    chat(door, "med-b")  # one medium fits: med-a is evicted
    with pytest.raises(openai.APIStatusError) as refused:
        chat(door, "med-c", extra_body={"fitevict": {"ctx": 32768}})  # 8x the KV: more than the budget
    assert refused.value.status_code == 507
    m = scrape(door)
    hist = history(door)
    loads = [e for e in hist if e["event"] == "load"]
    evicts = [e for e in hist if e["event"] == "evict"]
    assert [e["model"] for e in evicts] == ["med-a"]
    assert metric(m, "fitevict_evictions_total", model="med-a", reason="evict") == 1
    for key in ("med-a", "med-b"):
        mine = [e for e in loads if e["model"] == key]
        assert metric(m, "fitevict_loads_total", model=key, reason="ram-only") == len(mine) == 1
        assert mine[0]["strategy"].startswith("ram-only (")
        assert metric(m, "fitevict_load_seconds_count", model=key, engine="llama-server") == 1
        assert metric(m, "fitevict_load_seconds_sum", model=key, engine="llama-server") == pytest.approx(
            mine[0]["seconds"])
    assert metric(m, "fitevict_refusals_total", model="med-c", reason="largest context fits") == 1
    released = [e["details"]["release_seconds"] for e in evicts if e["details"].get("release_seconds") is not None]
    assert metric(m, "fitevict_release_seconds_count", event="evict") == len(released) == 1
    assert metric(m, "fitevict_release_seconds_sum", event="evict") == pytest.approx(released[0])
    assert not [k for k in m if k[0] == "fitevict_leaks_total"]  # every release verified
    # gauges: the resident's bytes as the residents view has them; the budget, reserve and free of the host
    view = residents(door)
    assert set(view) == {"med-b"}
    cpu = view["med-b"]["devices"]["CPU"]
    # measured is the sampler's latest reading: the scrape and the view may be a tick apart
    assert metric(m, "fitevict_resident_bytes", model="med-b", device="CPU", source="measured") == pytest.approx(
        cpu["measured_bytes"], abs=max(0.02 * cpu["measured_bytes"], 2 * MiB))
    assert metric(m, "fitevict_resident_bytes", model="med-b", device="CPU", source="predicted") == cpu[
        "predicted_bytes"]
    assert not [k for k in m if k[0] == "fitevict_resident_bytes" and ("model", "med-a") in k[1]]
    budget = {dict(k[1])["source"]: v for k, v in m.items() if k[0] == "fitevict_budget_bytes"}
    assert budget == {"derived: limit": int(1.5 * medium_host_bytes(models))}  # the ram limit binds here
    assert metric(m, "fitevict_reserve_bytes", device="CPU", source="config ram_reserve=64.0 MiB") == RESERVE
    free = [v for k, v in m.items() if k[0] == "fitevict_free_bytes" and dict(k[1])["device"] == "CPU"]
    assert len(free) == 1 and free[0] > 0
    # the request path still observes its own waits and inference, under the names it always had
    assert metric(m, "fitevict_request_seconds_count", endpoint="chat") >= 2
    assert metric(m, "fitevict_load_wait_seconds_count", endpoint="chat") >= 2


def chromium_path() -> str:
    """The system Chromium (Debian's package; scripts/test-chromium.sh installs it as root). Skips only with the
    reason that script recorded, or when run outside it on a machine without Chromium."""
    why = os.environ.get("FITEVICT_TEST_CHROMIUM_SKIP")
    if why:
        pytest.skip(f"no Chromium for the dashboard test: {why}")
    found = os.environ.get("FITEVICT_TEST_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("no Chromium for the dashboard test: chromium is not on PATH; run the suite through ./run.sh "
                    "test (which installs Debian's chromium as root) or set FITEVICT_TEST_CHROMIUM")
    return found


def test_dashboard_in_a_real_browser(door, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extras: pip install "
                                   "-e '.[test]'")
    chromium = chromium_path()
    chat(door, "med-a")
    chat(door, "med-b")  # evicts med-a: the timeline has an eviction
    with admin(door) as c:
        assert c.post("/v1/models/llama-gqa/load").status_code == 200  # small: fits beside med-b
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.add_init_script(f"sessionStorage.setItem('fitevict-key', {json.dumps(ADMIN)})")
            page.goto(door.base_url + "/dashboard")
            page.wait_for_selector('.bar[data-kind="measured"] .seg.res[data-model="llama-gqa"]')
            # the bars' widths follow the measured bytes, as the residents API reports them
            # read in one script run, so no refresh of the live part falls between the figures and the widths
            bar = page.locator('.bar[data-device="CPU"][data-kind="measured"]').evaluate(
                "b => ({scale: +b.dataset.scale, width: b.clientWidth, segs: Object.fromEntries("
                "[...b.querySelectorAll('.seg.res')].map(s => [s.dataset.model, {bytes: +s.dataset.bytes, "
                "width: s.getBoundingClientRect().width, title: s.title}]))})")
            view = residents(door)
            for key in ("med-b", "llama-gqa"):
                seg = bar["segs"][key]
                live = view[key]["devices"]["CPU"]["measured_bytes"]  # a tick later, perhaps: a live reading
                assert seg["bytes"] == pytest.approx(live, abs=max(0.02 * live, 2 * MiB))
                assert seg["width"] == pytest.approx(bar["width"] * seg["bytes"] / bar["scale"], abs=1.5)
                assert "measured" in seg["title"] and "predicted" in seg["title"]
            ratio = bar["segs"]["med-b"]["width"] / bar["segs"]["llama-gqa"]["width"]
            assert ratio == pytest.approx(view["med-b"]["devices"]["CPU"]["measured_bytes"] /
                                          view["llama-gqa"]["devices"]["CPU"]["measured_bytes"], rel=0.05)
            # the catalog's dry run: another medium would evict med-b; the refused context shows its largest fit
            row = page.locator('tr[data-model="med-a"] .pill')
            assert "evicts med-b" in row.inner_text()
            assert page.locator(".timeline .ev.evict").count() >= 1
            page.screenshot(path=str(tmp_path / "dashboard-before-unload.png"), full_page=True)
            # unload from the page: the resident disappears without a reload
            page.locator('tr.resident[data-model="llama-gqa"] button[data-act="unload"]').click()
            page.wait_for_selector('tr.resident[data-model="llama-gqa"]', state="detached", timeout=60_000)
            assert page.locator('.seg.res[data-model="llama-gqa"]').count() == 0
            assert page.locator('tr.resident[data-model="med-b"]').count() == 1
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            # the dashboard links the memory report: med-a's window closed when it was evicted
            page.click("text=memory report")
            page.wait_for_selector("h2:has-text('Memory report')")
            assert page.locator("td:has-text('med-a')").count() >= 4  # one row per figure
            assert page.locator(".pill.blocked").count() >= 1  # peak GPU on a host without one, or its reason
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert "llama-gqa" not in residents(door)
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    print(f"dashboard screenshot: {tmp_path / 'dashboard.png'}")


def stored_windows(fd, models: set[str], *, within: float = 30.0) -> list[dict]:
    """The stored serving windows once every model in ``models`` has one (the sampler stores a window right after
    its seat's stop is recorded)."""
    deadline = time.monotonic() + within
    while True:
        with admin(fd) as c:
            ws = [w for w in c.get("/dashboard/report.json").json()["windows"] if w["id"] is not None]
        if models <= {w["model"] for w in ws} or time.monotonic() > deadline:
            return ws
        time.sleep(0.1)  # another process's store: there is no event to await from here


def unload_all(fd) -> None:
    with admin(fd) as c:
        for key in residents(fd):
            assert c.post(f"/v1/models/{key}/unload").json()["unloaded"] is True


def fitevict(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns), "FITEVICT_CONFIG": ""}
    return subprocess.run([sys.executable, "-m", "fitevict.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_memory_report_of_a_real_serving_window(door, thresholds: Path, tmp_path: Path) -> None:
    chat(door, "med-a")
    chat(door, "med-b")
    unload_all(door)
    ws = stored_windows(door, {"med-a", "med-b"})
    assert {"med-a", "med-b"} <= {w["model"] for w in ws}
    out = tmp_path / "report"
    r = fitevict("report", "--thresholds", str(thresholds), "--data-dir", str(door.data_dir), "--out", str(out),
                 "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = {(row["model"], row["figure"]): row for row in doc["rows"]}
    loads = {e["model"]: e for e in history(door, event="load")}
    for key in ("med-a", "med-b"):
        pss = rows[(key, "peak_pss")]
        assert pss["engine"] == "llama-server" and pss["windows"] >= 1 and "smaps_rollup" in pss["why"]
        # the peak over the window is at least what the load measured (the same PSS, taken once)
        assert pss["peak_bytes"] >= 0.9 * loads[key]["bytes"]["measured"]
        assert rows[(key, "peak_rss")]["peak_bytes"] >= pss["peak_bytes"] * 0.5
        assert rows[(key, "peak_available_drop")]["result"] == "PASS"
        gpu = rows[(key, "peak_gpu")]
        assert gpu["result"] == "BLOCKED" and gpu["peak_bytes"] is None
        assert "no NVIDIA GPU" in gpu["why"]  # this host has none: a reason, never a number
    assert rows[("med-a", "peak_pss")]["result"] == "PASS"  # default threshold 2 GiB
    assert rows[("med-b", "peak_pss")]["result"] == "FAIL"  # its own threshold: 1 MiB
    assert rows[("med-b", "peak_pss")]["threshold_bytes"] == MiB
    md = (out / "report.md").read_text()
    assert "| med-b | llama-server | peak PSS |" in md and "**FAIL**" in md and "**BLOCKED**" in md
    assert json.loads((out / "report.json").read_text())["thresholds"]["path"] == str(thresholds)
    print(md)


def test_memory_report_ab_over_swapped_legs(door, tmp_path: Path) -> None:
    unload_all(door)
    side = lambda kv: json.dumps({"kv_cache_type": kv, "flash_attn": True, "ctx": 8192})  # noqa: E731
    run = fitevict("ab", "med-c", "--a", side("q8_0"), "--b", side("f16"), "--max-tokens", "4", "--url",
                   door.base_url, "--key", ADMIN, "--json")
    assert run.returncode == 0, run.stderr
    driven = json.loads(run.stdout)
    assert driven["order"] == "ABBA"
    assert [leg["config"]["cache_type_k"] for leg in driven["legs"]] == ["q8_0", "f16", "f16", "q8_0"]
    # the same legs, read back from the store by their load configuration
    r = fitevict("report", "--data-dir", str(door.data_dir), "--ab", "med-c", "--a", "cache_type_k=q8_0", "--b",
                 "cache_type_k=f16", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [leg["leg"] for leg in doc["legs"]] == list("ABBA")
    comps = {c["figure"]: c for c in doc["comparisons"]}
    assert comps == {c["figure"]: c for c in driven["comparisons"]}
    print(json.dumps(doc["comparisons"], indent=1))
    assert comps["peak_gpu"]["verdict"] == "BLOCKED"
    pss = comps["peak_pss"]
    assert len(pss["a_bytes"]) == len(pss["b_bytes"]) == 2 and pss["noise_floor_bytes"] is not None
    # f16 KV holds twice the bytes of q8_0 (nearly): PSS shows it well above the leg-to-leg noise, and by about
    # what the pricing predicts for the two configurations
    assert pss["verdict"] == "B higher" and pss["difference_bytes"] > 4 * pss["noise_floor_bytes"]
    loads = [e for e in history(door, model="med-c", event="load")][:4]
    predicted = {e["details"]["config"]["cache_type_k"]: e["bytes"]["predicted"] for e in loads}
    assert pss["difference_bytes"] == pytest.approx(predicted["f16"] - predicted["q8_0"], rel=0.3)


def test_cli_fits_80_columns(door) -> None:
    chat(door, "llama-gqa")
    unload_all(door)  # the history has unloads, with the bytes freed
    chat(door, "med-b")
    chat(door, "llama-gqa")  # small: loads beside med-b
    common = ("--url", door.base_url, "--key", ADMIN)
    outputs = {}
    for cmd in (("ps",), ("history", "--limit", "12"), ("plan", "med-a", "--server", door.base_url)):
        args = (*cmd, *common) if cmd[0] != "plan" else (*cmd, "--key", ADMIN)
        r = fitevict(*args)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines and max(len(line) for line in lines) <= 80, r.stdout
        assert "…" not in r.stdout, r.stdout  # folded, never cut
        outputs[cmd[0]] = r.stdout
        print(r.stdout)
    view = residents(door)
    for key in ("llama-gqa", "med-b"):  # every model named in full, with its measured figure (a live reading: the
        assert key in outputs["ps"] and key in outputs["history"]  # sampler may have read it again since)
        row = next(line for line in outputs["ps"].splitlines() if line.startswith(key))
        shown = parse_size(re.search(r"\d+(?:\.\d+)? [KMG]iB", row).group(0).replace(" ", ""))
        assert abs(shown - view[key]["devices"]["CPU"]["measured_bytes"]) <= 2 * MiB, (row, view[key]["devices"])
    assert "unloaded on request" in outputs["history"] and "med-a" in outputs["plan"]
    full = json.loads(fitevict("ps", *common, "--json").stdout)  # the full figures
    now = residents(door)
    for r in full:
        live = now[r["key"]]["devices"]["CPU"]["measured_bytes"]
        assert abs(r["devices"]["CPU"]["measured_bytes"] - live) <= max(0.02 * live, 2 * MiB)
