"""Modules that call themselves pure do no I/O: their functions run under an audit hook that fails on any file,
directory, process, database or socket access (sys.addaudithook; in a child process, since a hook cannot be removed).
What the hook cannot see is watched too, in the same child: ``os.stat``, ``os.lstat``, ``os.path.exists`` /
``isfile`` / ``isdir``, ``Path.exists`` / ``is_file`` / ``is_dir`` / ``stat`` and ``os.read`` / ``os.pread`` are
wrapped, and a read through a descriptor opened before arming (a file object held from setup, read later) is caught
by its file offset moving.

The server's plan is among them: ``planner.plan`` priced by a price sheet (``prices.sheet``) read from a
real SQLite store (holding a measurement of the plan's own signature) and a real zoo file, and a sheet the price
book holds is handed to a plan on the event loop without any I/O, even when a change made it stale."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHECK = textwrap.dedent('''
    import asyncio
    import json
    import sys
    from pathlib import Path
    from fitevict import guard, planner as pl
    from fitevict.budget import Budget
    from fitevict.pricing import placement, price as pricing
    from fitevict.pricing.buftrace import parse_exact_log
    from fitevict.pricing.cmdline import parse_server_argv
    from fitevict.pricing.footprint import HOST
    from fitevict.pricing.gguf import load_structure
    from fitevict.pricing.hostbufs import dry_run_check, rule_table
    from fitevict.pricing.kv import resolve_context
    from fitevict.pricing.loadconfig import LoadConfig
    from fitevict.pricing.process import process_terms
    from fitevict.config import load_config
    from fitevict.request.contract import Contract, fixed_fields, parse_contract
    from fitevict.schedule.scheduler import Scheduler
    from fitevict.store import Store
    from fitevict.seat.crash import retry_without_repack
    from fitevict.supervisor.pressure_watch import PressureWatch
    from fitevict.supervisor.planning import Planning
    from fitevict.prices.book import PriceBook

    s = load_structure(sys.argv[1])  # reading the file is I/O: before the hook is armed
    table = rule_table(["avx2", "avx512f", "avx512_vnni", "amx_int8"])
    budget = Budget.declared({HOST: "1GiB"})

    # a price sheet from a real store holding a measurement of the plan's own configuration (read before arming)
    store = Store.open(f"sqlite:///{sys.argv[2]}/fitevict.db")
    book = PriceBook(store, Path(sys.argv[2]) / "no-engine", "max-ram")
    model, asked = Path(sys.argv[1]), LoadConfig(n_ctx=1000)
    doc = json.loads(json.dumps(book.footprint(model, asked).to_json()).replace('"formula"', '"measured"'))
    store.put_measurement(book.signature(model, asked), "m", "llama-server", doc, total=doc["total_bytes"])
    book.forget()
    sheet = book.read_sheet(model, asked)
    assert sheet.footprint(asked).device(HOST).model.source == "stored-measurement"
    sheet = book.read_sheet(model, asked)  # a fresh one: nothing priced on it yet
    req = pl.PlanRequest("m", asked, "max-ram", s.n_layer + 1)
    gpu_budget = Budget.declared({HOST: "1GiB", "CUDA0": "3MiB"})  # a GPU too small for all layers: rungs, ctx search

    def plan_on_the_loop():
        async def go():
            global armed
            book.forget()  # stale now: the plan takes the sheet held, and its rebuild runs off the loop after it
            held = book.sheet_now(model, asked)
            assert held is sheet and not book.current(held)
            p = pl.plan(req, [], budget, lambda _k, c: held.footprint(c), pl.Policy(), 0.0)
            armed = False  # what follows is the rebuild, in a thread: I/O there is its job
            return p
        return lambda: loop.run_until_complete(go())

    class World:  # the scheduler's two readings as the server gives them: the planning part over the price book
        def __init__(self, planning):
            self.budget, self.prices = planning.plan_budget, planning.footprints

        def now(self):
            return 0.0

    config = load_config(None, env={}, overrides={"data_dir": sys.argv[2]})
    planning = Planning(config, book, PressureWatch(config), lambda: budget)
    served = pl.PlanRequest("m", asked, "max-ram", s.n_layer + 1, path=str(model))
    book.read_sheet(model, asked)  # current again, read ahead as a request's arrival reads it
    scheduler = Scheduler(World(planning))

    loop = asyncio.new_event_loop()  # made before arming (a loop opens a socket pair)
    LOG = "load_tensors:   CPU_Mapped model buffer size =     0.49 MiB\\nfitevict-buftrace: alloc CPU_Mapped 513344\\n"
    armed = False
    seen = []

    def hook(event, args):
        if armed and (event in ("open", "socket.connect", "socket.bind", "subprocess.Popen", "os.system")
                      or event.startswith(("os.", "shutil.", "glob.", "pathlib.", "sqlite3."))):
            seen.append(event)

    import os, pathlib
    lseek = os.lseek

    def watched(name, real):  # what raises no audit event: a stat, an existence test, a read of a held descriptor
        def call(*args, **kwargs):
            if armed:
                seen.append(name)
            return real(*args, **kwargs)
        return call

    for where, label, attrs in ((os, "os", ("stat", "lstat", "read", "pread")),
                                (os.path, "os.path", ("exists", "isfile", "isdir")),
                                (pathlib.Path, "Path", ("exists", "is_file", "is_dir", "stat"))):
        for attr in attrs:
            setattr(where, attr, watched(f"{label}.{attr}", getattr(where, attr)))

    def offsets():  # the file offset of every descriptor that has one (pipes, sockets and the like have none)
        out = {}
        for fd in map(int, os.listdir("/proc/self/fd")):
            try:
                out[fd] = lseek(fd, 0, os.SEEK_CUR)
            except OSError:
                continue  # no offset to watch: not a file (or the listing's own descriptor, closed by now)
        return out

    HELD = open(sys.argv[1], "rb")  # a descriptor opened before arming, as a module-level handle would be

    on_the_loop = plan_on_the_loop()
    store.close()  # a database read from here would have to connect again: the hook sees sqlite3.connect
    sys.addaudithook(hook)
    calls = {
        "price": lambda: pricing.price(s, LoadConfig(n_ctx=1000), host=table),
        "place": lambda: placement.place(s, LoadConfig(), table),
        "plan": lambda: pl.plan(pl.PlanRequest("m", LoadConfig(n_ctx=1000), "max-ram", s.n_layer + 1), [], budget,
                                lambda _k, c: pricing.price(s, c, host=table).footprint, pl.Policy(), 0.0),
        "guard": lambda: guard.check_measurement(5 << 20, file_bytes=1 << 20, previous=None),
        "cmdline": lambda: parse_server_argv(["-m", "x.gguf", "-c", "4096", "-nr"]),
        "buftrace": lambda: parse_exact_log(LOG),
        "dry_run_check": lambda: dry_run_check([("AMX", 1 << 20)], {"Host": 3, "AMX": 1}),
        "contract": lambda: (parse_contract({"ctx": 4096}), fixed_fields(Contract(ctx=4096))),
        "crash": lambda: retry_without_repack(True, LoadConfig(), -11),
        "plan_on_a_sheet": lambda: pl.plan(req, [], gpu_budget, lambda _k, c: sheet.footprint(c), pl.Policy(), 0.0),
        # the server's path, on the sheet read ahead (before plan_on_the_loop makes the book stale: off an event
        # loop a stale sheet is read again in place, as the CLI wants)
        "scheduler_plan": lambda: scheduler.plan(served),
        "plan_on_the_loop": on_the_loop,
        "process_terms": lambda: process_terms(s, resolve_context(s, LoadConfig(n_ctx=1000)),
                                               placement.place(s, LoadConfig(n_ctx=1000), table), n_threads=4,
                                               tiled=True, cells=1000),
    }
    failed = False
    for name, call in calls.items():
        before = offsets()
        armed = True
        call()
        armed = False
        after = offsets()
        seen += [f"read of descriptor {fd}" for fd in before if fd in after and after[fd] != before[fd]]
        if seen:
            print(f"{name}: {sorted(set(seen))}")
            failed = True
            seen.clear()
            continue
        print(f"{name}: no I/O")
    if failed:
        sys.exit(1)
    rebuilt = loop.run_until_complete(book.sheet(model, asked))
    assert rebuilt is not sheet and book.current(rebuilt) and rebuilt.version > sheet.version
''')


def test_pure_functions_do_no_io(zoo: dict, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", CHECK, str(zoo["llama-q4_0"].path), str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("no I/O") == 13, r.stdout


CRASH = '"crash": lambda: retry_without_repack(True, LoadConfig(), -11),'
# I/O a pure function could do, and what the check names it by
DOES_IO = {
    "open": ('open(sys.argv[1], "rb").close()', "'open'"),
    "os.stat": ("os.stat(sys.argv[1])", "'os.stat'"),
    "os.path.exists": ("os.path.exists(sys.argv[1])", "'os.path.exists'"),
    "os.path.isfile": ("os.path.isfile(sys.argv[1])", "'os.path.isfile'"),
    "Path.exists": ("Path(sys.argv[1]).exists()", "'Path.exists'"),
    "Path.is_file": ("Path(sys.argv[1]).is_file()", "'Path.is_file'"),
    "Path.is_dir": ("Path(sys.argv[2]).is_dir()", "'Path.is_dir'"),
    "open on a held descriptor": ("open(HELD.fileno(), 'rb', closefd=False).read(8)", "'open'"),
    "read of a held handle": ("HELD.read(4096)", "'read of descriptor"),
}


def test_the_check_sees_io(zoo: dict, tmp_path: Path) -> None:
    # the check itself can fail: each kind of I/O, put among the pure calls, is caught and named by what it did
    probe = CHECK.replace(CRASH, CRASH + "".join(f"\n        {k!r}: lambda: {io}," for k, (io, _) in DOES_IO.items()))
    assert probe != CHECK
    r = subprocess.run([sys.executable, "-c", probe, str(zoo["llama-q4_0"].path), str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    assert r.returncode != 0, r.stdout + r.stderr
    assert {k: caught in lines.get(k, "") for k, (_, caught) in DOES_IO.items()} == {k: True for k in DOES_IO}, \
        r.stdout + r.stderr
    assert r.stdout.count("no I/O") == 13, r.stdout  # the pure calls still pass beside them


def test_the_hook_sees_a_database_read(zoo: dict, tmp_path: Path) -> None:
    # a plan that went to the store (as the price book's footprint did before sheets) is caught
    probe = CHECK.replace('lambda _k, c: sheet.footprint(c), pl.Policy(), 0.0),',
                          'lambda _k, c: (Store.open(f"sqlite:///{sys.argv[2]}/fitevict.db").last_measurement("x"), '
                          'sheet.footprint(c))[1], pl.Policy(), 0.0),')
    assert probe != CHECK
    r = subprocess.run([sys.executable, "-c", probe, str(zoo["llama-q4_0"].path), str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "plan_on_a_sheet:" in r.stdout and "sqlite3.connect" in r.stdout, r.stdout + r.stderr
