"""The serving process leaves the libraries' command-line modules out (``fitevict.server.main.NOT_SERVED``): httpx's
CLI would bring click, rich and pygments into the front door (docs/benchmarks.md, "door_idle_rss")."""

from __future__ import annotations

import json
import subprocess
import sys

CLI_LIBRARIES = ("click", "rich", "pygments")
PROBE = ("import json, sys\n{prep}\nimport fitevict.server.app, fitevict.server.api\n"
         "print(json.dumps(sorted(m for m in {libs!r} if m in sys.modules)))")


def _loaded(prep: str) -> list[str]:
    r = subprocess.run([sys.executable, "-c", PROBE.format(prep=prep, libs=CLI_LIBRARIES)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_serving_process_holds_no_command_line_library() -> None:
    assert _loaded("from fitevict.server.main import leave_out_command_lines; leave_out_command_lines()") == []


def test_without_it_httpx_brings_them() -> None:
    # the same imports in a plain interpreter, where httpx finds click installed (the CLI extra is fitevict's own)
    assert _loaded("pass") == sorted(CLI_LIBRARIES)
