"""Contention through a real ``fitevict serve`` with real llama-server seats: no thrash, no lost request,
nobody waits for a ghost, and SIGTERM under load stops cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from _frontdoor import poll, FrontDoor, engine_pids_of, front_door, history
from _models import medium_host_bytes

pytestmark = pytest.mark.e2e


def _limit(models_dir: Path) -> str:
    return str(int(1.5 * medium_host_bytes(models_dir)))  # one medium at a time, plus a small model


def _history(door: FrontDoor, **q) -> list[dict]:
    return history(door, limit=10000, **q)


def test_eight_clients_three_models_no_thrash(tmp_path: Path, models_dir: Path) -> None:
    """8 threads, 24 chats (max_tokens 3) round-robin over two mediums that cannot be co-resident and a small
    model, each with the same contract: all answered, fewer than 12 swaps, and no request waits longer than the
    starvation bound plus one swap."""
    with front_door(tmp_path, "--models-dir", str(models_dir), "--ram-limit", _limit(models_dir)) as door:
        keys = ["med-a", "med-b", "llama-gqa"]
        jobs = [keys[i % 3] for i in range(24)]

        def chat(key: str) -> int:
            r = httpx.post(door.base_url + "/v1/chat/completions", timeout=600, json={
                "model": key, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}],
                "fitevict": {"ctx": 2048}})
            return r.status_code

        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(chat, jobs))
        assert codes == [200] * 24
        loads = _history(door, event="load")
        swaps = [e for e in loads if e["model"] in ("med-a", "med-b")]
        assert len(swaps) < 12, [e["model"] for e in reversed(loads)]
        evicts = _history(door, event="evict")
        log = door.await_requests(24)
        assert len(log) == 24 and all(line["status"] == 200 for line in log)
        # the bound: max(max_wait, swap + min residency) + one swap, where a swap is draining a seat (one running
        # request and one queued in the engine), its release and the next load, all as measured here
        service = max(line["latency_s"] for line in log)
        release = max((e.get("seconds") or 0) + (e.get("release_seconds") or 0) for e in evicts) if evicts else 0.0
        swap = 2 * service + release + max(e["seconds"] for e in loads)
        bound = max(10.0, swap + 1.0) + swap + 0.5  # 0.5 s for fitevict's own steps on this shared machine
        waits = [line["queue_wait_s"] + line["load_wait_s"] for line in log]
        assert max(waits) <= bound, (max(waits), bound, waits)
        print(f"contention: {len(swaps)} medium loads, {len(loads)} loads, {len(evicts)} evictions, "
              f"max wait {max(waits):.2f} s (bound {bound:.2f} s)")
        assert all(line["latency_s"] <= line["total_s"] for line in log)  # load wait is not inference latency


CLIENT = r"""
import sys, httpx
httpx.post(sys.argv[1] + "/v1/chat/completions", timeout=600, json={
    "model": sys.argv[2], "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
"""


def _waiting(door: FrontDoor) -> dict:
    return httpx.get(door.base_url + "/v1/models/residents", timeout=30).json().get("waiting", {})


def test_clients_killed_while_queued_cause_no_further_loads(tmp_path: Path, models_dir: Path) -> None:
    env = {"FITEVICT_CONFIG": str(tmp_path / "f.toml")}
    (tmp_path / "f.toml").write_text("[policy]\nmin_residency_seconds = 600\nmax_wait_seconds = 600\n")
    with front_door(tmp_path, "--models-dir", str(models_dir), "--ram-limit", _limit(models_dir), env=env) as door:
        assert httpx.post(door.base_url + "/v1/models/med-a/load", timeout=300).status_code == 200
        clients = [subprocess.Popen([sys.executable, "-c", CLIENT, door.base_url, "med-b"]) for _ in range(4)]
        try:
            poll(lambda: _waiting(door).get("med-b") == 4, "4 requests queued for med-b")
        finally:
            for c in clients:
                c.kill()
                c.wait()
        poll(lambda: not _waiting(door), "the queue to empty once its clients are gone")
        # med-a leaves; had any med-b request stayed queued, its load would now come first (one placement at a
        # time, oldest request first) and precede the small model's
        assert httpx.post(door.base_url + "/v1/models/med-a/unload", timeout=300).status_code == 200
        r = httpx.post(door.base_url + "/v1/chat/completions", timeout=300, json={
            "model": "llama-gqa", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
        assert [e["model"] for e in reversed(_history(door, event="load"))] == ["med-a", "llama-gqa"]
        assert len(engine_pids_of(door.proc.pid)) == 1


def test_sigterm_with_queued_and_in_flight_requests_stops_cleanly(tmp_path: Path, models_dir: Path) -> None:
    grace = 120  # generous: in-flight requests finish well within it even on a busy machine
    (tmp_path / "f.toml").write_text(f"[policy]\nmin_residency_seconds = 600\nmax_wait_seconds = 600\n"
                                     f"shutdown_grace_seconds = {grace}\n")
    env = {"FITEVICT_CONFIG": str(tmp_path / "f.toml")}
    with front_door(tmp_path, "--models-dir", str(models_dir), "--ram-limit", _limit(models_dir), env=env) as door:
        assert httpx.post(door.base_url + "/v1/models/med-a/load", timeout=300).status_code == 200
        engines = engine_pids_of(door.proc.pid)
        pool = ThreadPoolExecutor(18)

        def call(key: str, n: int) -> tuple[httpx.Response, float]:
            r = httpx.post(door.base_url + "/v1/chat/completions", timeout=600, json={
                "model": key, "max_tokens": n, "ignore_eos": True, "messages": [{"role": "user", "content": "hi"}]})
            return r, time.monotonic()

        # long enough to be in flight still at SIGTERM (asserted below): ended before, med-a's seat would be
        # evicted for med-b's waiters and its stop would be the eviction's, not shutdown's
        in_flight = [pool.submit(call, "med-a", 256) for _ in range(2)]
        poll(lambda: any(r["in_flight"] == 2 for r in
                          httpx.get(door.base_url + "/v1/models/residents", timeout=30).json()["data"]),
              "2 requests in flight on med-a")
        queued = [pool.submit(call, "med-b", 2) for _ in range(16)]
        poll(lambda: _waiting(door).get("med-b") == 16, "16 requests queued for med-b")
        t0 = time.monotonic()
        door.proc.send_signal(signal.SIGTERM)
        rc = door.proc.wait(timeout=grace + 60)
        took = time.monotonic() - t0
        answers = [f.result(timeout=60)[0] for f in queued]
        done = [f.result(timeout=60) for f in in_flight]
        last_answer = max(t for _r, t in done)
        pool.shutdown()
    assert rc == 0
    assert all(r.status_code == 503 and r.headers.get("retry-after") for r in answers), [r.status_code for r in answers]
    assert all("shutting down" in r.json()["error"]["message"] for r in answers)
    assert [r.status_code for r, _t in done] == [200, 200]
    assert min(t for _r, t in done) > t0, "the requests ended before SIGTERM: nothing was in flight"
    # it waited for the requests in flight, within its grace period, and cut none, then stopped its seats
    print(f"shutdown: {took:.2f} s from SIGTERM to exit, {t0 + took - last_answer:.2f} s of it after the last "
          "in-flight answer")
    assert took < grace, took
    log = (tmp_path / door.log_path.name).read_text(errors="replace")
    assert "Traceback" not in log and "CancelledError" not in log
    summary = [line for line in log.splitlines() if line.startswith("fitevict stopped in")]
    assert len(summary) == 1 and "16 waiting request(s) answered 503" in summary[0], summary
    assert "0 in-flight request(s) cut after the grace period" in summary[0], summary
    assert "1 seat(s) stopped, 1 release(s) verified, 0 not verified, 0 failed" in summary[0], summary
    assert all(not Path(f"/proc/{pid}").exists() for pid in engines)
