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
PROTOCOL = ("launch_spec", "measured_footprint", "document", "failure", "teardown", "adapter_seconds", "for_binary")


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
    assert cls.traits.file_kinds and cls.traits.process_marks
    assert cls.traits.overhead in ("calibrated", "own-process")
    assert cls.traits.adapters in ("scale-0", "switched", "none")
    assert (cls.traits.adapters == "none") == (not cls.traits.adapter_kinds)  # a seat that applies adapters names their kinds


def test_each_file_kind_has_its_default_engine_and_seats_are_known_by_their_marks() -> None:
    for kind in ("gguf", "hf"):
        assert kind in traits(engine_for_kind(kind)).file_kinds
    for kind in ("lora", "peft"):  # each adapter kind has the engine that applies it
        assert kind in traits(engine_for_adapter(kind)).adapter_kinds
    for name in REGISTRY:
        mark = traits(name).process_marks[0]
        assert is_engine_process(["/usr/bin/python3", "-m", mark, "--port", "8080"])
    assert not is_engine_process(["/usr/bin/sleep", "100"])
