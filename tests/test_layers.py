"""The stages import downwards only: units/config -> pricing -> budget/planner -> I/O (host, engines, store,
catalog, contract, zoo) -> supervisor -> server/cli.

Every import in every module counts, at any depth (function-level and ``TYPE_CHECKING`` imports included). This
holds the order between stages; circles inside one stage (the supervisor's core, effects and orphans) are not yet
ruled out here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import fitevict

SRC = Path(fitevict.__file__).parent
STAGES: dict[str, int] = {
    "": 0, "units": 0, "paths": 0, "config": 0,
    "pricing": 1,
    "budget": 2, "planner": 2, "guard": 2, "pressure": 2, "shrink": 1,
    "host": 3, "engines": 3, "store": 3, "zoo": 3, "catalog": 3, "catalog_adapters": 3, "catalog_files": 3,
    "catalog_names": 3, "catalog_stores": 3, "stores": 3,
    "contract": 3, "report": 3,
    "loadreport": 4, "supervisor": 4,
    "server": 5, "cluster": 5, "cli": 5,
}


def _stage(module: str) -> int | None:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    if top == "__version__":
        return 0
    return STAGES.get(top)


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fitevict":
            out += [f"fitevict.{a.name}" for a in node.names] if node.module == "fitevict" else [node.module]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "fitevict"]
    return out


def _module(path: Path) -> str:
    return ".".join(("fitevict", *(p for p in path.relative_to(SRC).with_suffix("").parts if p != "__init__")))


def test_every_module_belongs_to_a_stage() -> None:
    unknown = sorted({_module(p) for p in SRC.rglob("*.py") if _stage(_module(p)) is None})
    assert unknown == [], f"modules in no stage (add them to STAGES): {unknown}"


def test_stages_import_downwards_only() -> None:
    back = sorted((_module(p), m) for p in SRC.rglob("*.py") for m in _imports(p)
                  if (a := _stage(_module(p))) is not None and (b := _stage(m)) is not None and b > a)
    assert back == [], f"imports against the stage order: {back}"


def test_the_check_sees_a_back_arrow(tmp_path: Path) -> None:
    # the scan counts a function-level import too: a pricing module importing the supervisor would be caught
    p = tmp_path / "x.py"
    p.write_text("def f():\n    from fitevict.supervisor import core\n")
    assert _imports(p) == ["fitevict.supervisor"] and _stage("fitevict.supervisor") > _stage("fitevict.pricing.x")
