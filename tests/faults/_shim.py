"""The fault shim (``faultshim.c``), built for the tests with the system C compiler, and the environment that loads
it into a front door (and the seats it starts): writes under one directory fail with ENOSPC, or hold, or the first
open of a file there holds, while a flag file exists."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("faultshim.c")


def build_shim(out: Path) -> Path:
    """``libfaultshim.so`` in ``out``, compiled now (a second or less)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler (cc / gcc, or $CC) to build the fault shim; install one (apt-get install gcc)"
    lib = out / "libfaultshim.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(SOURCE), "-ldl"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, f"{cc} could not build {SOURCE.name}: {r.stderr[-2000:]}"
    return lib


def shim_env(lib: Path, directory: Path, flag: Path, mode: str, exe: str | None = None) -> dict[str, str]:
    """The environment that loads the shim: ``mode`` ("enospc", "hold" or "hold-open") on files under ``directory``
    while ``flag`` exists, in every process, or only in those whose executable is named ``exe``."""
    preload = f"{lib} {os.environ['LD_PRELOAD']}" if os.environ.get("LD_PRELOAD") else str(lib)
    return {"LD_PRELOAD": preload, "FAULTSHIM_DIR": str(directory.resolve()), "FAULTSHIM_FLAG": str(flag),
            "FAULTSHIM_MODE": mode, **({"FAULTSHIM_EXE": exe} if exe else {})}
