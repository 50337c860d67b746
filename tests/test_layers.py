"""The stages import downwards only: units/config -> pricing -> budget/planner -> schedule -> I/O (host, engines,
store, sources, request, zoo) -> prices -> seat -> supervisor
-> server/cluster/cli.

Every import in every module counts, at any depth (function-level and ``TYPE_CHECKING`` imports included). This
holds the order between stages, and no two modules may import each other round a circle, within a stage or across.

A stage key may name a submodule: the longest dotted prefix decides (a module whose room sits lower than it
would be named apart).
"""

from __future__ import annotations

import ast
from pathlib import Path

import fitevict

SRC = Path(fitevict.__file__).parent
STAGES: dict[str, int] = {
    "": 0, "units": 0, "paths": 0, "phase": 0, "config": 0,
    "pricing": 1,
    "budget": 2, "planner": 2, "guard": 2, "pressure": 2, "shrink": 1,
    "schedule": 3,
    "host": 4, "engines": 4, "store": 4, "zoo": 4, "request": 4, "sources": 4, "report": 4,
    "prices": 5,
    "seat": 6,
    "supervisor": 7,
    "server": 8, "cluster": 8, "cli": 8,
}


def _stage(module: str) -> int | None:
    """The stage of ``fitevict.a.b.c``: the longest of ``a.b.c``, ``a.b`` and ``a`` that STAGES names (a room
    whose modules sit on different stages names the odd one apart)."""
    parts = module.split(".")[1:]
    if not parts:
        return STAGES.get("")
    if parts[0] == "__version__":
        return 0
    for n in range(len(parts), 0, -1):
        if (stage := STAGES.get(".".join(parts[:n]))) is not None:
            return stage
    return None


def _imports(path: Path, *, names: bool = False) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fitevict":
            out += ([f"{node.module}.{a.name}" for a in node.names] if names or node.module == "fitevict"
                    else [node.module])
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "fitevict"]
    return out


def _module(path: Path) -> str:
    return ".".join(("fitevict", *(p for p in path.relative_to(SRC).with_suffix("").parts if p != "__init__")))


def test_every_module_belongs_to_a_stage() -> None:
    unknown = sorted({_module(p) for p in SRC.rglob("*.py") if _stage(_module(p)) is None})
    assert unknown == [], f"modules in no stage (add them to STAGES): {unknown}"


def test_stages_import_downwards_only() -> None:
    back = sorted((_module(p), m) for p in SRC.rglob("*.py") for m in _imports(p, names=True)
                  if (a := _stage(_module(p))) is not None and (b := _stage(m)) is not None and b > a)
    assert back == [], f"imports against the stage order: {back}"


def test_the_check_sees_a_back_arrow(tmp_path: Path) -> None:
    # the scan counts a function-level import too: a pricing module importing the supervisor would be caught
    p = tmp_path / "x.py"
    p.write_text("def f():\n    from fitevict.supervisor import core\n")
    assert _imports(p) == ["fitevict.supervisor"] and _stage("fitevict.supervisor") > _stage("fitevict.pricing.x")


def _graph() -> dict[str, set[str]]:
    """module -> the fitevict modules it imports (any depth in the file, TYPE_CHECKING included), resolved to the
    modules that exist (``from fitevict.x import name`` counts as fitevict.x, or as fitevict.x.name when that is a
    module)."""
    mods = {_module(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for m, p in mods.items():
        out = set()
        for imp in _imports(p) + _submodules_named(p, mods):
            while imp and imp not in mods:
                imp = imp.rpartition(".")[0]
            if imp and imp != m:
                out.add(imp)
        graph[m] = out
    return graph


def _submodules_named(path: Path, mods: dict[str, Path]) -> list[str]:
    """``from fitevict.pkg import mod``: the module ``fitevict.pkg.mod`` itself, when ``mod`` is one."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fitevict":
            out += [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_round_a_circle() -> None:
    # package __init__ files re-export their modules: a module importing its own package's name is not a circle
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in _graph().items()}
    assert _circles(graph) == [], "modules that import each other round a circle"


def test_the_circle_check_sees_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_scheduler_imports_nothing_from_the_supervisor_or_a_seat() -> None:
    graph = _graph()
    reach, todo = set(), ["fitevict.schedule.scheduler"]
    while todo:
        for d in graph.get(todo.pop(), ()):
            if d not in reach:
                reach.add(d)
                todo.append(d)
    assert not {m for m in reach if m.startswith(("fitevict.supervisor", "fitevict.seat"))}


IO_MODULES = ("os", "subprocess", "socket", "httpx", "sqlite3", "asyncio", "logging", "threading", "shutil", "urllib",
              "fitevict.host", "fitevict.engines", "fitevict.store", "fitevict.server", "fitevict.seat",
              "fitevict.supervisor")


def _claims_pure(path: Path) -> bool:
    """A module whose own docstring says it is pure ("PURE", "Pure.", ", pure:")."""
    import re

    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return re.search(r"\bPURE\b|\bPure\.|, pure:", doc) is not None


def test_a_module_that_says_it_is_pure_imports_nothing_that_does_io() -> None:
    # the audit-hook tests (test_purity.py) run the pure functions; this holds every module that says so to it
    claims = [p for p in SRC.rglob("*.py") if _claims_pure(p)]
    assert len(claims) > 20
    bad = []
    for p in claims:
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [(_module(p), n) for n in names if any(n == m or n.startswith(m + ".") for m in IO_MODULES)]
    assert bad == [], "modules that call themselves pure but import I/O"


def test_every_stage_names_a_module() -> None:
    # a key left over from a move would hold nothing: each names a package or a module of the tree
    stale = sorted(k for k in STAGES if k and not (SRC.joinpath(*k.split(".")).is_dir()
                                                   or SRC.joinpath(*k.split(".")).with_suffix(".py").is_file()))
    assert stale == [], f"stage keys that name no module (moved or gone?): {stale}"


def test_a_module_imported_from_its_package_keeps_its_stage(tmp_path: Path, monkeypatch) -> None:
    # a module named apart, above the rest of its room: importing it by its package's name does not hide that
    monkeypatch.setitem(STAGES, "request.upper", 5)
    p = tmp_path / "x.py"
    p.write_text("from fitevict.request import catalog, upper\n")
    assert [_stage(m) for m in _imports(p, names=True)] == [_stage("fitevict.request"), 5]
    assert _stage("fitevict.request.upper") > _stage("fitevict.request")


def test_no_two_rooms_import_each_other() -> None:
    # a room: a package of fitevict or a module loose in it; two rooms that import each other are one room, or wrong
    def room(m: str) -> str:
        return m.split(".")[1] if m.count(".") else ""

    rooms: dict[str, set[str]] = {}
    for m, deps in _graph().items():
        rooms.setdefault(room(m), set()).update(room(d) for d in deps if room(d) not in ("", room(m)))
    assert _circles(rooms) == [], "rooms that import each other"


def test_no_module_over_500_lines_and_no_function_over_80() -> None:
    """Rooms a reader can hold: a module over 500 lines or a function over 80 is split along its seams."""
    big = []
    for p in sorted(SRC.rglob("*.py")):
        text = p.read_text()
        if (n := text.count("\n")) > 500:
            big.append(f"{_module(p)}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                if (n := node.end_lineno - node.lineno + 1) > 80:
                    big.append(f"{_module(p)}.{node.name}: {n} lines")
    assert big == []


def test_no_module_imports_a_private_name_of_another() -> None:
    """A helper another module needs is public: no ``from fitevict.x import _name`` anywhere in the package."""
    private = sorted(f"{_module(p)} <- {m}" for p in SRC.rglob("*.py") for m in _imports(p, names=True)
                     if m.rsplit(".", 1)[-1].startswith("_") and not m.rsplit(".", 1)[-1].startswith("__"))
    assert private == []


# what a pure function must not call, whatever it imported: the clock, a file by name or by path
IO_CALLS = {"open", "time", "monotonic", "perf_counter", "sleep", "read_text", "read_bytes", "write_text", "write_bytes",
            "stat", "lstat", "exists", "is_file", "is_dir", "iterdir", "glob", "rglob", "mkdir", "unlink", "touch",
            "getmtime", "getsize", "listdir", "scandir", "walk", "urandom"}


def io_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls of ``IO_CALLS`` by name or as a method (``open(...)``, ``path.read_text()``, ``time.monotonic()``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in IO_CALLS:
                found.append((node.lineno, ast.unparse(f)))
    return found


def test_a_module_that_says_it_is_pure_calls_nothing_that_does_io() -> None:
    bad = [f"{_module(p)}:{line}: {call}" for p in SRC.rglob("*.py") if _claims_pure(p)
           for line, call in io_calls(ast.parse(p.read_text()))]
    assert bad == [], "a module that calls the clock or reads a file is not pure: say what it does instead"


def test_the_call_walk_sees_each_kind_of_io() -> None:
    for source in ("open(p)", "p.read_text()", "time.monotonic()", "Path(p).exists()", "os.listdir(d)"):
        assert io_calls(ast.parse(source)), source
    assert io_calls(ast.parse("len(x) + max(a, b)")) == []
