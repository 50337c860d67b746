"""Modules that call themselves pure do no I/O: their functions run under an audit hook that fails on any file,
directory, process or socket access (sys.addaudithook; in a child process, since a hook cannot be removed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHECK = textwrap.dedent('''
    import sys
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
    from fitevict.contract import Contract, fixed_fields, parse_contract
    from fitevict.supervisor.crash import retry_without_repack

    s = load_structure(sys.argv[1])  # reading the file is I/O: before the hook is armed
    table = rule_table(["avx2", "avx512f", "avx512_vnni", "amx_int8"])
    budget = Budget.declared({HOST: "1GiB"})
    LOG = "load_tensors:   CPU_Mapped model buffer size =     0.49 MiB\\nfitevict-buftrace: alloc CPU_Mapped 513344\\n"
    armed = False
    seen = []

    def hook(event, args):
        if armed and (event in ("open", "socket.connect", "socket.bind", "subprocess.Popen", "os.system")
                      or event.startswith(("os.", "shutil.", "glob.", "pathlib."))):
            seen.append(event)

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
        "crash": lambda: retry_without_repack("llama-server", LoadConfig(), -11),
        "process_terms": lambda: process_terms(s, resolve_context(s, LoadConfig(n_ctx=1000)),
                                               placement.place(s, LoadConfig(n_ctx=1000), table), n_threads=4,
                                               tiled=True, cells=1000),
    }
    for name, call in calls.items():
        armed = True
        call()
        armed = False
        if seen:
            print(f"{name}: {sorted(set(seen))}")
            sys.exit(1)
        print(f"{name}: no I/O")
''')


def test_pure_functions_do_no_io(zoo: dict, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", CHECK, str(zoo["llama-q4_0"].path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("no I/O") == 10, r.stdout


def test_the_hook_sees_io(zoo: dict) -> None:
    # the check itself can fail: a function that opens a file is caught
    probe = CHECK.replace('"crash": lambda: retry_without_repack("llama-server", LoadConfig(), -11),',
                          '"crash": lambda: open(sys.argv[1], "rb").close(),')
    r = subprocess.run([sys.executable, "-c", probe, str(zoo["llama-q4_0"].path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "crash: ['open']" in r.stdout, r.stdout + r.stderr
