"""Engines are one thing: what differs by engine is read from the engine (its traits and protocol methods), never by
comparing its name outside ``engines/``, and the protocol is complete on every registered engine."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from fitevict.engines import (REGISTRY, EngineBase, Traits, engine_class, engine_for_adapter, engine_for_kind,
                              is_engine_process, traits)

SRC = Path(__file__).resolve().parents[2] / "src" / "fitevict"
PROTOCOL = ("launch_spec", "measured_footprint", "document", "failure", "teardown", "adapter_seconds", "for_binary",
            "model_of", "bind_failed", "exit_meaning", "adapter_kind", "saved_prompt")


def _mentions_engine(node: ast.AST) -> bool:
    return "engine" in ast.unparse(node).lower()


def _literal_names(node: ast.AST) -> set[str]:
    """Every registered engine's name written as a string literal anywhere inside ``node`` (nested tuples, lists,
    sets and calls included)."""
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in REGISTRY}


def _names(node: ast.AST) -> set[str]:
    """The string constants a call argument holds (one, or the items of a literal tuple, list or set)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}


def engine_name_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """Every comparison (``==``, ``!=``, ``in``, ``not in``, ...) with a registered engine's name written as a literal
    on either side, however deep (whatever the other side is called), every ``case`` of a registered name, and
    capability probes (``getattr``/``hasattr`` of a named attribute on an engine): each as (line, source)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(_literal_names(s) for s in (node.left, *node.comparators)):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.match_case) and _literal_names(node.pattern):
            found.append((node.pattern.lineno, ast.unparse(node.pattern)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and _mentions_engine(node.args[0]) and _names(node.args[1])):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_outside_engines_compares_an_engine_name_or_probes_one() -> None:
    uses = [f"{p.relative_to(SRC)}:{line}: {text}" for p in sorted(SRC.rglob("*.py")) if "engines" not in p.parts
            for line, text in engine_name_uses(ast.parse(p.read_text()))]
    assert uses == [], "ask the engine's traits (fitevict.engines.traits) or its protocol methods instead"


@pytest.mark.parametrize("source", [
    'if seat.engine == "llama-server": pass',
    'x = entry.engine != "transformers"',
    'ok = engine_name in ("llama-server", "vllm")',
    'kind = s.kind == "transformers"',  # an operand without the word "engine"
    'if (kind, base.engine) in (("lora", "llama-server"), ("peft", "transformers")): pass',  # nested tuples
    'ok = "llama-server" not in names',
    'ok = x in {"a": 1, "transformers": 2}',
    'match e:\n    case "transformers": pass',
    'hasattr(engine, "teardown")',
    'getattr(self.engine, "document", None)',
])
def test_the_walk_sees_each_kind_of_engine_name_use(source: str) -> None:
    assert engine_name_uses(ast.parse(source)), source


@pytest.mark.parametrize("source", ['if r.name == "llama-server.exe": pass', "v = getattr(self.engine, f.name)",
                                    'run(["llama-server", "-m", path])', 'x = s.kind == "diffusers"'])
def test_the_walk_leaves_other_comparisons_alone(source: str) -> None:
    assert engine_name_uses(ast.parse(source)) == []


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_engine_is_complete(name: str) -> None:
    cls = engine_class(name)
    assert cls.name == name and isinstance(cls.traits, Traits) and issubclass(cls, EngineBase)
    missing = [m for m in PROTOCOL if not callable(getattr(cls, m, None))]
    assert missing == []
    for m in ("document", "failure", "teardown", "adapter_seconds"):  # read from a log, without an instance
        assert inspect.ismethod(getattr(cls, m)), f"{name}.{m} must be a classmethod"
        assert getattr(cls, m)("") is None  # an empty log says nothing
    assert cls.traits.file_kinds
    # its seats are known by their command line's marks, else (a command the user declares) never taken for one
    assert cls.traits.process_marks or cls.model_of(["anything", "--port", "8080"]) is None
    assert cls.traits.overhead in ("calibrated", "own-process")
    assert cls.traits.adapters in ("scale-0", "switched", "none")
    assert (cls.traits.adapters == "none") == (not cls.traits.adapter_kinds)  # a seat that applies adapters names their kinds


def test_each_file_kind_has_its_default_engine_and_seats_are_known_by_their_marks() -> None:
    for kind in ("gguf", "hf"):
        assert kind in traits(engine_for_kind(kind)).file_kinds
    for kind in ("lora", "peft"):  # each adapter kind has the engine that applies it
        assert kind in traits(engine_for_adapter(kind)).adapter_kinds
    for name in [n for n in REGISTRY if traits(n).process_marks]:
        mark = traits(name).process_marks[0]
        assert is_engine_process(["/usr/bin/python3", "-m", mark, "--port", "8080"])
    assert not is_engine_process(["/usr/bin/sleep", "100"])


FAMILIES = ("fitevict.engines.llama_cpp", "fitevict.engines.transformers", "fitevict.engines.declared")
# what still reaches into a family from outside it, by importer: the CLI's commands of llama.cpp's builds (install,
# probe, calibrate, price with the engine's own dry run). The door finds its build and takes its device census
# through the registry's build pricer. Nothing may be added here; an entry whose import is gone must go too
# (checked below).
REACHES_IN: dict[str, set[str]] = {
    "fitevict.cli.admin": {"fitevict.engines.llama_cpp.install", "fitevict.engines.llama_cpp.census"},
    "fitevict.cli.engine": {"fitevict.engines.llama_cpp", "fitevict.engines.llama_cpp.install",
                            "fitevict.engines.llama_cpp.machine", "fitevict.engines.llama_cpp.overhead",
                            "fitevict.engines.llama_cpp.vulkan", "fitevict.engines.llama_cpp.probe"},
    "fitevict.cli.price": {"fitevict.engines.llama_cpp.dryrun", "fitevict.engines.llama_cpp.install",
                           "fitevict.engines.llama_cpp.devprobe", "fitevict.engines.llama_cpp.machine",
                           "fitevict.engines.llama_cpp.overhead"},
    "fitevict.cli.serve": {"fitevict.engines.llama_cpp.install"},
    "fitevict.cli.zoo": {"fitevict.engines.llama_cpp.install"},
}


def _module_name(path: Path) -> str:
    return ".".join(("fitevict", *(p for p in path.relative_to(SRC).with_suffix("").parts if p != "__init__")))


def imported_modules(tree: ast.AST) -> set[str]:
    """Every fitevict module ``tree`` imports, at any depth: ``import a.b``, ``from a.b import c`` (as ``a.b`` and, for
    a submodule ``c``, ``a.b.c``)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] == "fitevict"}


def family_reaches(tree: ast.AST, importer: str) -> set[str]:
    """The family modules ``importer`` imports from outside that family (the registry names them as strings)."""
    own = next((f for f in FAMILIES if importer == f or importer.startswith(f + ".")), None)
    return {m for m in imported_modules(tree) for f in FAMILIES
            if f != own and (m == f or m.startswith(f + ".")) and not _is_attribute(m, f)}


def _is_attribute(module: str, family: str) -> bool:
    """``from fitevict.engines.llama_cpp.install import SERVER`` names ``...install.SERVER``: a name, not a module."""
    rest = module[len(family):].lstrip(".").split(".")
    return len(rest) > 1 or (len(rest) == 1 and rest[0] != "" and rest[0][:1].isupper())


def _reaches() -> dict[str, set[str]]:
    found = {}
    for p in sorted(SRC.rglob("*.py")):
        if got := family_reaches(ast.parse(p.read_text()), _module_name(p)):
            found[_module_name(p)] = got
    return found


def test_no_module_outside_a_family_imports_one_of_its_modules() -> None:
    found = _reaches()
    new = {m: sorted(got - REACHES_IN.get(m, set())) for m, got in found.items() if got - REACHES_IN.get(m, set())}
    assert new == {}, "ask the engine registry (fitevict.engines: traits, engine_class, pricer_for) instead"
    stale = {m: sorted(want - found.get(m, set())) for m, want in REACHES_IN.items() if want - found.get(m, set())}
    assert stale == {}, "these imports are gone: take them off REACHES_IN"


def test_prices_import_no_engine_family() -> None:
    found = {m: got for m, got in _reaches().items() if m.startswith("fitevict.prices.")}
    assert found == {} and not any(m.startswith("fitevict.prices") for m in REACHES_IN)


@pytest.mark.parametrize("source", ["from fitevict.engines.llama_cpp import dryrun",
                                    "from fitevict.engines.llama_cpp.dryrun import dry_run",
                                    "import fitevict.engines.transformers.seat",
                                    "def f():\n    from fitevict.engines.transformers.engine import hf_config",
                                    "from fitevict.engines import llama_cpp"])
def test_the_walk_sees_each_kind_of_family_import(source: str) -> None:
    assert family_reaches(ast.parse(source), "fitevict.prices.book")
    assert not family_reaches(ast.parse(source.replace("transformers", "llama_cpp")), "fitevict.engines.llama_cpp.x")


def test_each_engine_reads_its_own_seats_and_exits() -> None:
    llama, torch = engine_class(engine_for_kind("gguf")), engine_class(engine_for_kind("hf"))
    assert str(llama.model_of(["/x/llama-server", "-m", "/m/a.gguf", "--port", "9"])) == "/m/a.gguf"
    assert llama.model_of(["/x/llama-server", "--port", "9"]) is None
    assert torch.model_of(["python", "-m", "fitevict.engines.transformers.seat", "/m/dir"]) is None  # never adopted
    assert llama.bind_failed("... couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 9")
    assert not llama.bind_failed("main: server is listening") and not torch.bind_failed("couldn't bind")
    from fitevict.engines.base import NO_WEIGHTS
    assert torch.exit_meaning(3) == NO_WEIGHTS and torch.exit_meaning(1) is None and llama.exit_meaning(3) is None
    with pytest.raises(ValueError, match="saves no prompts"):
        torch.saved_prompt(Path("/nonexistent.bin"))
    with pytest.raises(OSError):
        llama.saved_prompt(Path("/nonexistent.bin"))
