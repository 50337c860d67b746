"""One request's ``ctx``, from the HTTP body to llama-server's ``-c``, passes each stage once.

The route is written below as the calls that hand the context on, each with its depth in the call tree, and with
the code that hands it on. The test finds every call in the source (by module and qualified name) and checks that
code, so the route here is the code's: a move or a new detour fails it. A module is *entered* when a call goes into
it from another module; a return is no entry (the caller that gets the context back was never left). Side trips,
where the context is priced and not carried on (the price book, the price sheet), are not part of the route.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "fitevict"

# (depth, module, qualified name, code in it that hands the context on: "a && b" for two hand-ons, in order)
OPENAI = (
    (0, "server.fastpath", "FastPath.serve", "door.prepare(body"),
    (1, "server.door", "Door.prepare", 'parse_contract(body.pop("fitevict"'),
    (2, "server.door", "parse_contract", "_parse_contract(raw)"),
    (3, "request.contract", "parse_contract", 'ctx=integer("ctx"'),
    (2, "server.door", "Door.ask", "self.asks(entry, contract)"),
    (3, "request.ask", "Asks.__call__", "ask(entry, contract, self.shapes)"),
    (4, "request.ask", "ask", "load_config_for(entry, contract"),
    (5, "request.ask", "load_config_for", "n_ctx=c.ctx"),
    (5, "request.ask", "plan_request", "config=cfg"),
    (1, "server.fastpath", "FastPath._infer", "door.sup.acquire(prep.ask"),
    (2, "supervisor.core", "Supervisor.acquire", "Waiter(asked.request"),
    (3, "supervisor.core", "Supervisor._wait", "self.scheduler.submit(w)"),
    (4, "schedule.scheduler", "Scheduler.submit", "self.queue.append(w)"),
    (5, "schedule.scheduler", "Scheduler._place", "self.plan(head.request"),
    (6, "schedule.scheduler", "Scheduler.plan", "pl.plan(request"),
    (7, "planner.plan", "plan", "request.config"),
    (6, "supervisor.effects", "LiveEffects.start", "self._load(waiter, plan)"),
    (7, "supervisor.effects", "LiveEffects._load", "self._load_seat(waiter, plan)"),
    (8, "supervisor.effects", "LiveEffects._load_seat", "processes.launch_spec(entry, path, cfg"),
    (9, "supervisor.processes", "Processes.launch_spec", "engine.launch_spec(path, cfg"),
    (10, "engines.llama_server", "LlamaServerEngine.launch_spec", "load_args("),
    (11, "engines.llama_server", "load_args", '"-c", str(cfg.n_ctx)'),
)
OLLAMA = (
    (0, "server.ollama", "OllamaRoutes.chat", "sh.chat_request(body"),
    (1, "server.ollama_shapes", "chat_request", "contract_of(req)"),
    (2, "server.ollama_shapes", "contract_of", "parse_contract(raw"),
    (3, "request.contract", "parse_contract", 'ctx=integer("ctx"'),
    (1, "server.ollama", "OllamaRoutes.complete", "self._sent(stack, entry, path, tr"),
    (2, "server.ollama", "OllamaRoutes._sent", "seatcall.held(door, entry, tr.contract"),
    (3, "server.seatcall", "held", "door.ask(entry, contract) && door.sup.acquire(asked"),
    (4, "server.door", "Door.ask", "self.asks(entry, contract)"),
    (5, "request.ask", "Asks.__call__", "ask(entry, contract, self.shapes)"),
    (6, "request.ask", "ask", "load_config_for(entry, contract"),
    (4, "supervisor.core", "Supervisor.acquire", "Waiter(asked.request"),
)
# the stages in the order the context meets them: door, contract, the seat request, schedule, plan, effects, engine
STAGE_ORDER = ("server", "request.contract", "request.ask", "supervisor.core", "schedule", "planner",
               "supervisor.effects", "supervisor.processes", "engines")


def _functions(module: str) -> dict[str, str]:
    """qualified name -> source of every function in ``module`` (methods as ``Class.name``)."""
    path = SRC / (module.replace(".", "/") + ".py")
    text = path.read_text()
    out: dict[str, str] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for c in ast.iter_child_nodes(node):
            if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[prefix + c.name] = ast.get_source_segment(text, c) or ""
            elif isinstance(c, ast.ClassDef):
                walk(c, prefix + c.name + ".")

    walk(ast.parse(text), "")
    return out


def entries(route: tuple) -> list[str]:
    """The modules the route goes into, in order: a call from another module is an entry, a return is none."""
    out: list[str] = []
    path: list[str] = []  # the modules on the call path, by depth
    for depth, module, _name, _code in route:
        del path[depth:]
        if not path or path[-1] != module:
            out.append(module)
        path.append(module)
    return out


@pytest.mark.parametrize("route", [OPENAI, OLLAMA], ids=["openai", "ollama"])
def test_every_call_of_the_route_hands_the_context_on(route: tuple) -> None:
    missing = []
    for depth, module, name, code in route:
        src = _functions(module).get(name)
        at = [src.find(part) for part in code.split(" && ")] if src is not None else []
        if src is None or min(at) < 0 or at != sorted(at):
            missing.append(f"{module}:{name} ({'gone' if src is None else f'no longer has {code!r}, in order'})")
    assert missing == [], f"the ctx route changed; read the code from the call before and write the route anew: {missing}"
    depths = [d for d, *_ in route]
    assert all(b <= a + 1 for a, b in zip(depths, depths[1:])), "a call goes deeper than one step at a time"


@pytest.mark.parametrize("route", [OPENAI, OLLAMA], ids=["openai", "ollama"])
def test_the_context_enters_each_module_once(route: tuple) -> None:
    seen = entries(route)
    assert sorted(m for m in set(seen) if seen.count(m) > 1) == []


def test_the_context_meets_the_stages_in_order_once_each() -> None:
    def stage(module: str) -> int:
        return max(i for i, s in enumerate(STAGE_ORDER) if module == s or module.startswith(s + "."))

    met = [stage(m) for m in entries(OPENAI)]
    assert met == sorted(met), [STAGE_ORDER[i] for i in met]
    assert sorted(set(met)) == list(range(len(STAGE_ORDER)))  # every stage, none skipped


def test_a_detour_is_seen() -> None:
    # the counting itself: going back into a module from another (as the price book once sent the contract back to
    # request.contract) is a second entry; a return to the caller is not
    detour = ((0, "a", "f", ""), (1, "b", "g", ""), (2, "a", "h", ""), (1, "a", "k", ""))
    assert entries(detour) == ["a", "b", "a"]
    assert entries(((0, "a", "f", ""), (1, "b", "g", ""), (1, "a", "k", ""), (1, "c", "m", ""))) == ["a", "b", "c"]
