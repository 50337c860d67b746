"""This machine, as the engine's memory rules see it: the CPU's fingerprint, the engine build, and the host buffer
table that follows from both.

A measurement, a dry run, a calibrated overhead or a crash record is true of one engine build on one CPU: the
extra host buffer types (AMX, CPU_REPACK, KleidiAI) and the kernels a native build was compiled for depend on both.
``machine_key`` names that pair; every cache and stored figure is keyed by it, so a figure taken on another machine
is never trusted as this one's.

``host_buffers`` is the table pricing uses: the engine's own answer on this machine (``llama_cpp/probe.py``, stored
under ``cache_dir()/probe``) when a probe has run, else the rule table for this CPU's flags, labelled ``rule-table``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fitevict.engines.llama_cpp.install import native_flags
from fitevict.host.cpu import Cpu, this_cpu
from fitevict.paths import cache_dir
from fitevict.pricing.hostbufs import HostBuffers, rule_table

PROBE_VERSION = 2  # the probe's cases or reading changed: a table stored by an older one is not read


def engine_build(binary: Path | str | None) -> str:
    """The engine build's identity: its install stamp's commit and variant where fitevict built it and the binary
    is still the file it installed, else the binary's path, size and modification time (a rebuilt binary, or one
    put in the place of the installed one, is another build)."""
    if binary is None:
        return "no-engine"
    b = Path(binary)
    stamp = install_stamp(b)
    if stamp is not None and stamp.get("llama_cpp_commit") and stamp_differs(b, stamp) is None:
        return f"llama.cpp-{stamp['llama_cpp_commit']}-{stamp.get('variant', 'cpu')}-{int(stamp.get('installed_at', 0))}"
    try:
        st = b.resolve().stat()
    except OSError:
        return f"missing:{b}"
    h = hashlib.sha256(f"{b.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return f"{b.name}-{h}"


def install_stamp(binary: Path) -> dict | None:
    """The install record beside ``binary`` (``engine install`` writes it), None where there is none."""
    from fitevict.engines.llama_cpp.install import STAMP  # the install record's one name

    try:
        stamp = json.loads((binary.parent / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def stamp_differs(binary: Path, stamp: dict) -> str | None:
    """How ``binary`` differs from the file its install stamp recorded (size and modification time where the stamp
    has them; else modified after the install), in words; None when it is that file."""
    try:
        st = binary.stat()
    except OSError as e:
        return f"{binary}: {e.strerror}"
    kept = stamp.get("files", {}).get(binary.name)
    if isinstance(kept, dict) and (kept.get("bytes"), kept.get("mtime_ns")) != (st.st_size, st.st_mtime_ns):
        return (f"{binary} is not the installed file: {kept.get('bytes')} bytes then, {st.st_size} now; modified "
                f"{st.st_mtime_ns / 1e9:.0f} (unix time), installed {stamp.get('installed_at', 0):.0f}")
    if kept is None and st.st_mtime > float(stamp.get("installed_at", 0)) + 1:
        return (f"{binary} was modified after its install: modified {st.st_mtime:.0f} (unix time), installed "
                f"{float(stamp.get('installed_at', 0)):.0f}, {st.st_size} bytes now")
    return None


def build_report(binary: Path) -> dict:
    """What ``fitevict engine list`` says of a binary's build: its identity now, the build its install stamp
    recorded (None: no stamp beside it, not installed by fitevict), and how the file on disk differs from it (None:
    it is the installed file)."""
    stamp = install_stamp(binary)
    recorded = None if stamp is None else {
        "commit": stamp.get("llama_cpp_commit"), "variant": stamp.get("variant", "cpu"),
        "installed_at": stamp.get("installed_at"), "version": str(stamp.get("version_output", "")).splitlines()[:1],
        "file": stamp.get("files", {}).get(binary.name)}
    return {"build": engine_build(binary), "recorded": recorded,
            "changed": stamp_differs(binary, stamp) if stamp is not None else None}


def machine_key(binary: Path | str | None = None, cpu: Cpu | None = None) -> str:
    """``<engine build>@<cpu fingerprint>``: the key every measured or cached figure is stored under."""
    return f"{engine_build(binary)}@{(cpu or this_cpu()).fingerprint}"


def probe_path(binary: Path | str, cpu: Cpu | None = None) -> Path:
    key = hashlib.sha256(machine_key(binary, cpu).encode()).hexdigest()[:20]
    return cache_dir() / "probe" / f"host-buffers-{key}-v{PROBE_VERSION}.json"


def stored_probe(binary: Path | str | None, cpu: Cpu | None = None) -> HostBuffers | None:
    """The probe's table for this engine build on this CPU, or None when it never ran here."""
    if binary is None:
        return None
    try:
        d = json.loads(probe_path(binary, cpu).read_text())
        if d.get("machine") != machine_key(binary, cpu):
            return None
        return HostBuffers.from_json(d["table"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def host_buffers(binary: Path | str | None = None) -> HostBuffers:
    """The extra host buffer table pricing uses on this machine: the probe's where it ran for ``binary`` (by
    default the engine fitevict would run), else the rule table for this CPU's flags."""
    if binary is None:
        binary = default_binary()
    return stored_probe(binary) or rule_table(this_cpu().flags, this_cpu().arch,
                                              amx_built=not native_flags(this_cpu().flags))


def default_binary() -> Path | None:
    from fitevict.engines.llama_cpp.install import resolve_binary

    return resolve_binary().path
