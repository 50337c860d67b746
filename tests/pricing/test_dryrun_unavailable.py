"""The dry run's failure is a value with a reason, never a zero."""

from __future__ import annotations

from pathlib import Path

from fitevict.engines.llama_cpp.dryrun import Unavailable, dry_run_compute, parse_dry_compute, server_args
from fitevict.pricing.loadconfig import LoadConfig
from fitevict.units import MiB


def test_no_engine_is_unavailable_with_the_remedy(small_zoo: dict[str, Path], tmp_path: Path) -> None:
    res = dry_run_compute(tmp_path, small_zoo["llama-gqa"], LoadConfig())
    assert isinstance(res, Unavailable)
    assert "llama-server" in res.reason and "fitevict engine install" in res.reason


def test_server_args_use_the_pinned_spelling() -> None:
    a = server_args("m.gguf", LoadConfig(n_ctx=1000, n_parallel=3, kv_unified=True, mmap=False, swa_full=True))
    assert a[:2] == ["-m", "m.gguf"]
    assert "-lm" in a and a[a.index("-lm") + 1] == "none"
    assert a[a.index("-dev") + 1] == "none" and "-kvu" in a and "--swa-full" in a
    assert a[a.index("-np") + 1] == "3" and a[a.index("-c") + 1] == "1000"
    assert "-np" not in server_args("m.gguf", LoadConfig())  # absent -np: the engine's own default


def test_parse_dry_compute_takes_the_last_reservation_before_the_fit_ends() -> None:
    text = "\n".join([
        "0.01 I llama_context: constructing llama_context",
        "0.02 I sched_reserve:        CPU compute buffer size =     1.00 MiB",
        "0.03 I llama_context: constructing llama_context",
        "0.04 I sched_reserve:        CPU compute buffer size =     2.50 MiB",
        "0.05 I sched_reserve:      CUDA0 compute buffer size =    10.00 MiB",
        "0.06 I common_fit_params: fitting params to free memory took 0.00 seconds",
        "0.07 I sched_reserve:        CPU compute buffer size =    99.00 MiB",
    ])
    assert parse_dry_compute(text) == {"CPU": round(2.5 * MiB), "CUDA0": 10 * MiB}
