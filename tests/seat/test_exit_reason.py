"""A serving seat's end, said from its exit code: a kill, a crash by a signal, or an exit."""

from __future__ import annotations

from fitevict.seat.crash import exit_reason


def test_each_kind_of_end_is_named() -> None:
    assert exit_reason("llama-server", -9).startswith("llama-server was killed (SIGKILL, exit code -9: the kernel's "
                                                      "OOM killer, or another program)")
    assert exit_reason("llama-server", -11).startswith("llama-server died by SIGSEGV (exit code -11)")
    assert exit_reason("transformers", 3).startswith("transformers exited unexpectedly with code 3")
    assert exit_reason("llama-server", -200).startswith("llama-server died by signal 200")
    assert all(r.endswith("the next request reloads it") for r in (exit_reason("e", c) for c in (-9, -6, 0, None)))
