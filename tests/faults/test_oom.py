"""A seat ended by the kernel, against one real front door (``fitevict serve``) and real seats: killed by the OOM
killer of a memory cgroup it was moved into, killed by a SIGKILL whose sender the kernel does not name, and frozen
without a stop signal (its cgroup frozen: alive, asleep, no progress) while a request waits on it.

For each: what the client receives (an error in its API's shape), what history's ``crash`` says (how the seat
ended, and the kernel's own words where it gives them), what remains running (the seat reaped), and that the next
request loads the model again. Where this machine gives no cgroup to use (not root, no memory controller, a
read-only hierarchy), the test says so and is skipped.
"""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from _cgroups import memory_cgroup, new_cgroup, remove_cgroup, unified_root
from _frontdoor import FrontDoor, front_door
from faultrows import FaultSeen
from test_seat_faults import check_crashed, check_reloads, kill_left, openai_stream_cut, seat_pid

pytestmark = pytest.mark.e2e
STALL_S = 2.0  # engine.stall_seconds
CAP_BYTES = 2 << 20  # the memory cap: a seat charges ~8 MB more to its new cgroup as its 4k context fills
LONG_PROMPT = "hello world " * 300  # ~600 tokens: the seat's buffers fill past the cap at once


@pytest.fixture(scope="module")
def door(zoo: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    tmp = tmp_path_factory.mktemp("oomfaults")
    models = tmp / "models"
    models.mkdir()
    for name in ("oom", "killed", "stuck", "icebox"):
        shutil.copyfile(zoo["llama-gqa"].path, models / f"{name}.gguf")
    cfg = tmp / "fitevict.toml"
    cfg.write_text(f"[policy]\nprompt_cache = false\n[engine]\nstall_seconds = {STALL_S}\n")
    with front_door(tmp, "--config", str(cfg), "--models-dir", str(models), timeout=180) as fd:
        yield fd


def ask(fd: FrontDoor, model: str, prompt: str = "hi", **extra) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=fd.base_url + "/v1", api_key="none", max_retries=0, timeout=60)
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], **extra)


@pytest.mark.fault(
    fault="a seat killed by the kernel's OOM killer: moved into a memory cgroup capped at 2 MiB, then asked a long "
          "prompt (its buffers fill past the cap)",
    kind="real door")
def test_seat_oom_killed_in_a_memory_cgroup(door: FrontDoor, fault_seen: FaultSeen) -> None:
    ask(door, "oom", max_tokens=2)
    pid = seat_pid(door, "oom")
    cgroup = memory_cgroup(CAP_BYTES, "OOM kill in a memory cgroup")
    try:
        (cgroup / "cgroup.procs").write_text(str(pid))
        with pytest.raises(openai.APIStatusError) as e:
            ask(door, "oom", LONG_PROMPT, max_tokens=200)
        assert fault_seen.client(e.value.status_code, "status") == 502
        assert fault_seen.client(e.value.body["type"], "type") == "engine_error"
        assert "oom" in fault_seen.client(e.value.message, "its message")
        crash = check_crashed(door, "oom", pid, fault_seen)
    finally:
        kill_left(pid)
        remove_cgroup(cgroup)
    assert fault_seen.history(crash["details"]["cause"], "`crash` cause") == "oom-killer", crash
    reason = fault_seen.history(crash["reason"], "reason")
    assert "killed by the kernel's OOM killer" in reason and crash["details"]["oom"] in reason
    assert f"Killed process {pid} (" in reason or str(cgroup) in reason
    check_reloads(door, "oom", pid, fault_seen)


@pytest.mark.fault(
    fault="a seat `SIGKILL`ed mid-stream with `oom_score_adj` 1000 (the OOM killer's first choice), by a sender the "
          "kernel does not name",
    kind="real door")
def test_a_sigkill_the_kernel_does_not_name_is_killed_not_oom(door: FrontDoor, fault_seen: FaultSeen) -> None:
    ask(door, "killed", max_tokens=2)
    Path(f"/proc/{seat_pid(door, 'killed')}/oom_score_adj").write_text("1000")
    e, pid = openai_stream_cut(door, "killed", signal.SIGKILL, fault_seen)
    assert fault_seen.client(e.body["code"], "code") == "engine_lost"
    crash = check_crashed(door, "killed", pid, fault_seen)
    assert fault_seen.history(crash["details"]["cause"], "`crash` cause") == "killed"
    assert fault_seen.history(crash["details"]["oom"], "oom") is None
    reason = fault_seen.history(crash["reason"], "reason")
    assert "was killed (SIGKILL, exit code -9: the kernel's OOM killer, or another program)" in reason
    check_reloads(door, "killed", pid, fault_seen)


def frozen_mid_stream(fd: FrontDoor, model: str, cgroup: Path, switch: str, on: str, off: str,
                      seen: FaultSeen) -> dict:
    """A long stream of ``model`` whose seat is moved into ``cgroup`` after 3 chunks and frozen there (``switch``
    set to ``on``): the client is told ``engine_lost`` (the door's error, not the SDK's timeout) with the watch's
    reason, and the seat's ``crash`` is returned (the cgroup thawed, ``off``, and removed whatever happened)."""
    stream = ask(fd, model, stream=True, max_tokens=4000, extra_body={"ignore_eos": True})
    got, pid = 0, None
    try:
        with pytest.raises(openai.APIError) as e:
            for _ in stream:
                got += 1
                if got == 3:
                    pid = seat_pid(fd, model)
                    (cgroup / "cgroup.procs").write_text(str(pid))
                    (cgroup / switch).write_text(on)
        assert pid is not None and seen.client(got, "stream chunks before the error") >= 3
        seen.client(type(e.value), "the SDK raised")
        assert seen.client(e.value.body["code"], "code") == "engine_lost"
        crash = check_crashed(fd, model, pid, seen)
        # told why: the watch's own words
        assert f"llama-server pid {pid} " in seen.client(e.value.message, "its message"), e.value.message
    finally:
        (cgroup / switch).write_text(off)
        remove_cgroup(cgroup)
    assert seen.history(crash["details"]["cause"], "`crash` cause") == "frozen"
    check_reloads(fd, model, pid, seen)
    return crash


@pytest.mark.fault(
    fault="a seat frozen without a stop signal mid-stream (its cgroup frozen through cgroup v2's `cgroup.freeze`: "
          "alive, state S, no CPU time, no byte), as a deadlock leaves it",
    kind="real door")
def test_a_seat_stuck_without_a_stop_signal_is_detected_and_replaced(door: FrontDoor, fault_seen: FaultSeen) -> None:
    what = "a seat stuck without a stop signal (cgroup v2's freezer makes the fault)"
    crash = frozen_mid_stream(door, "stuck", new_cgroup(unified_root(what), what), "cgroup.freeze", "1", "0",
                              fault_seen)
    reason = fault_seen.history(crash["reason"], "reason")
    assert "made no progress" in reason and "while a request waited on it" in reason


@pytest.mark.fault(
    fault="a seat frozen mid-stream by a cgroup v1 freezer (`freezer.state` FROZEN: state D, deaf to every signal)",
    kind="real door")
def test_a_seat_frozen_by_a_cgroup_v1_freezer_is_detected_and_replaced(door: FrontDoor, fault_seen: FaultSeen) -> None:
    cgroup = new_cgroup(Path("/sys/fs/cgroup/freezer"), "a seat frozen by a cgroup v1 freezer")
    crash = frozen_mid_stream(door, "icebox", cgroup, "freezer.state", "FROZEN", "THAWED", fault_seen)
    reason = fault_seen.history(crash["reason"], "reason")
    assert f"frozen by its cgroup's freezer ({cgroup}: FROZEN, state D)" in reason
