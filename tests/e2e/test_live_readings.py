"""A seat's ``measured`` is the memory sampler's latest reading, and a seat that outgrows its price is caught, with a
real ``fitevict serve`` and real engines.

- A seat whose context is filled after its load (``engines.llama_cpp.fill``, straight to the engine, so the seat stays idle):
  once the sampler has read it twice since, ``measured`` in ``/v1/models/residents``, ``fitevict ps --json`` and
  ``/metrics`` is within max(2 %, 2 MiB) of its process tree's PSS read at that moment (``host.procmem.read_tree``),
  where the reading right after its load (what ``measured`` used to be) is well under it.
- A leaking seat: an ``LD_PRELOAD`` shim, built here with the system cc, makes a llama-server allocate and touch
  ``LEAK_MIB`` MiB whenever a request it receives carries a marker. After a few such requests its reading exceeds its
  price by more than ``budget.outgrow_margin``: one ``outgrew`` event with the figures and growth rate, the mark in
  the residents view, ``ps`` and ``/metrics``; and when another program takes the memory, it is stopped before the
  healthy idle seat, although that one was used less recently.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from _frontdoor import front_door, history, poll
from fitevict.engines.llama_cpp.fill import fill
from fitevict.host.procmem import read_meminfo, read_tree
from fitevict.units import GiB, MiB

pytestmark = pytest.mark.e2e

CTX = 2048
LEAK_MIB = 24
MARKER = "FITEVICT-LEAK-7f3a"
SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/types.h>

static ssize_t (*real_recv)(int, void *, size_t, int);
static int is_engine = -1;

/* a llama-server that leaks LEAK_MIB MiB of touched memory for every request carrying MARKER */
ssize_t recv(int fd, void *buf, size_t len, int flags) {
    if (!real_recv) real_recv = (ssize_t (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, "recv");
    ssize_t n = real_recv(fd, buf, len, flags);
    if (is_engine < 0) {
        char exe[4096] = {0};
        ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
        is_engine = k > 12 && strcmp(exe + k - 12, "llama-server") == 0;
    }
    if (is_engine && n > 0 && memmem(buf, (size_t)n, MARKER, sizeof MARKER - 1)) {
        size_t size = (size_t)LEAK_MIB << 20;
        volatile char *p = malloc(size);
        for (size_t i = 0; p && i < size; i += 4096) p[i] = 1;
    }
    return n;
}
"""


def _residents(base: str) -> dict[str, dict]:
    return {r["key"]: r for r in httpx.get(base + "/v1/models/residents", timeout=30).json()["data"]}


def _chat(base: str, model: str, text: str = "hi", **extra) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", timeout=300, json={
        "model": model, "max_tokens": 2, "messages": [{"role": "user", "content": text}], **extra})


def _measured_metric(base: str, model: str) -> float | None:
    for fam in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=30).text):
        for s in fam.samples:
            if (s.name == "fitevict_resident_bytes" and s.labels.get("model") == model
                    and s.labels.get("device") == "CPU" and s.labels.get("source") == "measured"):
                return s.value
    return None


def _gauge(base: str, name: str, model: str) -> float | None:
    for fam in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=30).text):
        for s in fam.samples:
            if s.name == name and s.labels.get("model") == model:
                return s.value
    return None


def _after_readings(base: str, model: str, n: int) -> dict:
    """The resident's view once the sampler has read it ``n`` more times than now."""
    start = _residents(base)[model]["readings"]
    return poll(lambda: (lambda r: r if r["readings"] >= start + n else None)(_residents(base)[model]),
                f"{n} more readings of {model}", 60)


def test_measured_is_the_live_reading_of_a_filled_seat(zoo: dict, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "gqa.gguf")
    cfg = tmp_path / "f.toml"
    cfg.write_text("[server]\nsample_seconds = 0.25\n[policy]\nidle_unload_seconds = 0\n")
    with front_door(tmp_path, "--models-dir", str(models), env={"FITEVICT_CONFIG": str(cfg)}) as door:
        base = door.base_url
        assert _chat(base, "gqa", fitevict={"ctx": CTX, "parallel": 1}).status_code == 200
        load = poll(lambda: history(door, event="load"), "the load event", 60)[0]
        at_load = load["details"]["host_pss"]["committed_bytes"] + load["details"]["host_pss"]["mapped_bytes"]
        r = _residents(base)["gqa"]
        got = fill(f"http://127.0.0.1:{r['port']}", 1, CTX)  # straight to the engine: the seat stays idle
        assert sum(got[0]) == CTX, got
        r = _after_readings(base, "gqa", 2)  # two sampler periods with the context filled and the seat idle
        pss = read_tree(r["pid"]).host_bytes
        cpu = r["devices"]["CPU"]
        bound = max(0.02 * pss, 2 * MiB)
        print(f"filled {CTX} tokens: measured {cpu['measured_bytes']:,} B ({cpu['measured_age_seconds']:.2f} s old, "
              f"{r['readings']} readings), PSS now {pss:,} B, the load's reading {at_load:,} B "
              f"({100 * (at_load - pss) / pss:+.1f} %), peak {cpu['measured_peak_bytes']:,} B, planned "
              f"{cpu['planned_bytes']:,} B, priced {cpu['predicted_bytes']:,} B")
        assert abs(cpu["measured_bytes"] - pss) <= bound, (cpu, pss)
        assert cpu["measured_source"].startswith("measured: PSS") and cpu["measured_at"] is not None
        # the load's reading (what `measured` used to stay at) is below the live one: the filled context grew it
        assert at_load < cpu["measured_bytes"], (at_load, cpu)
        assert cpu["measured_peak_bytes"] >= max(cpu["measured_bytes"], at_load)
        assert cpu["planned_bytes"] >= cpu["measured_bytes"]  # the planner counts the live reading
        ps = subprocess.run([sys.executable, "-m", "fitevict.cli", "ps", "--json", "--url", base],
                            capture_output=True, text=True, timeout=120, check=True)
        listed = {v["key"]: v for v in json.loads(ps.stdout)}["gqa"]["devices"]["CPU"]["measured_bytes"]
        assert abs(listed - read_tree(r["pid"]).host_bytes) <= bound
        assert abs(_measured_metric(base, "gqa") - read_tree(r["pid"]).host_bytes) <= bound
        assert not _residents(base)["gqa"]["outgrew"]  # a filled seat within its price is healthy


def build_shim(dest: Path, leak_mib: int = LEAK_MIB) -> Path:
    """The leaking shim, built with the system cc into ``dest``: ``leak_mib`` MiB per request carrying MARKER."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no system C compiler (cc) to build the leaking LD_PRELOAD shim")
    src, lib = dest / "leak.c", dest / f"libleak{leak_mib}.so"
    src.write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", f"-DLEAK_MIB={leak_mib}", f'-DMARKER="{MARKER}"', "-o",
                    str(lib), str(src), "-ldl"], check=True, capture_output=True)
    return lib


@pytest.fixture()
def shim(tmp_path: Path) -> Path:
    return build_shim(tmp_path)


HOG_CODE = """
import mmap, sys
m = mmap.mmap(-1, int(sys.argv[1]), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
print("held", flush=True)
sys.stdin.read()
"""


def test_a_leaking_seat_outgrew_and_goes_first_under_pressure(zoo: dict, tmp_path: Path, shim: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copyfile(zoo["llama-gqa"].path, models / "leaky.gguf")
    shutil.copyfile(zoo["llama-gqa"].path, models / "healthy.gguf")
    room = 1 * GiB
    reserve = read_meminfo().available_bytes - room
    cfg = tmp_path / "f.toml"
    cfg.write_text(f"[budget]\nram_reserve = {reserve}\npressure_margin = \"128MiB\"\noutgrow_margin = \"16MiB\"\n"
                   "[server]\nsample_seconds = 0.2\n[policy]\nmin_residency_seconds = 0\nidle_unload_seconds = 0\n"
                   "eviction = \"lru\"\n")
    env = {"FITEVICT_CONFIG": str(cfg), "LD_PRELOAD": str(shim)}
    with front_door(tmp_path, "--models-dir", str(models), env=env) as door:
        base = door.base_url
        assert _chat(base, "healthy").status_code == 200
        assert _chat(base, "leaky").status_code == 200
        poll(lambda: len(history(door, event="load")) == 2, "both loads recorded", 60)
        for i in range(4):  # 4 x LEAK_MIB MiB, never freed
            assert _chat(base, "leaky", f"{MARKER} {i}").status_code == 200
        ev = poll(lambda: history(door, event="outgrew"), "the outgrew event", 60)
        assert [e["model"] for e in ev] == ["leaky"]
        d = ev[0]["details"]
        print(f"outgrew: {ev[0]['reason']}; {d}")
        assert d["device"] == "CPU" and d["over_bytes"] > 16 * MiB and d["bound_bytes"] == 16 * MiB
        assert d["reading_bytes"] - d["load_reading_bytes"] >= LEAK_MIB * MiB  # at least one leak: it fires at once
        assert d["growth_bytes_per_second"] > 0 and d["reading_bytes"] == ev[0]["bytes"]["measured"]
        views = _residents(base)
        assert views["leaky"]["outgrew"]["device"] == "CPU" and views["healthy"]["outgrew"] is None
        assert _gauge(base, "fitevict_resident_outgrowing", "leaky") == 1.0
        assert _gauge(base, "fitevict_resident_outgrowing", "healthy") == 0.0
        ps = subprocess.run([sys.executable, "-m", "fitevict.cli", "ps", "--url", base], capture_output=True,
                            text=True, timeout=120, check=True).stdout
        assert "!" in next(line for line in ps.splitlines() if "leaky" in line) and "outgrowing its price" in ps
        _after_readings(base, "leaky", 2)
        assert len(history(door, event="outgrew")) == 1  # once per seat
        # another program takes the room: the leaky seat goes first, though the healthy one was used less recently
        hog = subprocess.Popen([sys.executable, "-c", HOG_CODE, str(room + 512 * MiB)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
        try:
            assert hog.stdout is not None and hog.stdout.readline().strip() == "held"
            p = poll(lambda: history(door, event="pressure"), "a pressure event", 120)[0]
            stopped = [s["model"] for s in p["details"]["stopped"]]
            print(f"pressure: {p['reason']}; stopped {stopped}")
            assert stopped[0] == "leaky", p["details"]
            evicts = poll(lambda: [e for e in history(door, event="evict") if e["model"] == "leaky"],
                          "the leaky seat's evict", 120)
            assert "outgrowing its price" in evicts[0]["reason"]
        finally:
            if hog.stdin is not None:
                hog.stdin.close()
            hog.wait(30)
