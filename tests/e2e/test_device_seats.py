"""Seats on the engine's own devices, served through a real ``fitevict serve``: an RPC device (a real rpc-server,
its memory in another process) and a Vulkan device on lavapipe (unified memory, counted once)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from _frontdoor import front_door, history, poll
from _server import free_port
from fitevict.engines.llama_cpp.install import installed_bin_dir
from fitevict.engines.llama_cpp.rpcserver import rpc_server_binary, start_rpc_server
from fitevict.host import procmem

pytestmark = pytest.mark.e2e
MiB = 1024**2
VULKAN_BUILD = installed_bin_dir(variant="vulkan") / "llama-server"  # fitevict engine install llama.cpp --vulkan


@pytest.fixture
def rpc_server(tmp_path: Path, llama_server: Path):
    binary = rpc_server_binary(llama_server)
    if binary is None:
        pytest.fail(f"the engine build at {llama_server.parent} has no ggml-rpc-server: every build has RPC; "
                    "rebuild it (fitevict engine install llama.cpp)")
    server = start_rpc_server(binary, free_port(), tmp_path / "rpc-server.log")
    yield server
    server.stop()


def _complete(url: str, model: str) -> None:
    r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": "Once upon", "max_tokens": 4},
                   timeout=300)
    assert r.status_code == 200, r.text


def _resident(url: str, key: str) -> dict:
    views = httpx.get(url + "/v1/models/residents", timeout=30).json()["data"]
    return next(v for v in views if v["key"] == key)


def test_an_rpc_seat_goes_partial_is_measured_in_its_server_and_released_there(
        tmp_path: Path, models_dir: Path, llama_server: Path, rpc_server) -> None:
    idle = procmem.read_process(rpc_server.pid).committed_bytes
    assert idle is not None
    # RPC0 may hold 64 MiB: the ~200 MB model does not fit whole, so it goes partial in the engine's layer order
    env = {"FITEVICT_RPC": rpc_server.endpoint, "FITEVICT_LLAMA_SERVER": str(llama_server),
           "FITEVICT_GPU_LIMIT": "RPC0=64MiB"}
    with front_door(tmp_path, "--models-dir", str(models_dir), env=env, timeout=120) as fd:
        metrics = httpx.get(fd.base_url + "/metrics", timeout=30).text
        assert 'fitevict_budget_bytes{device="RPC0"' in metrics
        _complete(fd.base_url, "med-a")
        seat = _resident(fd.base_url, "med-a")
        cfg = seat["config"]
        assert cfg["devices"] == ["RPC0"] and cfg["rpc"] == [rpc_server.endpoint], cfg
        assert 0 < cfg["n_gpu_layers"], cfg
        assert seat["devices"]["CPU"]["planned_bytes"] > 64 * MiB  # the host keeps the layers RPC0 cannot
        rpc0 = seat["devices"]["RPC0"]
        assert rpc0["measured_bytes"] is not None and "rpc-server pid" in rpc0["measured_source"], rpc0
        # counted at what it can grow to (its buffers, untouched pages too), within RPC0's budget
        assert rpc0["allocated_bytes"] is not None, rpc0  # RPC0[HOST:PORT] buffers in the load log are RPC0's
        assert max(rpc0["measured_bytes"], rpc0["allocated_bytes"]) == rpc0["planned_bytes"] <= 64 * MiB, rpc0
        held = procmem.read_process(rpc_server.pid).committed_bytes
        # its buffers live in the rpc-server process: the server grew by what the seat's reading says (less what
        # the server itself touched since the reading)
        assert held - idle >= 0.9 * rpc0["measured_bytes"], (held, idle, rpc0)
        out = httpx.post(fd.base_url + "/v1/models/med-a/unload", timeout=120).json()
        assert out["unloaded"] and out["release_verified"], out
        ev = poll(lambda: [e for e in history(fd, event="unload") if e["model"] == "med-a"], "the unload event")[0]
        freed = ev["details"]["freed_by_device"]
        assert freed["RPC0"] >= 0.9 * ev["details"]["held_bytes"]["RPC0"] - 4 * MiB, ev["details"]
    back = procmem.read_process(rpc_server.pid).committed_bytes
    assert back - idle < 0.2 * (held - idle), (idle, held, back)  # its memory came back in the rpc-server


def test_two_rpc_devices_each_have_their_own_budget(tmp_path: Path, models_dir: Path, llama_server: Path,
                                                    rpc_server) -> None:
    binary = rpc_server_binary(llama_server)
    second = start_rpc_server(binary, free_port(), tmp_path / "rpc-server-2.log")
    try:
        env = {"FITEVICT_RPC": f"{rpc_server.endpoint},{second.endpoint}",
               "FITEVICT_LLAMA_SERVER": str(llama_server), "FITEVICT_GPU_LIMIT": "RPC0=48MiB,RPC1=48MiB"}
        with front_door(tmp_path, "--models-dir", str(models_dir), env=env, timeout=120) as fd:
            _complete(fd.base_url, "med-b")
            seat = _resident(fd.base_url, "med-b")
            assert seat["config"]["devices"] == ["RPC0", "RPC1"], seat["config"]
            for dev in ("RPC0", "RPC1"):
                fig = seat["devices"][dev]
                assert fig["planned_bytes"] <= 48 * MiB and fig["measured_bytes"] is not None, (dev, fig)
    finally:
        second.stop()


@pytest.mark.skipif(not VULKAN_BUILD.is_file(), reason=f"no Vulkan build at {VULKAN_BUILD} "
                    "(fitevict engine install llama.cpp --vulkan)")
def test_a_vulkan_seat_on_lavapipe_is_served_and_its_memory_counted_once(tmp_path: Path, models_dir: Path) -> None:
    env = {"FITEVICT_LLAMA_SERVER": str(VULKAN_BUILD), "GGML_VK_VISIBLE_DEVICES": "0",
           "FITEVICT_GPU_LIMIT": "Vulkan0=64MiB"}
    with front_door(tmp_path, "--models-dir", str(models_dir), env=env, timeout=120) as fd:
        metrics = httpx.get(fd.base_url + "/metrics", timeout=30).text
        if 'device="Vulkan0"' not in metrics:
            pytest.skip("the Vulkan build lists no Vulkan0 here (no lavapipe: mesa-vulkan-drivers)")
        unified = [ln for ln in metrics.splitlines() if ln.startswith('fitevict_device_unified{device="Vulkan0"')]
        assert len(unified) == 1 and unified[0].endswith(" 1.0"), unified  # lavapipe: a CPU-type device
        _complete(fd.base_url, "llama-gqa")
        seat = _resident(fd.base_url, "llama-gqa")
        assert seat["config"]["devices"] == ["Vulkan0"], seat["config"]
        vk, host = seat["devices"]["Vulkan0"], seat["devices"]["CPU"]
        assert vk["allocated_bytes"] > 0 and vk["measured_bytes"] is None, vk  # host memory: not read apart
        assert "host memory" in vk["measured_source"] and vk["planned_bytes"] == vk["allocated_bytes"]
        pss = seat["host_pss"]["committed_bytes"] + seat["host_pss"]["mapped_bytes"]
        # the seat's PSS holds Vulkan0's buffers: its host figure is the PSS less them, so that the two together are
        # the PSS (counted once), not the PSS and Vulkan0's bytes again
        logged = host["allocated_bytes"] + host["overhead_bytes"]
        assert host["planned_bytes"] == max(pss - vk["planned_bytes"], logged), (host, vk, pss)
        assert host["planned_bytes"] + vk["planned_bytes"] == max(pss, logged + vk["planned_bytes"])
        out = httpx.post(fd.base_url + "/v1/models/llama-gqa/unload", timeout=120).json()
        assert out["unloaded"] and out["release_verified"], out  # verified with the host: its bytes were RAM
        # the ~200 MB model does not fit Vulkan0's 64 MiB: partial, the rest of its layers on the host
        _complete(fd.base_url, "med-a")
        med = _resident(fd.base_url, "med-a")
        assert med["config"]["devices"] == ["Vulkan0"] and 0 < med["config"]["n_gpu_layers"], med["config"]
        assert med["devices"]["Vulkan0"]["planned_bytes"] <= 64 * MiB < med["devices"]["CPU"]["planned_bytes"]
