"""The node agent's child is tied to the agent's process, not to the thread that asked for it: it outlives that
thread, and ends (SIGTERM) when the process does, however the process ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from fitevict.cluster.agent import node_key, spawn_tied


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":  # ended, not yet reaped
            return True
        time.sleep(0.02)
    return False


def test_the_child_outlives_the_thread_that_started_it() -> None:
    got: dict[str, subprocess.Popen] = {}
    t = threading.Thread(target=lambda: got.update(p=spawn_tied(["sleep", "30"])))
    t.start()
    t.join()  # a Ray actor's call thread may end like this one; PR_SET_PDEATHSIG follows the forking thread
    try:
        time.sleep(0.3)
        assert got["p"].poll() is None
    finally:
        got["p"].terminate()
        got["p"].wait(10)
    assert got["p"].returncode == -signal.SIGTERM


def test_the_child_ends_with_its_parent_process_however_it_ends(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import os, signal, sys, threading
        from fitevict.cluster.agent import spawn_tied
        got = {}
        t = threading.Thread(target=lambda: got.update(p=spawn_tied(["sleep", "30"])))
        t.start(); t.join()
        print(got["p"].pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    parent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert parent.returncode == -signal.SIGKILL, parent.stderr
    child = int(parent.stdout.split()[0])
    assert _gone(child), "the child outlived its parent process"


def test_a_start_that_fails_raises_in_the_callers_thread(tmp_path: Path) -> None:
    try:
        spawn_tied([str(tmp_path / "no-such-program")])
    except FileNotFoundError:
        return
    raise AssertionError("no error for a program that does not exist")


def test_the_node_key_is_the_nodes_own_config(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FITEVICT_CONFIG", "")
    monkeypatch.delenv("FITEVICT_CLUSTER_KEY", raising=False)
    assert node_key() is None
    monkeypatch.setenv("FITEVICT_CLUSTER_KEY", "ck-node")
    assert node_key() == "ck-node"
    monkeypatch.setenv("FITEVICT_CLUSTER_KEY", "two words")  # a config that does not load: the door says why
    assert node_key() is None
