"""One request's ``ctx``, from the HTTP body to llama-server's ``-c``, passes each stage once.

The route is read from the code as it runs, not written here: a real front door (the app in this process, a real
llama-server seat, real SQLite) serves one request with a context no other figure has, while ``sys.setprofile`` (and
``threading.setprofile``, for the threads the door starts) records every call into ``fitevict``, the values that hold
that context among its arguments, in its locals as it hands them on, and in what it returns. The route ends at the
call that wrote the seat's ``-c`` (``load_args`` under the seat's launch, checked against the running seat's own
command line) and is walked back from there: up the caller stack while the callers hold the context, and across a
task or queue to the call that handed it over (one still running that holds it, one that returned it, or one that
got it and handed it on), until the call where it first appeared. Beside that *main* route are the calls that made
what it handed on (the contract, the load configuration, the plan): the *full* route.

A module is *entered* when a call goes into it from another module (for a task's first call: from the call that
handed it the context); a return is no entry. Side trips, where the context is priced and not carried on (the price
book's read-ahead, the dry run), are not part of the route: they neither lead to the seat's argv nor make what does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import itertools
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import fitevict

SRC = str(Path(fitevict.__file__).resolve().parent) + "/"
CTXS = {"openai": 1234, "ollama": 1290}  # contexts no model dimension or default has
# the stages in the order the context meets them: door, contract, the seat request, schedule, plan, effects, the
# load, its launch, engine
STAGE_ORDER = ("server", "request.contract", "request.ask", "supervisor.core", "schedule", "planner",
               "supervisor.effects", "seat.loading", "seat.launching", "seat.processes", "engines")


class Call:
    """One call into fitevict: where, its caller, and the values holding the traced context it got, handed on
    (from its locals) and returned."""

    def __init__(self, n: int, module: str, name: str, parent: Call | None) -> None:
        self.n, self.module, self.name, self.parent = n, module, name, parent
        self.end: int | None = None
        self.ins: list = []
        self.had: list = []
        self.outs: list = []
        self.children: list[Call] = []

    def __repr__(self) -> str:
        return f"{self.module}:{self.name}"


def holders(x, ctx: int, out: list, depth: int = 0) -> bool:
    """Append to ``out`` every container under ``x`` (``x`` included) that holds the int ``ctx``; True when
    ``x`` holds it."""
    if type(x) is int:
        return x == ctx
    if depth > 3 or x is None or isinstance(x, (str, bytes, float, bool, type)):
        return False
    if isinstance(x, dict):
        items = list(x.values())[:64]
    elif isinstance(x, (list, tuple)):
        items = list(x[:64])
    elif dataclasses.is_dataclass(x):
        items = [getattr(x, f.name, None) for f in dataclasses.fields(x)]
    else:
        return False
    hit = False
    for v in items:
        hit = holders(v, ctx, out, depth + 1) or hit
    if hit:
        out.append(x)
    return hit


class Tracer:
    """Every call into fitevict while recording, on every thread, as a tree of ``Call`` per thread. Installed before
    the door starts (a thread takes ``threading.setprofile``'s hook only when it starts); ``record`` arms it."""

    def __init__(self) -> None:
        self.ctx, self.calls, self._seq, self.on = 0, [], itertools.count(), False
        self._stacks: dict[int, list[Call]] = {}
        self._live: dict[int, tuple[object, Call]] = {}

    def __enter__(self) -> Tracer:
        threading.setprofile(self._event)
        sys.setprofile(self._event)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def record(self, ctx: int) -> Iterator[list[Call]]:
        self.ctx, self.calls = ctx, []
        self._stacks.clear()
        self._live.clear()
        self.on = True
        try:
            yield self.calls
        finally:
            self.on = False
            self._live.clear()

    def _event(self, frame, event: str, arg) -> None:
        if not self.on or event not in ("call", "return") or not frame.f_code.co_filename.startswith(SRC):
            return
        stack = self._stacks.setdefault(threading.get_ident(), [])
        if event == "return":
            if stack:
                c = stack.pop()
                c.end = next(self._seq)
                holders(arg, self.ctx, c.outs)
            return
        known = self._live.get(id(frame))
        if known is not None and known[0] is frame:  # a coroutine resumed: the same call
            stack.append(known[1])
            return
        co = frame.f_code
        c = Call(next(self._seq), co.co_filename[len(SRC):-3].replace("/", "."), co.co_qualname,
                 stack[-1] if stack else None)
        star = bool(co.co_flags & inspect.CO_VARARGS) + bool(co.co_flags & inspect.CO_VARKEYWORDS)
        for name in co.co_varnames[:co.co_argcount + co.co_kwonlyargcount + star]:
            if name in frame.f_locals:
                holders(frame.f_locals[name], self.ctx, c.ins)
        if c.parent is not None:
            c.parent.children.append(c)
            if c.ins:  # what the caller handed on from its own locals: a value it holds, not only an argument
                handed = set(map(id, c.ins))
                c.parent.had += [v for v in list(frame.f_back.f_locals.values()) if id(v) in handed]
        self._live[id(frame)] = (frame, c)
        self.calls.append(c)
        stack.append(c)


def _ids(objs: list) -> set[int]:
    return {id(o) for o in objs}


def _chain(c: Call | None) -> list[Call]:
    out = []
    while c is not None:
        out.append(c)
        c = c.parent
    return out[::-1]


def _holds(c: Call) -> bool:
    return bool(c.ins or c.had or c.outs)


def handed_by(calls: list[Call], a: Call) -> Call | None:
    """The call that handed ``a`` its context, the latest of: one still running that holds what ``a`` got, one
    that returned it, one that got it and handed it on (taken as its outermost caller that got it too)."""
    got, mine = _ids(a.ins) | _ids(a.had), set(map(id, _chain(a)))
    before = [c for c in calls if c.n < a.n and id(c) not in mine]
    running = [c for c in before if (c.end is None or c.end > a.n) and got & _ids(c.ins)]
    made = [c for c in before if got & _ids(c.outs)]
    passed = []
    for c in before:
        if got & _ids(c.ins) and any(got & _ids(k.ins) for k in c.children):
            while c.parent is not None and got & _ids(c.parent.ins):
                c = c.parent
            passed.append(c)
    return max(running + made + passed, key=lambda c: c.n, default=None)


@dataclasses.dataclass
class Route:
    main: list[Call]  # the calls that held the context and handed it on, to the one that wrote -c
    full: list[Call]  # and the calls that made what they handed on, in call order
    linked: dict[int, Call]  # a segment's first call -> the call that handed it over


def route_to(calls: list[Call], final: Call) -> Route:
    main: list[Call] = []
    linked: dict[int, Call] = {}
    x: Call | None = final
    while x is not None:
        seg = [c for c in _chain(x) if _holds(c)]
        main[:0] = seg
        x = handed_by(calls, seg[0])
        if x is not None:
            linked[id(seg[0])] = x
    on_route = set().union(*(_ids(c.ins) | _ids(c.outs) for c in main))

    def makers(c: Call) -> list[Call]:
        out = []
        for k in c.children:
            if _ids(k.outs) & on_route and k.n < final.n:
                out += [k, *makers(k)]
        return out

    full = {id(c): c for c in main}
    for c in main:
        full.update((id(k), k) for k in makers(c))
    return Route(main, sorted(full.values(), key=lambda c: c.n), linked)


def entries(calls: list[Call], linked: dict[int, Call]) -> list[str]:
    """The modules the route goes into, in order: a call from another module is an entry, a return is none; a
    segment's first call is entered from the call that handed it over."""
    out = []
    for c in calls:
        before = c.parent if c.parent is not None else linked.get(id(c))
        if before is None or before.module != c.module:
            out.append(c.module)
    return out


def stage(module: str) -> int | None:
    hits = [i for i, s in enumerate(STAGE_ORDER) if module == s or module.startswith(s + ".")]
    return max(hits) if hits else None


@pytest.fixture(scope="module")
def traced(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Route, list[str]]]:
    """Each API's request traced on one real front door: its route, and the argv of the seat it started."""
    from fastapi.testclient import TestClient

    from fitevict.config import load_config
    from fitevict.request.catalog import Catalog
    from fitevict.server.app import create_app
    from fitevict.zoo import write_zoo

    tmp = tmp_path_factory.mktemp("ctx-route")
    write_zoo(tmp / "models", only=["llama-gqa"])
    cfg = load_config(None, env={}, overrides={"data_dir": str(tmp / "data"), "models_dirs": [str(tmp / "models")]})
    messages = [{"role": "user", "content": "hi"}]
    asks = {"openai": ("/v1/chat/completions", {"model": "llama-gqa", "max_tokens": 1, "messages": messages,
                                                "fitevict": {"ctx": CTXS["openai"]}}),
            "ollama": ("/api/chat", {"model": "llama-gqa", "stream": False, "messages": messages,
                                     "options": {"num_ctx": CTXS["ollama"], "num_predict": 1}})}
    out = {}
    with Tracer() as tracer, \
            TestClient(create_app(cfg, engine_binary=llama_server, catalog=Catalog.from_config(cfg))) as client:
        for api, (path, body) in asks.items():
            with tracer.record(CTXS[api]) as calls:
                r = client.post(path, json=body)
            assert r.status_code == 200, r.text
            pid = next(x["pid"] for x in client.get("/v1/models/residents").json()["data"]
                       if x["config"]["n_ctx"] == CTXS[api])
            argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
            wrote = [c for c in calls if c.name == "load_args" and c.parent is not None
                     and c.parent.name.endswith("launch_spec") and c.ins]
            assert len(wrote) == 1, wrote  # one seat launched for the request
            out[api] = (route_to(calls, wrote[0]), argv)
    return out


@pytest.mark.parametrize("api", list(CTXS))
def test_the_context_reaches_the_seats_argv_from_the_request(traced, api: str) -> None:
    route, argv = traced[api]
    assert argv[argv.index("-c") + 1] == str(CTXS[api])  # the running seat's own command line
    first, last = route.main[0], route.main[-1]
    assert stage(first.module) == 0, route.main  # it starts at the front door
    assert (last.module, last.name) == ("engines.llama_cpp.server", "load_args")
    assert all(_holds(c) for c in route.full)


@pytest.mark.parametrize("api", list(CTXS))
def test_the_context_enters_each_module_once(traced, api: str) -> None:
    route, _ = traced[api]
    seen = entries(route.main, route.linked)
    assert sorted(m for m in set(seen) if seen.count(m) > 1) == [], (seen, route.main)


@pytest.mark.parametrize("api", list(CTXS))
def test_the_context_meets_the_stages_in_order_once_each(traced, api: str) -> None:
    route, _ = traced[api]
    main = [s for s in map(stage, entries(route.main, route.linked)) if s is not None]
    assert main == sorted(main), [STAGE_ORDER[i] for i in main]
    met: list[int] = []  # the full route: each stage first met in order, none skipped
    for s in map(stage, entries(route.full, route.linked)):
        if s is not None and s not in met:
            met.append(s)
    assert met == list(range(len(STAGE_ORDER))), ([STAGE_ORDER[i] for i in met], route.full)


def test_a_detour_is_seen() -> None:
    # the counting itself: going back into a module from another (as the price book once sent the contract back to
    # request.contract) is a second entry; a return to the caller is not; a segment is entered from its hand-over
    f = Call(0, "a", "f", None)
    g = Call(1, "b", "g", f)
    h = Call(2, "a", "h", g)
    k = Call(3, "a", "k", f)
    assert entries([f, g, h, k], {}) == ["a", "b", "a"]
    m = Call(4, "c", "m", f)
    task = Call(5, "c", "t", None)
    assert entries([f, g, k, m, task], {id(task): m}) == ["a", "b", "c"]
    assert entries([f, g, k, task], {id(task): g}) == ["a", "b", "c"]
