"""The memory census (bench/census.py), run inside a real Python process as gdb runs it: objects kept between two
censuses show as growth of their type, with where they hang; objects made and dropped do not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"

CHILD = """
import runpy, sys
census = sys.argv[1]
out = sys.argv[2]
def take():
    runpy.run_path(census, init_globals={"CENSUS_OUT": out}, run_name="__census__")
class Keeper:
    pass
keeper = Keeper()
keeper.kept = []
take()
keeper.kept.extend(bytearray(256 * 1024) for _ in range(20))  # 5 MiB kept, each above the census's "large"
dropped = [b"x" * 100_000 for _ in range(50)]
del dropped  # made and freed: not growth
take()
"""


def _diff(tmp_path: Path) -> str:
    out = tmp_path / "census.jsonl"
    subprocess.run([sys.executable, "-c", CHILD, str(BENCH / "census.py"), str(out)], check=True, timeout=120)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["pid"] == lines[1]["pid"]
    return subprocess.run([sys.executable, str(BENCH / "census.py"), "--diff", str(out)], check=True,
                          capture_output=True, text=True, timeout=60).stdout


def test_kept_objects_show_as_growth_by_type_with_their_holder(tmp_path: Path) -> None:
    report = _diff(tmp_path)
    rows = {line.split()[0]: line.split() for line in report.splitlines() if line and not line.startswith(" ")}
    grown = rows["bytearray"]
    assert float(grown[1]) >= 5.0 and grown[3] == "+20"  # +5.xx MiB, 20 more objects
    assert "bytes" not in rows or float(rows["bytes"][1]) < 1.0  # the dropped 5 MiB of bytes is not counted
    largest = [line for line in report.splitlines() if "bytearray" in line and "<-" in line]
    assert largest and "Keeper.kept" in largest[0]


def test_a_census_says_what_malloc_and_python_hold(tmp_path: Path) -> None:
    out = tmp_path / "c.jsonl"
    code = ("import runpy, sys; runpy.run_path(sys.argv[1], init_globals={'CENSUS_OUT': sys.argv[2]}, "
            "run_name='__census__')")
    subprocess.run([sys.executable, "-c", code, str(BENCH / "census.py"), str(out)], check=True, timeout=120)
    rec = json.loads(out.read_text())
    assert rec["rss"] > 0 and rec["python_blocks"] > 0 and rec["objects"] > 1000
    m = rec["malloc"]
    assert "unavailable" in m or m["in_use_bytes"] > 0
    assert rec["types"]["dict"][0] > 0  # count, own bytes, large count, large bytes
