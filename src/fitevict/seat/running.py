"""One seat's engine process: one way to start it, one way to stop it. Its state is its seat's, in the seat table.

A seat runs in its own process group (``start_new_session``) and dies with fitevict (PR_SET_PDEATHSIG).
Its life is ``schedule.seats``'s: starting, loading, ready, draining, stopping, gone. Every stop goes the same way:
SIGTERM the group, wait the grace period, SIGKILL the group (``engines.process.stop_process_group``),
then the caller verifies that the memory came back (``release``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fitevict.engines.base import LaunchSpec
from fitevict.engines.process import Child, start_child
from fitevict.engines.upstream import health_status
from fitevict.host import oomkill, procmem
from fitevict.pricing.footprint import HOST, Footprint
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.request.catalog import CatalogEntry
from fitevict.schedule.seats import Seat, SeatStatus
from fitevict.schedule.errors import LoadFailed
from fitevict.seat.timings import EngineTimings

if TYPE_CHECKING:
    from fitevict.seat.crash import RepackCrash

@dataclass(eq=False)
class SeatState:
    """The running half of a seat: its engine process and what was read of it. The seat itself (key, configuration,
    state, readiness, pinning) is its record in the seat table (``seat``, a ``schedule.seats.Seat``): read here
    through properties, never copied. Mutable, owned by the supervisor's event loop."""

    id: str
    seat: Seat
    entry: CatalogEntry
    engine: str
    model_path: Path
    port: int
    log_path: Path
    started_at: float
    predicted: Footprint
    signature: str
    strategy: str
    split: str = ""  # where its split over several GPUs came from (the plan's words); "" on one device
    proc: Child | None = None
    pid: int | None = None
    pgid: int | None = None
    overhead: int | None = None  # the engine process's own host memory beyond its buffers (None: not known)
    gpu_overhead: dict[str, int] = field(default_factory=dict)  # the same per GPU (CUDA context), learned here
    overhead_label: str = ""  # what ``overhead`` is and where it came from (``overhead_source`` in its figures)
    measured: Footprint | None = None
    measured_note: str = ""
    host_mem: procmem.ProcessMemory | None = None  # the latest reading of its process tree (the sampler's)
    gpu_bytes: dict[str, int] = field(default_factory=dict)  # the latest reading per device (host.devmem, by kind)
    device_read: dict[str, str] = field(default_factory=dict)  # per device: that reading's source, or why none
    shared: tuple[str, ...] = ()  # its devices whose memory is host memory: their buffers are in its PSS
    touched: tuple[str, ...] = ()  # its devices read as pages touched so far (an rpc-server's PSS): they grow
    read_at: float | None = None  # when ``host_mem`` and ``gpu_bytes`` were read
    readings: int = 0  # readings of it so far: the one after its load and every sampler tick's
    load_mem: procmem.ProcessMemory | None = None  # the reading right after its load (what the load record keeps)
    load_bytes: dict[str, int] = field(default_factory=dict)  # that reading per device, and when it was taken:
    load_read_at: float | None = None  # the start of its growth rate
    load_own_pss: int = 0  # at that reading, its share (PSS) of its binary's shared pages (``Seat.pages``)
    outgrew: dict | None = None  # once a reading exceeded its price by more than budget.outgrow_margin: the figures
    predicted_overhead: int | None = None  # the engine overhead included in ``predicted`` (transformers seats)
    expected_exit: bool = False
    killed_for: str | None = None  # why the stuck-seat watch killed it (seat.frozen.watch_frozen)
    told_by: str | None = None  # what that watch saw of a SIGTERM or SIGINT whose handler never returned
    watcher: asyncio.Task | None = None
    timings: EngineTimings = field(default_factory=EngineTimings)  # the engine's own, summed over its answers
    # set when a request it served ended: a new seat is read after its first answer, not while the engine works on it
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    peak_bytes: dict[str, int] = field(default_factory=dict)  # the largest reading per device over its life
    slot_freed: bool = False  # the scheduler was told this seat is gone when its processes exited
    shrunk_from: dict | None = None  # policy.shrink_ctx loaded this seat for a larger asked context: what and why
    kv_candidates: list = field(default_factory=list)  # kvkeep.SavedPrompt of this signature, not yet tried
    kv_checks: int = 0  # requests compared with the saved prompts so far
    file_at_start: tuple[int, int] | None = None  # its model file's (size, inode) when its process started
    kernel_seen: oomkill.Seen | None = None  # host.oomkill.Seen: its start and memory cgroup when last looked at
    repack_crash: RepackCrash | None = None  # crash.RepackCrash: this seat is the -nr retry of a load that crashed with repacking

    @property
    def key(self) -> str:
        return self.seat.key

    @property
    def config(self) -> LoadConfig:
        return self.seat.config

    @property
    def state(self) -> SeatStatus:
        """The seat's one state (``schedule.seats.SeatStatus``)."""
        return self.seat.status

    @property
    def ready_at(self) -> float | None:
        return self.seat.ready_at

    @property
    def load_seconds(self) -> float | None:
        """Seconds from spawn to healthy (the scheduler's reload cost)."""
        return self.seat.reload_seconds

    @property
    def pinned(self) -> bool:
        return self.seat.pinned

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def bytes_on(self, device: str, carried: int = 0) -> int:
        """What the planner counts for this seat on ``device``: the latest reading and the engine's buffers where we
        have them; until the reading after its load, never less than its price (a loading seat has touched only part
        of what it will hold). ``carried``: the bytes of its binary's shared pages it carries (``pricing.pages``),
        added to its price and its buffers; a reading holds its own share of them already."""
        held = self._held_on(device, carried)
        return max(held, self.predicted.bytes_on(device) + carried) if self.load_read_at is None else held

    def _held_on(self, device: str, carried: int = 0) -> int:
        if device == HOST:
            # The engine's own buffers (from its log) are what the seat grows to as its context fills;
            # PSS is what it touches now plus the process itself. Both are measurements of different
            # things (reachable vs touched), so the planner counts the one that can grow to: the larger.
            pss = self.host_mem.host_bytes if self.host_mem is not None else None
            if pss is not None and self.shared:  # a unified device's buffers are in the PSS: counted there, once
                pss = max(0, pss - sum(self._held_on(d) for d in self.shared))
            logged = (self.measured.bytes_on(HOST) + self._known_overhead(HOST) + carried
                      if self.measured is not None else None)
            if pss is None and logged is None:
                return self.predicted.bytes_on(HOST) + carried
            return max(pss or 0, logged or 0)
        if self.measured is not None and self.measured.device(device) is not None:
            reach = self.measured.bytes_on(device) + self._known_overhead(device)
        else:
            reach = self.predicted.bytes_on(device)
        if device in self.gpu_bytes:
            # a reading of touched pages (an rpc-server's PSS) is what the seat holds now, its buffers what it grows
            # to as its context fills: as on the host, the planner counts the one it can grow to
            return max(self.gpu_bytes[device], reach) if device in self.touched else self.gpu_bytes[device]
        return reach

    def overhead_on(self, device: str) -> int | None:
        """The engine process's own memory on ``device`` beyond its buffers, as this machine learned it; None when
        it was never learned (``overhead_source`` says why)."""
        return self.overhead if device == HOST else self.gpu_overhead.get(device)

    def _known_overhead(self, device: str) -> int:
        """What the planner adds to the engine's buffers: the overhead where it is known; where it never was, it
        adds nothing it knows of (the figures say "unavailable", never 0)."""
        n = self.overhead_on(device)
        return n if n is not None else 0

    def overhead_source(self, device: str) -> str:
        """What ``overhead_on(device)`` is and where it came from."""
        if device == HOST:
            return self.overhead_label or "unavailable, because the seat was not made ready yet"
        if device in self.gpu_overhead:
            return ("stored-measurement: the engine process's own on this GPU (NVML process bytes minus its "
                    "buffers), learned by earlier loads on this machine")
        return (f"unavailable, because no engine overhead was learned for {device} on this machine yet: the planner "
                "counts the engine's buffers alone there")

    def source_on(self, device: str) -> str:
        """What ``bytes_on`` counts: "planned" where it is the larger of a reading of the process and the engine's
        buffers + overhead, "measured" where only a reading (PSS, NVML) counts, "engine-reported" where only the
        engine's buffers do, else the prediction's sources."""
        if device == HOST:
            read = self.host_mem is not None and self.host_mem.host_bytes is not None
            if read and self.measured is not None:
                return "planned"
            if read:
                return "measured"
            return "engine-reported" if self.measured is not None else pred_source(self.predicted, HOST)
        if device in self.gpu_bytes:
            return "planned" if device in self.touched else "measured"
        if self.measured is not None and self.measured.device(device):
            return "engine-reported"
        return pred_source(self.predicted, device)

    def figures(self, device: str, now: float | None = None, carried: int = 0) -> dict:
        """The seat's figures on ``device``, each named for what it is: ``predicted`` (the price, with its sources),
        ``allocated`` (engine-reported buffers, with the process overhead apart), ``measured`` (PSS of its process
        tree, or NVML: the latest reading, with its time and age at ``now``), ``measured_peak`` (the highest of every
        reading over its life) and ``planned`` (what the planner counts: the larger of allocated + overhead and
        measured, with the ``carried`` bytes of its binary's shared pages on the host when it carries them). A figure
        not read is None, with why."""
        alloc = self.measured.bytes_on(device) if self.measured is not None and (
            device == HOST or self.measured.device(device) is not None) else None
        if device == HOST:
            live = self.host_mem.host_bytes if self.host_mem is not None else None
            how = "PSS of the process tree (/proc/PID/smaps_rollup)"
            why_not = (self.host_mem.reason if self.host_mem is not None and self.host_mem.reason
                       else "the process was not read yet")
        else:
            live = self.gpu_bytes.get(device)
            how = self.device_read.get(device, "the device reader").removeprefix("measured: ")
            why_not = self.device_read.get(device, "no reading of the device yet").removeprefix("unavailable, because ")
            if device in self.shared:
                why_not = (f"{device}'s memory is host memory: its buffers are in the PSS, counted once there "
                           "(the allocated figure stands for the device)")
        return {
            "predicted_bytes": self.predicted.bytes_on(device), "predicted_source": pred_source(self.predicted, device),
            "allocated_bytes": alloc,
            "allocated_source": ("engine-reported: its buffers (load log, to 0.01 MiB)" if alloc is not None else
                                 f"unavailable, because {self.measured_note or 'the load log was not read yet'}"),
            "overhead_bytes": self.overhead_on(device),
            "overhead_source": self.overhead_source(device),
            "measured_bytes": live,
            "measured_source": (f"measured: {how}, the latest of {self.readings} readings (the memory sampler reads "
                                "every server.sample_seconds)" if live is not None
                                else f"unavailable, because {why_not}"),
            "measured_at": self.read_at if live is not None else None,
            "measured_age_seconds": (max(0.0, now - self.read_at) if live is not None and now is not None
                                     and self.read_at is not None else None),
            "measured_peak_bytes": self.peak_bytes.get(device),
            "measured_peak_source": ("measured: the highest of every reading over its life"
                                     if device in self.peak_bytes else f"unavailable, because {why_not}"),
            "planned_bytes": self.bytes_on(device, carried if device == HOST else 0),
            "planned_source": ("planned: the larger of allocated + overhead and measured (the latest reading)"
                               if alloc is not None or live is not None else
                               "planned: the prediction, nothing read yet")
                              + (", with the binary's shared pages it carries" if carried and device == HOST else ""),
            **({"shared_pages_bytes": carried, "shared_pages_source": self._pages_source(carried)}
               if device == HOST and self.seat.pages is not None else {}),
        }

    def _pages_source(self, carried: int) -> str:
        """What its binary's shared pages are to this seat: carried (the first seat of the binary) or not."""
        pages = self.seat.pages
        assert pages is not None
        if carried:
            return (f"planned: it carries {pages.group}'s own file pages for every seat of the binary (the first "
                    f"placed of them; {pages.source})")
        return f"planned: another seat of {pages.group} carries the binary's own file pages; it counts none of them"

    def observe(self, device: str, n: int | None) -> None:
        """A reading of ``device`` (PSS or NVML): the peak over the seat's life follows it."""
        if n is not None and n > self.peak_bytes.get(device, -1):
            self.peak_bytes[device] = n

    def take_reading(self, now: float, mem: procmem.ProcessMemory | None, gpu: Mapping[str, int | None]) -> None:
        """A reading of its process tree (PSS) and its GPUs (NVML): what ``measured`` shows and ``bytes_on`` counts
        from now on; the peaks follow every reading. A failed reading is kept with its reason (never 0)."""
        if mem is not None:
            self.host_mem = mem
            self.observe(HOST, mem.host_bytes)
        for dev, n in gpu.items():
            if n is not None and dev in self.config.devices:
                self.gpu_bytes[dev] = n
                self.observe(dev, n)
        self.read_at, self.readings = now, self.readings + 1

    def load_reading(self, now: float, mem: procmem.ProcessMemory | None, gpu: Mapping[str, int | None]) -> None:
        """The reading right after its load (``take_reading``), kept apart: what the load record stores and where its
        growth rate starts."""
        self.take_reading(now, mem, gpu)
        self.load_mem, self.load_read_at, self.load_bytes = mem, now, self.live_bytes()

    def live_bytes(self) -> dict[str, int]:
        """The latest reading per device (host PSS, GPU NVML), where one was read."""
        host = self.host_mem.host_bytes if self.host_mem is not None else None
        return {**({HOST: host} if host is not None else {}), **self.gpu_bytes}

    @property
    def outgrowing(self) -> bool:
        """Its reading exceeded its price by more than budget.outgrow_margin (``outgrew`` says by how much)."""
        return self.outgrew is not None

    def held(self, carried: int = 0) -> tuple[dict[str, int], str]:
        """What the planner counts for this seat now, per device (``bytes_on``), and where the host figure came
        from, when it carries ``carried`` bytes of its binary's shared pages: its seat record reads this
        (``schedule.seats.Holds``)."""
        return ({HOST: self.bytes_on(HOST, carried), **{d: self.bytes_on(d) for d in self.config.devices}},
                self.source_on(HOST))

    def held_bytes(self) -> dict[str, int | None]:
        """What a stop should give back, per device: committed host memory and GPU bytes, as measured."""
        return {HOST: self.host_mem.committed_bytes if self.host_mem is not None else None,
                **{d: self.gpu_bytes.get(d) for d in self.config.devices if d not in self.shared}}


def pred_source(fp: Footprint, device: str) -> str:
    """The source of a predicted figure on ``device`` (several sources joined with '+')."""
    if device == HOST:
        return fp.host_source
    d = fp.device(device)
    if d is None:
        return "formula"
    sources = {d.model.label, d.context.label, d.compute.label, d.output.label}
    return sources.pop() if len(sources) == 1 else "+".join(sorted(sources))


def log_text(path: Path, since: int = 0) -> str:
    """A seat's log as text (from byte ``since`` on: what it wrote after that point, ``log_size``); empty when it
    cannot be read (removed by hand while the seat ran, say), so that what the log would have told is unavailable and
    never stops the seat's load or stop."""
    try:
        with path.open("rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def log_size(path: Path) -> int:
    """How many bytes a seat's log holds now (0 when it cannot be read): where what it writes next begins."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def log_tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(log unavailable: {e})"
    return "\n".join(lines[-n:])


async def spawn(seat: SeatState, spec: LaunchSpec) -> None:
    """Start the engine process (own process group, own log file)."""
    seat.file_at_start = _file_now(seat.model_path)
    with seat.log_path.open("wb") as log:
        seat.proc = start_child(spec.argv, stdout=log, env=dict(spec.env))
    seat.pid = seat.pgid = seat.proc.pid


def _file_now(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_ino


def file_changed(seat: SeatState) -> str | None:
    """What happened to the seat's model file since its process started, in words (truncated, grown, replaced by
    another file, gone); None when it is the same (or was never read). A seat that maps a file cut short dies of
    SIGBUS at its next read of the lost part."""
    if seat.file_at_start is None or seat.model_path.is_dir():
        return None
    then, now = seat.file_at_start, _file_now(seat.model_path)
    if now == then:
        return None
    if now is None:
        return f"its model file {seat.model_path} is gone since the seat started"
    if now[1] != then[1]:
        return (f"its model file {seat.model_path} was replaced by another file since the seat started ({then[0]} "
                f"bytes then, {now[0]} now)")
    how = "truncated" if now[0] < then[0] else "grown"
    return f"its model file {seat.model_path} was {how} since the seat started ({then[0]} bytes then, {now[0]} now)"


def _stopped(pid: int | None) -> str:
    """Why a stalled load made no progress, when its process says: stopped by a signal (SIGSTOP, SIGTSTP), not
    working slowly."""
    state = procmem.process_state(pid) if pid is not None else None
    if state in ("T", "t"):
        return f"; its process (pid {pid}) was stopped by a signal (state {state}), not loading"
    return ""


def load_advanced(before: tuple[int | None, int | None] | None, now: tuple[int | None, int | None]) -> bool:
    """A loading process advanced between two readings of (its CPU ticks, its tree's resident bytes): it used CPU
    time, or paged more of itself in. Not its PSS: a process's PSS moves whenever another maps or unmaps a file it
    maps, and every seat maps the engine's libraries, so a stopped seat's PSS kept moving while others came and went.
    Pure."""
    if before is None:
        return False
    (ticks0, rss0), (ticks1, rss1) = before, now
    return (ticks1 is not None and ticks0 is not None and ticks1 != ticks0) or \
        (rss1 is not None and rss0 is not None and rss1 > rss0)


async def wait_ready(seat: SeatState, *, clock: Callable[[], float], health_timeout: float, stall_seconds: float,
                     health_path: str = "/health") -> None:
    """Wait until the engine answers ``health_path`` with 200. Probes are raw (no client object to build) and
    tight: every 5 ms for the first 2 s, then every 50 ms, so readiness is seen as soon as it happens. Fails when
    the process exits, when it uses no CPU time and pages nothing in for ``stall_seconds`` while not healthy
    (``load_advanced``, read every 100 ms with what the kernel says of it: ``seat.kernel_seen``), or at
    ``health_timeout``."""
    assert seat.proc is not None
    t0 = clock()
    exited = asyncio.ensure_future(seat.proc.wait())
    try:
        await _poll_ready(seat, exited, clock, t0, health_timeout, stall_seconds, health_path)
    finally:
        if not exited.done():
            exited.cancel()


async def _poll_ready(seat: SeatState, exited: asyncio.Future, clock: Callable[[], float], t0: float,
                      health_timeout: float, stall_seconds: float, health_path: str) -> None:
    assert seat.proc is not None
    last: tuple[int | None, int | None] | None = None
    last_progress, last_read = t0, t0 - 0.1  # the first look at once: a process killed early is known to the kernel
    while True:
        if seat.proc.returncode is not None:
            raise LoadFailed(f"{seat.key}: {seat.engine} exited with code {seat.proc.returncode} while loading "
                             f"{seat.model_path.name}; log {seat.log_path}:\n{log_tail(seat.log_path)}")
        if await health_status(seat.port, health_path) == 200:
            return
        now = clock()
        if now - last_read >= 0.1 and seat.pid is not None:
            last_read = now
            seat.kernel_seen = oomkill.follow(seat.pid, seat.kernel_seen)  # a SIGKILL before ready: the OOM killer's?
            mark = (procmem.cpu_ticks(seat.pid), procmem.tree_rss_bytes(seat.pid))  # counters: no page walk
            if load_advanced(last, mark):
                last_progress = now
            last = mark
        if now - last_progress > stall_seconds:
            raise LoadFailed(f"{seat.key}: load stalled: no CPU time used and no memory paged in for {stall_seconds:g} s "
                             f"(engine.stall_seconds) and {health_path} not ready{_stopped(seat.pid)}; "
                             f"log {seat.log_path}:\n{log_tail(seat.log_path)}")
        if now - t0 > health_timeout:
            raise LoadFailed(f"{seat.key}: not healthy within engine.health_timeout_seconds={health_timeout:g}; "
                             f"log {seat.log_path}:\n{log_tail(seat.log_path)}")
        # wakes at once if the process exits; asyncio.wait (unlike wait_for) never swallows a cancellation
        await asyncio.wait({exited}, timeout=0.005 if now - t0 < 2.0 else 0.05)
