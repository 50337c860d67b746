"""The kernel's word on an OOM kill, read from a real process killed by the OOM killer of a real memory cgroup (skipped
where this machine gives none), and a SIGKILLed process the kernel does not call an OOM kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from _cgroups import memory_cgroup, remove_cgroup
from fitevict.host import oomkill
from fitevict.seat.crash import exit_cause, exit_reason

HOG = "import sys; sys.stdin.readline(); b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096])"


@pytest.mark.fault(
    fault="a process OOM-killed in a real memory cgroup (8 MiB cap), read by the kernel's two witnesses (skipped "
          "where the machine gives no cgroup)",
    client="no client: the witnesses alone",
    history="the reason a seat's `crash` would carry: cause `oom-killer`, naming the OOM killer with its evidence "
            "(the cgroup's `oom_kill` count 0 -> 1; the kernel's log line naming the pid where `/dev/kmsg` is "
            "readable)",
    running="nothing: the process killed by the kernel, the test's cgroup removed",
    lost="nothing")
def test_an_oom_kill_in_a_memory_cgroup_is_told_by_both_witnesses() -> None:
    cgroup = memory_cgroup(8 << 20, "an OOM kill in a memory cgroup")
    hog = subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.PIPE)
    try:
        (cgroup / "cgroup.procs").write_text(str(hog.pid))
        seen = oomkill.observe(hog.pid)
        assert seen.cgroup is not None and seen.cgroup.path == cgroup and seen.cgroup.limit_bytes == 8 << 20
        assert oomkill.oom_evidence(hog.pid, seen) is None  # alive, nothing counted yet
        hog.stdin.write(b"go\n")  # type: ignore[union-attr]
        hog.stdin.flush()  # type: ignore[union-attr]
        assert hog.wait(30) == -signal.SIGKILL
        by_count = oomkill.cgroup_evidence(seen.cgroup)
        assert by_count is not None and str(cgroup) in by_count and "0 -> 1" in by_count
        line = oomkill.kernel_log_kill(hog.pid, seen.started_s)
        if os.access("/dev/kmsg", os.R_OK):
            assert line is not None and f"Killed process {hog.pid} (" in line
        evidence = oomkill.oom_evidence(hog.pid, seen)
        assert evidence is not None and exit_cause(-signal.SIGKILL, evidence) == "oom-killer"
        assert "OOM killer" in exit_reason("hog", -signal.SIGKILL, evidence) and evidence in exit_reason(
            "hog", -signal.SIGKILL, evidence)
    finally:
        if hog.poll() is None:
            hog.kill()
            hog.wait()
        remove_cgroup(cgroup)


@pytest.mark.fault(
    fault="a process `SIGKILL`ed by another program (no OOM)",
    client="no client: the witnesses alone",
    history="cause `killed`, with no OOM evidence (another signal is `signal`, an exit code `exit`)",
    running="nothing",
    lost="nothing")
def test_a_plain_sigkill_is_not_called_an_oom_kill() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    seen = oomkill.observe(proc.pid)
    assert seen.started_s is not None
    proc.kill()
    assert proc.wait(30) == -signal.SIGKILL
    evidence = oomkill.oom_evidence(proc.pid, seen)
    assert evidence is None
    assert exit_cause(-signal.SIGKILL, evidence) == "killed"
    assert exit_cause(-signal.SIGSEGV) == "signal" and exit_cause(3) == "exit"
