"""Loaded by a front door started with this folder on PYTHONPATH (``bench/soak.py --trace-memory``): every
``FITEVICT_MEMTRACE_SECONDS`` it appends to ``FITEVICT_MEMTRACE`` (JSONL) what the process holds by Python's own
account (tracemalloc's traced bytes, the 25 lines whose allocations grew most since the first record, the object
types that grew most) beside what the C allocator holds (glibc ``mallinfo2``: arena bytes in use and free) and
the RSS, so that growth can be told apart: Python objects kept, or memory the allocator keeps after they went."""

import os
import sys

# the front door's own process only (``fitevict serve`` execs it), never the seats it starts
if os.environ.get("FITEVICT_MEMTRACE") and "fitevict.server.main" in getattr(sys, "orig_argv", ()):
    import collections
    import ctypes
    import gc
    import json
    import threading
    import time
    import tracemalloc

    tracemalloc.start(int(os.environ.get("FITEVICT_MEMTRACE_FRAMES", "8")))
    _out = os.environ["FITEVICT_MEMTRACE"]
    _every = float(os.environ.get("FITEVICT_MEMTRACE_SECONDS", "120"))
    # growth is compared with the snapshot taken once warm-up is over, not with start-up's
    _baseline_after = float(os.environ.get("FITEVICT_MEMTRACE_BASELINE_SECONDS", "600"))

    class _Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]

    def _mallinfo() -> dict:
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallinfo2.restype = _Mallinfo2
            m = libc.mallinfo2()
            return {"arena": m.arena, "mmap": m.hblkhd, "in_use": m.uordblks, "free": m.fordblks}
        except (OSError, AttributeError) as e:
            return {"unavailable": f"{type(e).__name__}: {e}"}

    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _types() -> collections.Counter:
        return collections.Counter(type(o).__qualname__ for o in gc.get_objects())

    def _loop() -> None:
        first, first_types = None, None
        started = time.time()
        while True:
            time.sleep(_every)
            snap = tracemalloc.take_snapshot().filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))
            types = _types()
            rec = {"t": time.time(), "rss": _rss(), "traced": tracemalloc.get_traced_memory()[0],
                   "malloc": _mallinfo(), "threads": threading.active_count(), "objects": sum(types.values())}
            if first is None:
                if time.time() - started >= _baseline_after:
                    first, first_types = snap, types
                    rec["baseline"] = True
            else:
                rec["grew"] = [{"bytes": s.size_diff, "count": s.count_diff,
                                "where": [f"{fr.filename}:{fr.lineno}" for fr in s.traceback[:6]]}
                               for s in snap.compare_to(first, "traceback")[:25]]
                rec["types"] = (types - first_types).most_common(20)
            with open(_out, "a") as f:
                f.write(json.dumps(rec) + "\n")

    threading.Thread(target=_loop, name="memtrace", daemon=True).start()
