"""The allocator trace: the preload library on a real process, and the join with the load log."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fitevict.engines.base import Unavailable
from fitevict.engines.buftrace import buftrace_library, preload_env
from fitevict.pricing.buftrace import exact_log, parse_exact_log, parse_trace
from fitevict.pricing.logparse import PRECISION_BYTES, parse_load_log

# A process with the two ggml functions, laid out as the pinned ggml-backend-impl.h lays them out, built
# without -rdynamic: the library must find them in the executable's own symbol table, as in the static engine.
PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
struct iface { void * p[11]; };
struct buft { const char * (*get_name)(void *); };
struct buffer { struct iface iface; struct buft * buft; void * context; size_t size; int usage; };
static const char * cpu(void * b) { (void) b; return "CPU"; }
static const char * mapped(void * b) { (void) b; return "CPU_Mapped"; }
__attribute__((noinline)) struct buffer * ggml_backend_buffer_init(struct buft * t, struct iface i, void * c,
                                                                   size_t size) {
    struct buffer * b = malloc(sizeof *b); b->iface = i; b->buft = t; b->context = c; b->size = size; return b;
}
__attribute__((noinline)) void ggml_backend_buffer_free(struct buffer * b) { free(b); }
int main(void) {
    struct buft c = {cpu}, m = {mapped};
    struct iface i = {{0}};
    struct buffer * w = ggml_backend_buffer_init(&m, i, NULL, 1234567);
    struct buffer * a = ggml_backend_buffer_init(&c, i, NULL, 3000001);
    ggml_backend_buffer_free(a);                         /* a compute buffer grown: freed, then ... */
    struct buffer * b = ggml_backend_buffer_init(&c, i, NULL, 4928513);  /* ... allocated larger */
    printf("%zu %zu\n", w->size, b->size);
    return 0;
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    got = buftrace_library(tmp_path_factory.mktemp("buftrace"))
    assert not isinstance(got, Unavailable), got.reason
    return got


def test_the_library_logs_allocations_and_frees_of_a_static_binary(lib: Path, tmp_path: Path) -> None:
    src = tmp_path / "t.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "t"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(src)], check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, env=preload_env(lib), timeout=30)
    assert r.returncode == 0 and r.stdout == "1234567 4928513\n"  # the traced program still does what it did
    lines = [x for x in r.stderr.splitlines() if x.startswith("fitevict-buftrace")]
    assert lines == ["fitevict-buftrace: ready", "fitevict-buftrace: alloc CPU_Mapped 1234567",
                     "fitevict-buftrace: alloc CPU 3000001", "fitevict-buftrace: free CPU 3000001",
                     "fitevict-buftrace: alloc CPU 4928513"]
    trace = parse_trace(r.stderr)
    assert [(b.name, b.bytes) for b in trace.live] == [("CPU_Mapped", 1234567), ("CPU", 4928513)]
    assert (trace.allocs, trace.frees, trace.state) == (3, 1, "ready")


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
