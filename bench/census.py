"""What a running front door holds, by type and by size, read from the live process without restarting or tracing it.

``gdb`` attaches to the door, takes the GIL (``PyGILState_Ensure``) and runs this file inside it, which appends one
census to ``--out`` (JSON lines): every object reachable from the garbage collector's containers (untracked ones
such as ``bytes`` and ``str`` included, found through their owners), counted and sized (``sys.getsizeof``) by type;
the largest objects with where they hang (the attribute, key or container that holds them); Python's allocated
blocks; malloc's counts (``mallinfo2``, as ``/health`` gives them); the RSS. The door is paused while the census runs (seconds); it is not
otherwise touched. ``--diff`` says what grew between two censuses of the same door.

    bench/census.py PID [--out census.jsonl]                  # one census of a running door
    bench/census.py --diff census.jsonl [--first 0 --last -1]  # what grew between two of its lines

Needs ``gdb`` and ptrace rights over the door (the same user, or root). Figures are measured in the door; the
sizes are shallow (``sys.getsizeof``: an object's own bytes, not what it refers to).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

LARGEST = 40  # objects listed with their owners
LARGE = 64 * 1024  # bytes from which an object is counted among the large ones (near malloc's mmap threshold)


def _malloc() -> dict:
    """malloc's counts as the door reports them in ``/health`` (``fitevict.host.heap.held``)."""
    try:
        from fitevict.host.heap import held
    except ImportError as e:
        return {"unavailable": f"fitevict is not importable in this process: {e}"}
    m = held()["malloc"]
    return m if isinstance(m, dict) else {"unavailable": m}


def _rss() -> int | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def _name(o) -> str:
    t = type(o)
    return f"{t.__module__}.{t.__qualname__}" if t.__module__ not in ("builtins", None) else t.__qualname__


def _reachable(gc) -> tuple[dict[int, object], dict[int, int]]:
    """Every object the collector tracks, and every object they refer to (strings, bytes, numbers included); and
    for each object found through another, the id of the first one that referred to it."""
    tracked = gc.get_objects()
    seen = {id(o): o for o in tracked}
    parent: dict[int, int] = {}
    stack = list(tracked)
    while stack:
        h = stack.pop()
        for r in gc.get_referents(h):
            if id(r) not in parent:
                parent[id(r)] = id(h)
            if id(r) not in seen:
                seen[id(r)] = r
                stack.append(r)
    return seen, parent


def _attrs(o) -> object:
    """``o``'s instance dict, read without running its class's code (``__getattr__`` may raise anything)."""
    try:
        return object.__getattribute__(o, "__dict__")
    except Exception:
        return None


def _holder_kind(i: int, seen: dict[int, object], parent: dict[int, int]) -> str:
    """What holds object ``i``, two steps up, by type: 'list in Foo', 'dict in Bar' (an instance's attributes:
    'Bar.__dict__'), or 'nothing found' for an object no other refers to."""
    h = seen.get(parent.get(i, -1))
    if h is None:
        return "nothing found"
    up = seen.get(parent.get(id(h), -1))
    if up is not None and _attrs(up) is h:
        return f"{_name(up)}.__dict__"
    return f"{_name(h)} in {_name(up) if up is not None else 'nothing found'}"


def _by_holder(seen: dict[int, object], parent: dict[int, int],
               kinds: tuple[type, ...] = (str, bytes, dict, set, list)) -> dict:
    """Strings, bytes and the plain containers counted by what holds them (``_holder_kind``), with up to three
    examples each."""
    out: dict[str, dict] = {}
    for i, o in seen.items():
        if type(o) in kinds:
            row = out.setdefault(f"{type(o).__name__} <- {_holder_kind(i, seen, parent)}",
                                 {"count": 0, "bytes": 0, "examples": []})
            row["count"] += 1
            row["bytes"] += sys.getsizeof(o)
            if len(row["examples"]) < 3:
                # a string's text; a container's length only: repr() runs code on whatever it holds, and an
                # object reached through the collector may not be fit for that (a door died of it once)
                row["examples"].append(repr(o)[:80] if isinstance(o, (str, bytes)) else f"len {len(o)}")
    return out


def _describe(h, o) -> str:
    """How holder ``h`` holds ``o``."""
    if isinstance(h, dict):
        key = next((k for k, v in h.items() if v is o), "?")
        return f"dict[{str(key)[:60]!r}]"
    if type(h).__name__ == "cell":
        return "closure cell"
    attrs = _attrs(h)  # an instance whose attributes live inline (3.11+) refers to them itself
    if isinstance(attrs, dict):
        key = next((k for k, v in attrs.items() if v is o), None)
        if key is not None:
            return f"{_name(h)}.{key}"
    return f"{_name(h)} (len {len(h) if hasattr(h, '__len__') else '-'})"


def _holder(o, gc, mine: set[int]):
    """The most telling object that refers to ``o``: an instance owning it by attribute, else a container."""
    holders = [r for r in gc.get_referrers(o) if id(r) not in mine and type(r).__name__ != "frame"]
    for h in holders:
        if isinstance(h, dict):
            owners = [r for r in gc.get_referrers(h) if id(r) not in mine and _attrs(r) is h]
            if owners:
                key = next((k for k, v in h.items() if v is o), "?")
                return owners[0], f"{_name(owners[0])}.{key}"
    for h in sorted(holders, key=lambda r: type(r).__name__ in ("cell", "tuple")):
        return h, _describe(h, o)
    return None, None


def _where(o, gc, mine: set[int]) -> list[str]:
    """Up to four steps from ``o`` towards what holds it: 'Owner.attr', 'dict[key]', 'list (len n)', ..."""
    steps: list[str] = []
    for _ in range(4):
        h, step = _holder(o, gc, mine)
        if h is None:
            break
        steps.append(step)
        if type(h).__name__ == "function":
            steps[-1] = f"function {h.__qualname__}"
            break
        mine.add(id(h))
        o = h
    return steps


def take(out: str) -> None:
    """The census, run inside the door (by gdb)."""
    import gc
    import time

    t0 = time.monotonic()
    seen, parent = _reachable(gc)
    by_type: dict[str, list[int]] = {}
    large: list[tuple[int, int]] = []
    for i, o in seen.items():
        try:
            size = sys.getsizeof(o)
        except Exception:  # an object whose __sizeof__ fails is counted, not sized
            size = 0
        row = by_type.setdefault(_name(o), [0, 0, 0, 0])
        row[0] += 1
        row[1] += size
        if size >= LARGE:
            row[2] += 1
            row[3] += size
            large.append((size, i))
    large.sort(reverse=True)
    mine = {id(seen), id(large), id(by_type)}
    biggest = []
    for size, i in large[:LARGEST]:
        o = seen[i]
        biggest.append({"type": _name(o), "bytes": size, "len": len(o) if hasattr(o, "__len__") else None,
                        "where": _where(o, gc, mine | {id(o)})})
    rec = {"pid": __import__("os").getpid(), "at": time.time(), "rss": _rss(), "malloc": _malloc(),
           "python_blocks": sys.getallocatedblocks(), "objects": len(seen),
           "types": {k: v for k, v in by_type.items()}, "largest": biggest, "holders": _by_holder(seen, parent),
           "seconds": round(time.monotonic() - t0, 2)}
    del seen, parent, large
    with open(out, "a") as f:
        f.write(json.dumps(rec) + "\n")


def attach(pid: int, out: Path) -> dict:
    """Run the census inside process ``pid`` through gdb; the line it appended."""
    before = out.stat().st_size if out.exists() else 0
    # an exception is caught inside the door and written as the census's line: one left to PyRun_SimpleString
    # would stay in sys.last_traceback, and its frames keep every object the census gathered (tens of MiB)
    code = (f"import runpy\ntry:\n    runpy.run_path({str(Path(__file__).resolve())!r}, "
            f"init_globals={{'CENSUS_OUT': {str(out.resolve())!r}}}, run_name='__census__')\n"
            f"except BaseException as e:\n    import json\n    with open({str(out.resolve())!r}, 'a') as f:\n"
            f"        f.write(json.dumps({{'error': repr(e)[:2000]}}) + '\\n')\n    del e\n")
    interned = [f"p ((PyDictObject*)interned)->{f}" for f in ("ma_used", "ma_keys->dk_log2_size", "ma_keys->dk_usable")]
    cmd = ["gdb", "-p", str(pid), "-batch", *(a for e in interned for a in ("-ex", e)),
           "-ex", "call (int)PyGILState_Ensure()",
           "-ex", f"call (int)PyRun_SimpleString({json.dumps(code)})", "-ex", "call (void)PyGILState_Release($4)"]
    run = subprocess.run(cmd, capture_output=True, text=True)  # never cut short: a census killed mid-way leaves
    if not out.exists() or out.stat().st_size == before:  # the door holding its GIL, hung
        sys.exit(f"census: process {pid} wrote nothing (gdb exit {run.returncode}); gdb said:\n{run.stderr[-2000:]}\n"
                 "Check that gdb can attach (same user or root; /proc/sys/kernel/yama/ptrace_scope) and that the "
                 "process is a Python 3 front door.")
    lines = out.read_text().splitlines()
    rec = json.loads(lines[-1])
    if "error" in rec:
        sys.exit(f"census: the census failed inside process {pid}: {rec['error']}")
    rec["interned"] = _interned(run.stdout)
    out.write_text("\n".join([*lines[:-1], json.dumps(rec)]) + "\n")
    return rec


def _interned(gdb_out: str) -> dict:
    """The interpreter's table of interned strings as gdb read it (needs CPython's debug symbols): live strings,
    its size (2 ** log2 slots) and the slots left before it is rebuilt; or why not."""
    vals = [ln.split("=", 1)[1].strip().split()[0] for ln in gdb_out.splitlines() if ln.startswith("$")][:3]
    try:
        used, log2, usable = (int(v) for v in vals)
    except ValueError:
        return {"unavailable": f"gdb could not read the table (no debug symbols?): {vals}"}
    return {"live": used, "slots": 2**log2, "usable": usable}


def _mib(b: float) -> str:
    return f"{b / 2**20:+.2f} MiB"


def diff(path: Path, first: int, last: int, top: int = 25) -> None:
    """What grew between two censuses of one door: by type (bytes and count), malloc, RSS."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    a, b = lines[first], lines[last]
    if a["pid"] != b["pid"]:
        sys.exit(f"census: lines {first} and {last} are of different processes ({a['pid']}, {b['pid']})")
    hours = (b["at"] - a["at"]) / 3600
    print(f"pid {a['pid']}: {hours * 60:.1f} min apart (census took {a['seconds']} s and {b['seconds']} s)")
    print(f"RSS {_mib(b['rss'] - a['rss'])}; Python blocks {b['python_blocks'] - a['python_blocks']:+d}; "
          f"objects {b['objects'] - a['objects']:+d}")
    ia, ib = a.get("interned", {}), b.get("interned", {})
    if "live" in ia and "live" in ib:
        print(f"interned strings: live {ia['live']} -> {ib['live']}, table {ia['slots']} -> {ib['slots']} slots "
              f"({ib['usable']} usable before it is rebuilt)")
    ma, mb = a["malloc"], b["malloc"]
    if "unavailable" not in ma and "unavailable" not in mb:
        print("malloc: " + ", ".join(f"{k} {_mib(mb[k + '_bytes'] - ma[k + '_bytes'])}"
                                     for k in ("heaps", "in_use", "free", "mapped_apart"))
              + (f", mapped-apart chunks {mb['mapped_apart_chunks'] - ma['mapped_apart_chunks']:+d}"
                 if "mapped_apart_chunks" in ma and "mapped_apart_chunks" in mb else ""))
    rows = []
    for name in set(a["types"]) | set(b["types"]):
        ca, sa, la, lba = a["types"].get(name, [0, 0, 0, 0])
        cb, sb, lb, lbb = b["types"].get(name, [0, 0, 0, 0])
        rows.append((sb - sa, cb - ca, lb - la, lbb - lba, name, sb))
    total = sum(r[0] for r in rows)
    print(f"\nobjects' own bytes {_mib(total)} (getsizeof, shallow); by type, largest growth first:")
    print(f"{'type':48} {'bytes':>14} {'count':>9} {'large n':>8} {'large bytes':>14} {'now':>12}")
    for db, dc, dl, dlb, name, now in sorted(rows, reverse=True)[:top]:
        print(f"{name[:48]:48} {_mib(db):>14} {dc:>+9d} {dl:>+8d} {_mib(dlb):>14} {now / 2**20:>9.2f} MiB")
    ha, hb = a.get("holders", {}), b.get("holders", {})
    if ha and hb:
        grew = sorted(((hb[k]["bytes"] - ha.get(k, {}).get("bytes", 0), hb[k]["count"] - ha.get(k, {}).get("count", 0),
                        k) for k in hb), reverse=True)
        print("\nstrings, bytes and plain containers by what holds them, largest growth first:")
        for db, dc, k in grew[:top // 2]:
            print(f"  {k[:70]:70} {_mib(db):>12} {dc:>+8d}  e.g. {'; '.join(hb[k]['examples'])[:120]}")
    print("\nlargest objects now:")
    for o in b["largest"][:15]:
        print(f"  {o['bytes'] / 2**10:9.0f} KiB {o['type']} len={o['len']}  <- {' <- '.join(o['where'])}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pid", nargs="?", type=int)
    p.add_argument("--out", type=Path, default=Path("census.jsonl"))
    p.add_argument("--diff", type=Path, help="a census file: what grew between --first and --last")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--last", type=int, default=-1)
    args = p.parse_args()
    if args.diff:
        return diff(args.diff, args.first, args.last)
    if args.pid is None:
        p.error("a process id, or --diff FILE")
    rec = attach(args.pid, args.out)
    print(f"census of {args.pid}: {rec['objects']} objects, RSS {rec['rss'] / 2**20:.1f} MiB, "
          f"took {rec['seconds']} s; appended to {args.out}")


if __name__ == "__census__":
    take(CENSUS_OUT)  # noqa: F821  (given by attach through runpy)
elif __name__ == "__main__":
    main()
