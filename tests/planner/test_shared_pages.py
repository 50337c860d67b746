"""An engine binary's shared file pages in a plan (``planner.pages``): held once while any seat of the engine is,
needed by a load only when no other seat of its engine stays, freed only when the last seat of it goes."""

from __future__ import annotations

from dataclasses import replace

from fitevict.budget import Budget
from fitevict.planner import Policy, Resident, plan
from fitevict.pricing.footprint import HOST
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.pricing.pages import SharedPages

from .tables import TableModel

MiB = 1024**2
PAGES = 12 * MiB
NOW = 1000.0
LLAMA = SharedPages("llama-server", PAGES, "measured: test figure", ("llama-server",))
M = TableModel("m", dense=(25 * MiB,) * 4, output=0, embd=0)  # 100 MiB on the host, CPU only


def fn(key: str, cfg: LoadConfig):
    return replace(M.footprint(cfg), pages=LLAMA)


def seat(key: str, host: int, carries: int = 0, last_used: float = 1.0, **kw) -> Resident:
    return Resident(key, LoadConfig(n_ctx=1024), {HOST: host + carries}, last_used=last_used, pages="llama-server",
                    carries=carries, **kw)


def request():
    return M.request(mode="ram-only", pages="llama-server")


def test_a_load_of_an_engine_no_seat_runs_needs_its_shared_pages() -> None:
    p = plan(request(), [], Budget.declared({HOST: "1GiB"}), fn, Policy(), NOW)
    assert p.action == "ram" and p.needed_bytes[HOST] == 100 * MiB + PAGES


def test_a_second_seat_of_the_engine_needs_none_of_them() -> None:
    others = [seat("a", 50 * MiB, carries=PAGES)]
    p = plan(request(), others, Budget.declared({HOST: "1GiB"}), fn, Policy(), NOW)
    assert p.action == "ram" and p.needed_bytes[HOST] == 100 * MiB
    # the door's held bytes count them once, on the seat that carries them
    assert p.free_bytes_before[HOST] == 1024 * MiB - 50 * MiB - PAGES


def test_fitting_beside_a_seat_of_the_same_engine_takes_the_pages_once() -> None:
    # 50 + 12 MiB held; the new seat's 100 MiB fit in 162 MiB only if its pages are not counted a second time
    budget = Budget.declared({HOST: 162 * MiB})
    p = plan(request(), [seat("a", 50 * MiB, carries=PAGES, pinned=True)], budget, fn, Policy(), NOW)
    assert p.action == "ram" and p.evict_keys == () and p.free_bytes_after[HOST] == 0


def test_evicting_seats_of_the_same_engine_frees_none_of_the_pages_the_new_seat_keeps() -> None:
    # a (carrier) and b are idle; the new seat of the same engine keeps the pages held, whatever goes
    res = [seat("a", 60 * MiB, carries=PAGES, last_used=1.0), seat("b", 60 * MiB, last_used=2.0)]
    budget = Budget.declared({HOST: 132 * MiB + 60 * MiB})  # held: 60 + 60 + 12 = 132 MiB; 60 MiB free
    p = plan(request(), res, budget, fn, Policy(eviction="lru"), NOW)
    assert p.action == "ram" and p.evict_keys == ("a",)  # a's 60 MiB make 120 MiB free: enough for 100 MiB
    assert p.evict[0].bytes[HOST] == 60 * MiB  # not 72: its pages stay held, carried on by b or the new seat
    assert p.free_bytes_after[HOST] == 20 * MiB


def test_evicting_one_of_two_seats_of_another_engine_frees_only_its_own_bytes() -> None:
    other = TableModel("t", dense=(50 * MiB,), output=0, embd=0)  # 50 MiB, an engine without shared pages
    res = [seat("a", 30 * MiB, carries=PAGES, last_used=1.0), seat("b", 30 * MiB, last_used=2.0)]
    held = 30 * MiB + 30 * MiB + PAGES

    def fn2(key: str, cfg: LoadConfig):
        return other.footprint(cfg)

    req = other.request(mode="ram-only", pages="transformers")
    one = plan(req, res, Budget.declared({HOST: held + 20 * MiB}), fn2, Policy(eviction="lru"), NOW)
    # 30 MiB short: a (least recently used) goes; its pages stay with b, so it frees its own 30 MiB, not 42
    assert one.action == "ram" and one.evict_keys == ("a",)
    assert one.evict[0].bytes[HOST] == 30 * MiB and one.free_bytes_after[HOST] == 0
    both = plan(req, res, Budget.declared({HOST: held}), fn2, Policy(eviction="lru"), NOW)
    assert set(both.evict_keys) == {"a", "b"}  # 50 MiB short: only both seats free enough, their pages once
    assert sum(e.bytes[HOST] for e in both.evict) == 60 * MiB + PAGES


def test_a_pinned_seat_keeps_its_engines_pages_so_evicting_the_carrier_frees_none_of_them() -> None:
    other = TableModel("t", dense=(30 * MiB,), output=0, embd=0)
    res = [seat("a", 30 * MiB, carries=PAGES, last_used=1.0), seat("p", 30 * MiB, last_used=2.0, pinned=True)]
    held = 60 * MiB + PAGES
    p = plan(other.request(mode="ram-only"), res, Budget.declared({HOST: held + 10 * MiB}),
             lambda k, c: other.footprint(c), Policy(eviction="lru"), NOW)
    assert p.action == "ram" and p.evict_keys == ("a",)
    assert p.evict[0].bytes[HOST] == 30 * MiB  # the pinned seat stays: the pages stay held
    assert p.free_bytes_after[HOST] == 10 * MiB
