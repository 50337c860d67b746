"""The kernel's word on an OOM kill, read from a real process killed by the OOM killer of a real memory cgroup (skipped
where this machine gives none), and a SIGKILLed process the kernel does not call an OOM kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from _cgroups import memory_cgroup, remove_cgroup
from faultrows import FaultSeen
from fitevict.host import oomkill
from fitevict.seat.crash import exit_cause, exit_reason

HOG = "import sys; sys.stdin.readline(); b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096])"


@pytest.mark.fault(
    fault="a process OOM-killed in a real memory cgroup (8 MiB cap), read by the kernel's two witnesses (skipped "
          "where the machine gives no cgroup)",
    kind="collaborator with stand-ins")
def test_an_oom_kill_in_a_memory_cgroup_is_told_by_both_witnesses(fault_seen: FaultSeen) -> None:
    cgroup = memory_cgroup(8 << 20, "an OOM kill in a memory cgroup")
    hog = subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.PIPE)
    try:
        (cgroup / "cgroup.procs").write_text(str(hog.pid))
        seen = oomkill.observe(hog.pid)
        assert seen.cgroup is not None and seen.cgroup.path == cgroup and seen.cgroup.limit_bytes == 8 << 20
        assert oomkill.oom_evidence(hog.pid, seen) is None  # alive, nothing counted yet
        hog.stdin.write(b"go\n")  # type: ignore[union-attr]
        hog.stdin.flush()  # type: ignore[union-attr]
        assert fault_seen.running(hog.wait(30), "the hog's exit code (a Python process, no seat)") == -signal.SIGKILL
        by_count = oomkill.cgroup_evidence(seen.cgroup)
        assert by_count is not None and str(cgroup) in by_count
        assert "0 -> 1" in fault_seen.history(by_count.replace(str(cgroup), "<cgroup>"), "the cgroup's witness")
        line = oomkill.kernel_log_kill(hog.pid, seen.started_s)
        if os.access("/dev/kmsg", os.R_OK):
            assert line is not None and f"Killed process {hog.pid} (" in line
        evidence = oomkill.oom_evidence(hog.pid, seen)
        assert evidence is not None
        cause = exit_cause(-signal.SIGKILL, evidence)
        assert fault_seen.history(cause, "the cause a seat's `crash` would carry (no door: none written)") == \
            "oom-killer"
        assert "OOM killer" in exit_reason("hog", -signal.SIGKILL, evidence) and evidence in exit_reason(
            "hog", -signal.SIGKILL, evidence)
    finally:
        if hog.poll() is None:
            hog.kill()
            hog.wait()
        remove_cgroup(cgroup)


@pytest.mark.fault(
    fault="a process `SIGKILL`ed by another program (no OOM)",
    kind="collaborator with stand-ins")
def test_a_plain_sigkill_is_not_called_an_oom_kill(fault_seen: FaultSeen) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    seen = oomkill.observe(proc.pid)
    assert seen.started_s is not None
    proc.kill()
    assert fault_seen.running(proc.wait(30), "the process's exit code (a Python process, no seat)") == -signal.SIGKILL
    evidence = oomkill.oom_evidence(proc.pid, seen)
    assert fault_seen.history(evidence, "OOM evidence") is None
    cause = exit_cause(-signal.SIGKILL, evidence)
    assert fault_seen.history(cause, "the cause a seat's `crash` would carry (no door: none written)") == "killed"
    assert exit_cause(-signal.SIGSEGV) == "signal" and exit_cause(3) == "exit"
