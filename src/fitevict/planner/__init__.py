"""The placement planner: which configuration to load, what to evict, or why nothing fits.

PURE: no I/O, no logging, no clock (the caller passes ``now``). The same call is the dry run.

``plan(request, residents, budget, footprints, policy, now) -> Plan`` reads a snapshot of what is
resident and a budget per device (GPUs and host RAM, ``"CPU"``), prices candidate configurations
through ``footprints`` (a pricing function), and returns frozen data that carries every number that
decided it. "Doesn't fit" is a ``refuse`` plan, not an exception; only broken invariants raise.

Bytes per device: a GPU counts the model's device buffers; the host counts mapped + committed bytes
(mapped weights count against RAM like committed ones; the split is reported, never used to
over-commit). A device is checked where the new model needs bytes on it.

Placement ladder (``max-gpu`` / ``max-ram``), ordered from most to least GPU use, as llama.cpp's own
``--fit`` does it: all layers on the GPU(s); then, for MoE models, the experts of the first 1..M
layers moved to the CPU (``--n-cpu-moe``); then fewer layers (``-ngl``) with every expert on the CPU;
last, a CPU-only load (``-dev none``). ``max-gpu`` takes the first rung that fits, ``max-ram`` the
last. GPU bytes fall and host bytes rise along the ladder, so the rungs that fit the GPUs are a
suffix and those that fit the host a prefix; both are found by bisection, and the chosen rung is
always re-checked against every device.

Evictions: only residents that are not pinned, protected, serving requests (``in_flight``) or loading
are evicted; in the eviction policy's order (``eviction.py``: GreedyDual-Size priority or least recently used
first, ties by most bytes on the devices that are short; pressure relief takes the same order), only as
many as needed, then every victim whose removal was not needed is dropped again (so removing any
one victim from the set makes the load not fit). A model whose footprint exceeds
``policy.exclusive_fraction`` of a device's budget is *exclusive* there: it evicts everything evictable that holds
bytes on that device, and on the other devices only what it must.
When a load would fit only once busy residents are gone, the plan is ``wait`` with their keys.

    records.py  the frozen inputs and the Plan
    ladder.py   the placement ladder, the one compatibility rule, pricing candidates
    eviction.py the eviction policies (GreedyDual-Size, LRU): one registered object each, one victim order
    victims.py  minimal victim sets in that order, and the words of a plan
    plan.py     plan(): hit, load, partial, ram, wait or refuse, with the numbers that decided it
"""

from fitevict.planner.ladder import RELOADED_FOR_CTX, action_of, compatible, mismatch
from fitevict.planner.plan import plan
from fitevict.planner.records import (ALLOC_MODES, LOADING_ACTIONS, PRIORITY_BAND, Action, AllocMode, Eviction,
                                      FootprintFn, Plan, PlanInvariantError, PlanRequest, Policy, Resident)
from fitevict.planner.eviction import POLICIES, eviction_policy
from fitevict.planner.victims import describe

__all__ = ["ALLOC_MODES", "LOADING_ACTIONS", "PRIORITY_BAND", "Action", "AllocMode", "Eviction", "FootprintFn", "Plan",
           "PlanInvariantError", "PlanRequest", "Policy", "RELOADED_FOR_CTX", "Resident", "action_of", "compatible",
           "describe", "eviction_policy", "mismatch", "plan", "POLICIES"]
