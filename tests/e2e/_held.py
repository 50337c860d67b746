"""A llama-server that holds one model's seat start until a test lets it go: faults timed by a file, not a race
with the machine's speed."""

from __future__ import annotations

import os
from pathlib import Path


def held_engine(root: Path, real: Path, model: str) -> Path:
    """A folder with a ``llama-server`` that, for ``model``'s seat (not a dry run, ``-lv 5``), appends its pid to
    ``gate.started`` and waits until ``gate`` (a FIFO) is written or it is killed; then runs the real one. The
    engine's other binaries are linked beside it. The wait is bash's own ``read``: no child process to orphan."""
    root.mkdir()
    for f in real.parent.iterdir():
        if f.name != "llama-server":
            (root / f.name).symlink_to(f)
    gate = root / "gate"
    os.mkfifo(gate)
    script = root / "llama-server"
    script.write_text(f"""#!/bin/bash
case " $* " in
  *" -lv 5 "*) ;;
  *"/{model}.gguf "*) echo $$ >> "{gate}.started"; read -r _ < "{gate}" ;;
esac
exec "{real}" "$@"
""")
    script.chmod(0o755)
    return root


def release(fifo: Path) -> None:
    """Open the gate of a held engine, if one waits on it."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no engine waits on it (or no gate)
        return
    try:
        os.write(fd, b"go\n")
    finally:
        os.close(fd)
