"""Verify that memory came back after a stop: every stop, whatever ended the seat.

Host: the fall in AnonPages + Shmem (MemTotal - AnonPages - Shmem rises), the committed memory every
process holds. MemAvailable is recorded beside it but does not decide: on some kernels (virtio-balloon
free page reporting, for one) freed pages reach MemFree seconds later or not at all, while AnonPages
drops the moment the process's memory is unmapped. A device: its reader's free memory (``host.devmem``: NVML free;
an RPC device's engine-reported total less its rpc-server's PSS, so the rpc-server's memory back is the release). A
unified device is not verified apart: its buffers were host memory, verified with the host.

These counters are the whole machine's: another program that takes or gives back memory while a seat stops moves
them too. So a release is judged only on the devices where the seat held bytes, and when the rise falls short,
what the other programs took meanwhile is read (``others_now``) and named beside the seat's own figure, never
counted as the seat's.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fitevict.phase import mark
from fitevict.engines.process import Child, GroupStop, group_alive, stop_process_group
from fitevict.host import procmem
from fitevict.host.devmem import DeviceMeters
from fitevict.host.nvml import read_gpus
from fitevict.pricing.footprint import HOST
from fitevict.units import MiB, format_size

RELEASE_FRACTION = 0.9
RELEASE_SLACK = 4 * MiB
FREED_SOURCE = "measured: /proc/meminfo AnonPages+Shmem fall (host), each device's reader: NVML free, rpc-server PSS"
OTHERS_SOURCE = ("measured: RssAnon+RssShmem summed over every readable process outside the seat's group "
                 "(/proc/PID/status, host); NVML usedGpuMemory of the other compute processes (GPU)")


@dataclass(frozen=True, slots=True)
class Release:
    verified: bool
    final: bool  # no point polling again (verified, unverifiable, or timed out)
    freed_bytes: int | None  # host: the fall in AnonPages+Shmem (measured); None when others took more
    freed_by_device: dict[str, int]  # the rise in memory no process holds, per device (the whole machine's)
    release_seconds: float | None
    note: str
    others_by_device: dict[str, int] | None = None  # what other programs took meanwhile (None: not read)


@dataclass(frozen=True, slots=True)
class StopResult:
    """One stop, as measured: how long the process took to exit, and whether its memory came back."""

    key: str
    held: Mapping[str, int | None]
    freed_bytes: int | None
    freed_by_device: Mapping[str, int]
    exit_seconds: float
    release_seconds: float | None
    verified: bool
    note: str
    exit_code: int | None = None  # the process's own, as the stop read it (None: not a child of this fitevict)
    ended: str = "unknown"  # how it ended during the stop, in one word (``stop_account``)
    ended_note: str = ""  # the same in words
    others_by_device: Mapping[str, int] | None = None  # what other programs took during the release (measured)

    def details(self) -> dict[str, Any]:
        return {"others_took_bytes": None if self.others_by_device is None else dict(self.others_by_device),
                "others_source": OTHERS_SOURCE if self.others_by_device is not None else None,
                "stop_exit_code": self.exit_code, "stop_ended": self.ended, "stop_ended_note": self.ended_note,
                "release_verified": self.verified, "exit_seconds": self.exit_seconds,
                "release_seconds": self.release_seconds, "held_committed_bytes": self.held.get(HOST),
                "held_bytes": dict(self.held), "freed_by_device": dict(self.freed_by_device),
                "release_note": self.note, "mem_available_delta_bytes": self.freed_by_device.get("MemAvailable"),
                "freed_source": FREED_SOURCE}


def stop_account(code: int | None, stop: GroupStop, grace: float) -> tuple[str, str]:
    """How a process ended during its stop (``stop``: what ``stop_process_group`` saw; ``code``: its exit code, None
    when it is not our child), as one word and in words: ``sigterm`` (it exited on the stop's SIGTERM), ``sigkill``
    (it outlived the grace, and the stop's SIGKILL ended it), ``frozen`` (stopped by a signal when the grace ran out,
    so it never ran its SIGTERM: the stop's SIGKILL ended it), ``killed`` (SIGKILL from another sender during the
    grace: the kernel's OOM killer, or another program), ``signal`` (another signal during the grace: a crash while it
    shut down), ``exited`` (it had exited before the stop), ``unknown`` (not our child: no exit code). Pure."""
    if code is None:
        return "unknown", "not a child of this fitevict: its exit code is unknown"
    if stop.exited_before:
        return "exited", f"it had already exited (exit code {code}) before the stop"
    if stop.killed:
        if stop.state_at_kill in ("T", "t"):
            return "frozen", (f"it was stopped by a signal (state {stop.state_at_kill}) when the stop's grace of "
                              f"{grace:g} s (engine.stop_grace_seconds) ran out, so it never ran its SIGTERM: "
                              f"killed by the stop's SIGKILL (exit code {code})")
        return "sigkill", (f"it did not exit within the stop's grace of {grace:g} s (engine.stop_grace_seconds, state "
                           f"{stop.state_at_kill}): killed by the stop's SIGKILL (exit code {code})")
    if code >= 0 or -code == signal.SIGTERM:
        return "sigterm", f"it exited on the stop's SIGTERM (exit code {code})"
    name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
    if -code == signal.SIGKILL:
        return "killed", (f"it ended by signal {-code} ({name}) during the stop, within its grace: not the stop's (it "
                          "had sent SIGTERM only), but the kernel's OOM killer or another program")
    return "signal", (f"it ended by signal {-code} ({name}) during the stop, within its grace: not the stop's SIGTERM "
                      "(a crash while it shut down)")


def release_check(held: Mapping[str, int | None], before: Mapping[str, int], now: Mapping[str, int], *,
                  elapsed: float, timed_out: bool, others: Mapping[str, int] | None = None) -> Release:
    """Has the memory a stopped seat held come back? Pure: compares "not held by any process" before and now.

    ``before``/``now`` map a device to bytes no process holds (host: MemTotal - AnonPages - Shmem;
    GPU: NVML free); extra keys (MemAvailable) are reported, not checked. A device where the seat held 0 B is not
    judged: nothing of the seat's can come back there. Other processes move these counters too: ``others`` maps a
    device to the bytes other programs took between the two readings (measured; negative when they gave some back),
    and the seat's own return is the rise plus what they took. A device counts as released when the seat's return
    is at least 90% of what it held, less 4 MiB. A figure the seat never had measured cannot be verified: the
    release is then reported unverified with that reason, never as verified.
    """
    freed = {d: now[d] - before[d] for d in before if d in now}
    took = dict(others or {})
    seat = {d: f + took.get(d, 0) for d, f in freed.items()}
    # A fall in free memory with nothing else read means others took more than the seat gave back: its share is
    # unknown.
    host_freed = seat.get(HOST) if seat.get(HOST, -1) >= 0 else None
    judged = {d: h for d, h in held.items() if h != 0}
    unknown = [d for d, h in judged.items() if h is None or d not in freed]
    if unknown:
        return Release(False, True, host_freed, freed, None,
                       f"unverified: held memory on {', '.join(unknown)} was never measured", others)
    short = [d for d, h in judged.items() if h is not None and seat[d] < max(0, int(h * RELEASE_FRACTION) - RELEASE_SLACK)]
    words = "; ".join([_device_words(d, h, seat[d], took.get(d)) for d, h in judged.items() if h is not None]
                      + [f"{d}: held nothing, not judged" for d, h in held.items() if h == 0])
    if not short:
        return Release(True, True, host_freed, freed, elapsed, words, others)
    if timed_out:
        return Release(False, True, host_freed, freed, None, f"not released within the timeout: {words}", others)
    return Release(False, False, host_freed, freed, None, words, others)


def _device_words(device: str, held: int, seat_freed: int, others_took: int | None) -> str:
    """One device's release in words: the seat's return of what it held, and what other programs did meanwhile."""
    words = f"{device}: {format_size(seat_freed)} came back of {format_size(held)} held"
    if others_took:
        verb = "took" if others_took > 0 else "gave back"
        words += f" (other programs {verb} {format_size(abs(others_took))} meanwhile, not counted as the seat's)"
    return words


def others_now(devices: Sequence[str], seat_pids: frozenset[int], nvml: Any = None) -> dict[str, int]:
    """What every other program holds on each device right now (see ``OTHERS_SOURCE``). A process whose memory
    cannot be read (another user's, a kernel thread, gone) is left out of both readings alike; a GPU whose processes
    NVML cannot attribute is left out (its drift is then not read, never taken as 0)."""
    host = 0
    for entry in os.scandir(procmem.PROC):
        if entry.name.isdigit() and int(entry.name) not in seat_pids:
            held = procmem.anon_status_bytes(entry.name)
            if held is not None:
                host += held
    out = {HOST: host}
    if devices:
        gpus = read_gpus(DeviceMeters.of(nvml).nvml)  # NVML attributes a GPU's memory per process; other kinds not
        for d in devices:
            g = gpus.device(d)
            if g is not None and not g.processes_reason and all(p.used_bytes is not None for p in g.processes):
                out[d] = sum(p.used_bytes for p in g.processes if p.used_bytes is not None and p.pid not in seat_pids)
    return out


def free_now(devices: Sequence[str], nvml: Any = None) -> dict[str, int]:
    """Bytes not held by any process, as the kernel and each device's reader count them (see the module doc; ``nvml``:
    the ``host.devmem.DeviceMeters``, or an NVML-like alone). A device whose free memory cannot be read is left out:
    its release is then unverified, with that said."""
    mem = procmem.read_meminfo()
    host = mem.total_bytes - mem.committed_bytes if mem.committed_bytes is not None else mem.available_bytes
    free = {HOST: host, "MemAvailable": mem.available_bytes}
    if devices:
        for d, r in DeviceMeters.of(nvml).free(devices).items():
            if r.bytes is not None:
                free[d] = r.bytes
    return free


async def verify_release(before: Mapping[str, int], held: Mapping[str, int | None], devices: Sequence[str], *,
                         nvml: Any, timeout: float, clock: Callable[[], float],
                         others_before: Mapping[str, int] | None = None,
                         seat_pids: frozenset[int] = frozenset()) -> Release:
    """Poll until the memory the seat held is back on every device, or ``timeout`` passes. While the rise falls
    short and ``others_before`` was read, what other programs took since is read too and given to the check."""
    t0 = clock()
    while True:
        elapsed = clock() - t0
        now = free_now(devices, nvml)
        r = release_check(held, before, now, elapsed=elapsed, timed_out=elapsed > timeout)
        if not r.verified and others_before is not None:
            after = others_now(devices, seat_pids, nvml)
            took = {d: after[d] - others_before[d] for d in others_before if d in after}
            r = release_check(held, before, now, elapsed=elapsed, timed_out=elapsed > timeout, others=took)
        if r.verified or r.final:
            return r
        await asyncio.sleep(0.02)  # polling kernel and driver counters: there is no event to await


@dataclass(frozen=True, slots=True)
class BeforeStop:
    """What is read just before a seat's stop, at one moment (``read_before_stop``): what the seat holds, its pids,
    what every other program holds, and the memory no process holds. Whatever the seat takes or frees between this
    reading and its exit is in both its figure and the free memory's rise alike, so the reading may be taken while
    the seat still works (its prompts saved), as long as it is taken before its SIGTERM."""

    tree: procmem.ProcessMemory | None  # None: no process group to read
    held: dict[str, int | None]
    seat_pids: frozenset[int]
    others: dict[str, int] | None  # None: the seat's host memory could not be read, so nothing to correct
    free: dict[str, int]


def read_before_stop(pgid: int | None, devices: Sequence[str], *, nvml: Any,
                     gpu_held: Mapping[str, int | None] | None = None) -> BeforeStop:
    """The reading a stop's release is verified against (``BeforeStop``). Blocking (/proc, NVML): run it off the
    event loop."""
    tree = procmem.read_tree(pgid) if pgid is not None else None
    host_held = tree.committed_bytes if tree is not None and tree.source != "unavailable" else None
    held: dict[str, int | None] = {HOST: host_held, **{d: (gpu_held or {}).get(d) for d in devices}}
    seat_pids = frozenset(tree.pids) if tree is not None else frozenset()
    others = others_now(devices, seat_pids, nvml) if host_held is not None else None
    return BeforeStop(tree, held, seat_pids, others, free_now(devices, nvml))


async def stop_and_verify(key: str, pgid: int | None, devices: Sequence[str], *,
                          proc: Child | None, grace: float, release_timeout: float,
                          nvml: Any, clock: Callable[[], float],
                          gpu_held: Mapping[str, int | None] | None = None,
                          on_exit: Callable[[], None] | None = None,
                          before: Awaitable[BeforeStop] | None = None) -> StopResult:
    """The one stop path: what the seat holds and the free memory read just before (``before``: that reading, begun
    earlier off the event loop, awaited here; else read now, off the loop too), the group stopped (SIGTERM, grace,
    SIGKILL), how its process ended during the stop read (``stop_account``: a kill or a freeze by someone else is
    said), the release verified. A seat that already exited on its own (a crash) has nothing left to read: no
    process of the group remaining is all that can be said, and its release is unverified (freed bytes and release
    seconds unavailable, the reason named), never "verified" with nothing measured. ``on_exit`` is called once the
    group has exited, before the release is verified (which may take up to ``release_timeout``)."""
    read = await (before if before is not None else
                  asyncio.to_thread(read_before_stop, pgid, devices, nvml=nvml, gpu_held=gpu_held))
    tree, held = read.tree, read.held
    mark(key, "read before the stop")
    stop = await stop_process_group(pgid, grace, proc=proc, clock=clock)
    mark(key, "exited")
    exit_s = stop.seconds
    stop_code = proc.returncode if proc is not None else None
    how = stop_account(stop_code, stop, grace)
    if on_exit is not None:  # the group is gone: what it held is the kernel's again, verified or not
        on_exit()
    if held[HOST] is None:
        gone = pgid is None or not group_alive(pgid)
        why = ("the process tree could not be read before the stop"
               + (f" ({tree.reason})" if tree is not None and tree.reason else " (it had already exited)"))
        note = (f"unverified: {why}; no process of the group remains, but what it held was never measured, so "
                "the freed bytes and the release time are unavailable" if gone
                else f"unverified: {why}, and the group is still alive")
        return StopResult(key, held, None, {}, exit_s, None, False, note, stop_code, *how)
    r = await verify_release(read.free, held, devices, nvml=nvml, timeout=release_timeout, clock=clock,
                             others_before=read.others, seat_pids=read.seat_pids)
    return StopResult(key, held, r.freed_bytes, r.freed_by_device, exit_s, r.release_seconds, r.verified, r.note,
                      stop_code, *how, others_by_device=r.others_by_device)
