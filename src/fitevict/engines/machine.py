"""This machine, as the engine's memory rules see it: the CPU's fingerprint, the engine build, and the host buffer
table that follows from both.

A measurement, a dry run, a calibrated overhead or a crash record is true of one engine build on one CPU: the
extra host buffer types (AMX, CPU_REPACK, KleidiAI) and the kernels a native build was compiled for depend on both.
``machine_key`` names that pair; every cache and stored figure is keyed by it, so a figure taken on another machine
is never trusted as this one's.

``host_buffers`` is the table pricing uses: the engine's own answer on this machine (``engines/probe.py``, stored
under ``cache_dir()/probe``) when a probe has run, else the rule table for this CPU's flags, labelled ``rule-table``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fitevict.host.cpu import Cpu, this_cpu
from fitevict.paths import cache_dir
from fitevict.pricing.hostbufs import HostBuffers, rule_table

PROBE_VERSION = 2  # the probe's cases or reading changed: a table stored by an older one is not read


def engine_build(binary: Path | str | None) -> str:
    """The engine build's identity: its install stamp's commit and variant where fitevict built it, else the
    binary's path, size and modification time (a rebuilt binary is another build)."""
    if binary is None:
        return "no-engine"
    from fitevict.engines.install import STAMP  # the install record's one name

    b = Path(binary)
    try:
        stamp = json.loads((b.parent / STAMP).read_text())
        commit, variant = stamp.get("llama_cpp_commit"), stamp.get("variant", "cpu")
        if commit:
            return f"llama.cpp-{commit}-{variant}-{int(stamp.get('installed_at', 0))}"
    except (OSError, ValueError):
        pass
    try:
        st = b.resolve().stat()
    except OSError:
        return f"missing:{b}"
    h = hashlib.sha256(f"{b.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return f"{b.name}-{h}"


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
    return stored_probe(binary) or rule_table(this_cpu().flags, this_cpu().arch)


def default_binary() -> Path | None:
    from fitevict.engines.install import resolve_binary

    return resolve_binary().path
