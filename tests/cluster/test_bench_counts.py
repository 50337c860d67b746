"""The cluster bench's counting helpers (bench/cluster_real.py): reload bytes are the bytes of loads of a model
loaded before on any node, in time order; an over-budget event is a node's bytes going from within its budget to
over it, counted once per crossing."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from cluster_real import OverBudget, loads_of  # noqa: E402


def test_reload_bytes_count_only_models_loaded_before_anywhere() -> None:
    sizes = {"a": 10, "b": 7}
    got = loads_of([(3.0, "a"), (1.0, "b"), (2.0, "a"), (4.0, "b")], sizes)
    assert got == {"loads": 4, "loaded_bytes": 34, "reload_bytes": 17}


def test_no_loads_no_bytes() -> None:
    assert loads_of([], {}) == {"loads": 0, "loaded_bytes": 0, "reload_bytes": 0}


def test_an_over_budget_event_is_a_crossing_per_node() -> None:
    ob = OverBudget(100)
    for node, held in (("x", 90), ("x", 120), ("x", 130), ("y", 101), ("x", 80), ("x", 101), ("y", 50)):
        ob.see(node, held)
    assert ob.events == 3
    assert ob.max_over == 30


def test_at_the_budget_is_not_over() -> None:
    ob = OverBudget(100)
    ob.see("x", 100)
    assert ob.events == 0 and ob.max_over == 0
