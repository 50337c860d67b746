"""The soak's faults, injected into the running front door's world, and its samples of the front door itself.

A fault record says what was done to what and when (``t``), the end of its window (``t_end``: when the door was seen
to have handled it), whether it was survived (handled as the docs say, the door still healthy), and how."""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from pathlib import Path

import httpx
import psutil

FAULTS = ("seat-sigkill", "seat-sigstop", "file-touch-rescan", "connection-burst")


def seats(door_pid: int) -> dict[int, str]:
    """The front door's llama-server children: pid -> the model file's stem (from its argv)."""
    out = {}
    try:
        children = psutil.Process(door_pid).children()
    except psutil.NoSuchProcess:
        return out
    for c in children:
        try:
            argv = c.cmdline()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        if any(a.endswith("llama-server") for a in argv) and "-m" in argv:
            out[c.pid] = Path(argv[argv.index("-m") + 1]).stem
    return out


def gone(pid: int) -> bool:
    """No process and no zombie left of ``pid``."""
    return not psutil.pid_exists(pid)  # a zombie still exists


def healthy(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


ENDS = ("crash", "fail", "evict", "unload", "idle-unload", "pressure")


def ended(base: str, pid: int, model: str, since: float) -> dict | None:
    """The event that ended seat ``pid`` after ``since``, if there is one yet: its ``crash`` (a serving seat), a
    ``fail`` of its model (a seat hit while it loaded), or a stop of its model that raced with the fault."""
    r = httpx.get(base + "/v1/models/history", params={"limit": 50, "since": since}, timeout=30)
    r.raise_for_status()
    return next((e for e in reversed(r.json()["data"]) if e["event"] in ENDS and (
        e["details"].get("pid") == pid if e["event"] == "crash" else e["model"] == model)), None)


def seat_state(base: str, model: str) -> str:
    """The model's resident state and requests in flight, as the door says, when the fault is injected."""
    try:
        rows = httpx.get(base + "/v1/models/residents", timeout=30).json()["data"]
    except (httpx.HTTPError, ValueError) as e:
        return f"unavailable, because {type(e).__name__}: {e}"
    row = next((x for x in rows if x.get("key") == model), None)
    return "not resident" if row is None else f"{row.get('state')}, {row.get('in_flight')} in flight"


def _until(fn, timeout: float, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := fn():
            return got
        time.sleep(step)
    return None


def seat_signal(base: str, door_pid: int, sig: signal.Signals, stall_s: float, rng: random.Random) -> dict:
    """SIGKILL or SIGSTOP one running seat, then wait for the door to reap it and record its crash."""
    running = seats(door_pid)
    if not running:
        return {"skipped": "no seat running"}
    pid = rng.choice(sorted(running))
    model = running[pid]
    state, t = seat_state(base, model), time.time()
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # it ended (an eviction, an idle unload) between the look and the signal
        return {"skipped": f"seat {model} (pid {pid}) ended before the signal"}
    end = _until(lambda: ended(base, pid, model, t - 1) if gone(pid) else None, stall_s + 60, 0.5)
    out = {"model": model, "pid": pid, "state": state, "t": t, "t_end": time.time()}
    if end is None and sig == signal.SIGSTOP and not gone(pid):
        os.kill(pid, signal.SIGCONT)  # let it go: the door did not handle it
    out["survived"] = end is not None and healthy(base)
    out["ended_as"] = end and end["event"]
    out["drained"] = bool(end and end["details"].get("draining"))  # a draining seat ends as the stop it drained for
    out["how"] = (f"seat reaped, {end['event']} recorded after {end['time'] - t:.1f} s: {end['reason'][:160]}" if end
                  else f"no end recorded for pid {pid} within {stall_s + 60:.0f} s (process gone: {gone(pid)})")
    return out


def touch_rescan(base: str, door_pid: int, models: Path, rng: random.Random) -> dict:
    """A model file's modification time moved to now, then SIGHUP (a rescan); the model still listed after it."""
    path = rng.choice(sorted(models.glob("*.gguf")))
    t = time.time()
    os.utime(path)
    os.kill(door_pid, signal.SIGHUP)

    def listed() -> bool:
        r = httpx.get(base + "/v1/models", timeout=30)
        return r.status_code == 200 and path.stem in {m["id"] for m in r.json()["data"]}

    time.sleep(1.0)  # the rescan is enqueued by the signal; nothing observable says it ran
    ok = bool(_until(listed, 30)) and healthy(base)
    return {"model": path.stem, "t": t, "t_end": time.time(), "survived": ok,
            "how": "still listed, door healthy" if ok else "not listed again within 30 s, or the door unhealthy"}


def burst(base: str, n: int) -> dict:
    """``n`` connections at once: half send ``GET /health`` and read the answer, half connect and close unsent."""
    host, port = base.rsplit("//", 1)[1].split(":")
    t, socks, answered, refused, broken = time.time(), [], 0, 0, 0
    for i in range(n):
        try:
            s = socket.create_connection((host, int(port)), timeout=10)
        except OSError:
            refused += 1
            continue
        if i % 2 == 0:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")
        socks.append((i, s))
    for i, s in socks:
        try:
            if i % 2 == 0 and s.recv(64).startswith(b"HTTP/1.1 200"):
                answered += 1
        except OSError:
            broken += 1  # reset or timed out before its answer
        finally:
            s.close()
    ok = healthy(base)
    return {"model": None, "t": t, "t_end": time.time(), "survived": ok,
            "how": f"{answered} of {(n + 1) // 2} /health answered 200 ({broken} cut), {refused} connections refused; "
                   f"door healthy after: {ok}"}


def inject(kind: str, base: str, door_pid: int, models: Path, stall_s: float, rng: random.Random) -> dict:
    if kind == "seat-sigkill":
        out = seat_signal(base, door_pid, signal.SIGKILL, stall_s, rng)
    elif kind == "seat-sigstop":
        out = seat_signal(base, door_pid, signal.SIGSTOP, stall_s, rng)
    elif kind == "file-touch-rescan":
        out = touch_rescan(base, door_pid, models, rng)
    else:
        out = burst(base, 200)
    return {"fault": kind, **out}


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_size
            except FileNotFoundError:
                continue  # removed between the listing and the stat
    return total


def sample(door_pid: int, data_dir: Path, base: str) -> dict:
    """The front door's RSS, PSS, open descriptors, threads, children (and zombies among them), the database's files
    and the data directory's size, with the load average; and what its allocators say it holds (``/health``)."""
    p = psutil.Process(door_pid)
    mem = p.memory_full_info()
    kids = p.children()
    zombies = sum(1 for c in kids if _status(c) == psutil.STATUS_ZOMBIE)
    db = sum(f.stat().st_size for f in data_dir.glob("fitevict.db*") if f.exists())
    return {"t": time.time(), "rss": mem.rss, "pss": mem.pss, "fds": p.num_fds(), "threads": p.num_threads(),
            "children": len(kids), "zombies": zombies, "seats": len(seats(door_pid)), "db_bytes": db,
            "data_bytes": _size(data_dir), "seat_logs_bytes": _size(data_dir / "seats"),
            "load1": os.getloadavg()[0], **fds_by_kind(door_pid), **_outside_malloc(mem, _held(base))}


FD_KINDS = (("fds_sockets", "socket:["), ("fds_pidfds", "anon_inode:[pidfd]"), ("fds_pipes", "pipe:["),
            ("fds_store", "fitevict.db"))  # (sample field, what its /proc/PID/fd link holds); the rest: fds_other


def fds_by_kind(pid: int) -> dict:
    """The door's open descriptors by what they are (``/proc/PID/fd`` links): sockets, pidfds, pipes, the store's
    files (the database, its -wal and -shm, per pooled connection) and the rest; nothing when they cannot be read."""
    out = {k: 0 for k, _ in FD_KINDS} | {"fds_other": 0}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return {}
    for name in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed between the listing and the read
        key = next((k for k, mark in FD_KINDS if mark in link), "fds_other")
        out[key] += 1
    return out


def _outside_malloc(mem, held: dict) -> dict:
    """``held`` with the door's resident anonymous memory that malloc's heaps do not hold (RSS less its file pages
    and malloc's heaps): Python's own small-object arenas and the threads' stacks."""
    if "malloc_heaps" in held:
        held["outside_malloc"] = mem.rss - mem.shared - held["malloc_heaps"]
    return held


def _held(base: str) -> dict:
    """malloc's bytes in use, free inside its heaps and mapped apart, SQLite's bytes (part of malloc's in use) and
    Python's allocated blocks, as the door reports them; a reading that failed is left out of the sample (its
    series skip it) with why."""
    try:
        held = httpx.get(base + "/health", timeout=10).json()["heap"]["held"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        return {"held_unavailable": f"{type(e).__name__}: {e}"}
    malloc = held.get("malloc")
    out = {"python_blocks": held.get("python_blocks")}
    if isinstance(malloc, dict):
        out |= {"malloc_in_use": malloc["in_use_bytes"], "malloc_free": malloc["free_bytes"],
                "malloc_mapped_apart": malloc["mapped_apart_bytes"],
                "malloc_heaps": malloc["heaps_bytes"] + malloc["mapped_apart_bytes"]}
    if isinstance(held.get("sqlite"), dict):
        out["sqlite_in_use"] = held["sqlite"]["in_use_bytes"]
    return out


def _status(p: psutil.Process) -> str:
    try:
        return p.status()
    except psutil.NoSuchProcess:
        return "gone"
