"""The allocator trace: the preload library on a real process, and the join with the load log."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fitevict.engines.base import Unavailable
from fitevict.engines.llama_cpp.buftrace import buftrace_library, preload_env
from fitevict.pricing.buftrace import exact_log, parse_exact_log, parse_trace
from fitevict.pricing.logparse import PRECISION_BYTES, parse_load_log

# A process that builds ggml_backend_buffer records as the pinned engine does: C++ new of the 120-byte struct
# (ggml-backend-impl.h: 11 iface pointers, buft, context, size, usage), filled in by inlined code, freed by delete.
PROGRAM = r"""
#include <cstdio>
#include <cstddef>
struct iface { void * p[11]; };
struct buft { const char * (*get_name)(buft *); };
struct buffer { iface i; buft * t; void * context; size_t size; int usage; };
static_assert(sizeof(buffer) == 120, "the pinned layout");
static const char * cpu(buft *) { return "CPU"; }
static const char * mapped(buft *) { return "CPU_Mapped"; }
static buft c = {cpu}, m = {mapped};
struct other { char bytes[120]; };  // a same-sized object that is not a buffer
static buffer * make(buft * t, size_t size) { return new buffer{iface{}, t, nullptr, size, 0}; }
int main() {
    buffer * w = make(&m, 1234567);
    other * o = new other{};
    buffer * a = make(&c, 3000001);
    delete a;                      // a compute buffer grown: freed, then ...
    buffer * b = make(&c, 4928513);  // ... allocated larger
    std::printf("%zu %zu\n", w->size, b->size);
    delete o;
    delete w;
    delete b;
    return 0;
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    got = buftrace_library(tmp_path_factory.mktemp("buftrace"))
    assert not isinstance(got, Unavailable), got.reason
    return got


def test_the_library_logs_allocations_and_frees_of_a_static_binary(lib: Path, tmp_path: Path) -> None:
    src = tmp_path / "t.cpp"
    src.write_text(PROGRAM)
    exe = tmp_path / "t"
    subprocess.run(["c++", "-O2", "-o", str(exe), str(src)], check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, env=preload_env(lib), timeout=30)
    assert r.returncode == 0 and r.stdout == "1234567 4928513\n"  # the traced program still does what it did
    lines = [x for x in r.stderr.splitlines() if x.startswith("fitevict-buftrace")]
    assert lines == ["fitevict-buftrace: ready", "fitevict-buftrace: alloc CPU_Mapped 1234567",
                     "fitevict-buftrace: alloc CPU 3000001", "fitevict-buftrace: free CPU 3000001",
                     "fitevict-buftrace: alloc CPU 4928513", "fitevict-buftrace: free CPU_Mapped 1234567",
                     "fitevict-buftrace: free CPU 4928513"]
    alive = parse_trace("\n".join(lines[:5]))  # what a load log holds while the engine runs
    assert [(b.name, b.bytes) for b in alive.live] == [("CPU_Mapped", 1234567), ("CPU", 4928513)]
    assert (alive.allocs, alive.frees, alive.state) == (3, 1, "ready")
    assert parse_trace(r.stderr).live == ()


def test_the_library_is_built_once_per_source(lib: Path) -> None:
    assert buftrace_library(lib.parent) == lib


LOG = """\
load_tensors:   CPU_Mapped model buffer size =     1.18 MiB
llama_kv_cache:        CPU KV buffer size =     0.38 MiB
llama_context:        CPU  output buffer size =     0.02 MiB
sched_reserve:        CPU compute buffer size =     4.70 MiB
"""
TRACE = """\
fitevict-buftrace: ready
fitevict-buftrace: alloc CPU_Mapped 1234567
fitevict-buftrace: alloc CPU 393216
fitevict-buftrace: alloc CPU 16048
fitevict-buftrace: alloc CPU 3000001
fitevict-buftrace: free CPU 3000001
fitevict-buftrace: alloc CPU 4928513
"""


def test_every_log_figure_takes_its_exact_bytes() -> None:
    log = parse_exact_log(LOG + TRACE)
    assert log.precision_bytes == 0 and not log.notes
    assert log.model_buffers == (("CPU_Mapped", 1234567),)
    assert log.kv_lines == (("CPU", 393216),) and log.kv_buffers == (("CPU", 393216),)
    assert log.output_buffers == (("CPU", 16048),)
    assert log.compute_buffers == (("CPU", 4928513),)  # the live buffer, not the one freed when it grew


def test_a_figure_the_trace_lacks_stays_printed_and_is_named() -> None:
    log = exact_log(parse_load_log(LOG), parse_trace(TRACE.replace("alloc CPU 16048", "alloc CPU 999")))
    assert log.output_buffers == (("CPU", round(0.02 * 1024 * 1024)),)
    assert log.precision_bytes == PRECISION_BYTES
    assert any("output CPU 0.02 MiB" in n for n in log.notes)
    absent = exact_log(parse_load_log(LOG), parse_trace(""))
    assert absent.precision_bytes == PRECISION_BYTES and any("absent" in n for n in absent.notes)
