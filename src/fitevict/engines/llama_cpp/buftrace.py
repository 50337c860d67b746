"""The allocator's own truth: an LD_PRELOAD library (``buftrace.c``) that logs every ggml backend buffer an engine
process allocates or frees, to the byte.

The library is compiled with the system C compiler (``$CC``, else ``cc``) on first use into
``cache_dir()/buftrace/libfitevict-buftrace-<source hash>.so``; a changed source builds a new file. It works on the
statically linked pinned llama-server, whose buffer constructor is inlined: it follows the C++ allocations of
the buffer records themselves (see the C source). ``pricing.buftrace`` reads what it logs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from fitevict.engines.base import Unavailable
from fitevict.paths import cache_dir

SOURCE = Path(__file__).with_name("buftrace.c")


def buftrace_library(cache: Path | None = None) -> Path | Unavailable:
    """The compiled library (built now if missing), or why it cannot be built."""
    try:
        src = SOURCE.read_bytes()
    except OSError as err:
        return Unavailable(f"the buftrace source {SOURCE} cannot be read: {err.strerror}")
    digest = hashlib.sha256(src).hexdigest()[:16]
    out_dir = cache or cache_dir() / "buftrace"
    lib = out_dir / f"libfitevict-buftrace-{digest}.so"
    if lib.is_file():
        return lib
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return Unavailable("no C compiler (cc / gcc, or $CC) to build the buftrace library; install one "
                           "(apt-get install gcc)")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return Unavailable(f"cannot create {out_dir} for the buftrace library: {err.strerror}")
    tmp = lib.with_suffix(f".tmp{os.getpid()}")
    r = subprocess.run([cc, "-shared", "-fPIC", "-fexceptions", "-O2", "-o", str(tmp), str(SOURCE), "-ldl"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        return Unavailable(f"{cc} could not build {SOURCE.name} (exit {r.returncode}): {r.stderr.strip()[-500:]}")
    os.replace(tmp, lib)
    return lib


def preload_env(lib: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``lib`` first in LD_PRELOAD."""
    e = dict(os.environ if env is None else env)
    e["LD_PRELOAD"] = f"{lib} {e['LD_PRELOAD']}" if e.get("LD_PRELOAD") else str(lib)
    return e
