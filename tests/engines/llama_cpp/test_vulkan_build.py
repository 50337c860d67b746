"""The Vulkan build on this machine's real Vulkan devices (Mesa's lavapipe where there is no GPU): what it lists,
with and without the device named, and whether the cache lookup chooses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fitevict.engines.llama_cpp import install as inst
from fitevict.engines.llama_cpp import patches, vulkan
from fitevict.engines.llama_cpp.devices import list_devices

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def vulkan_server() -> Path:
    """The Vulkan build's llama-server in fitevict's cache; the tests skip, saying why, only where it is absent."""
    if inst.read_stamp(variant="vulkan") is None:
        why = os.environ.get("FITEVICT_TEST_VULKAN_SKIP") or (
            "build it with: fitevict engine install llama.cpp --vulkan (./run.sh test does, as root with apt-get)")
        pytest.skip(f"the Vulkan build is not installed in {inst.installed_bin_dir(variant='vulkan')}: {why}")
    return inst.installed_bin_dir(variant="vulkan") / "llama-server"


def _env(**extra: str) -> dict[str, str]:
    """This environment without the user's Vulkan naming or engine choice, with PATH empty (no llama-server on
    it): the lookup comes down to the cache."""
    env = {k: v for k, v in os.environ.items() if k not in (vulkan.VISIBLE_ENV, inst.ENV_VAR)}
    return {**env, "PATH": "", **extra}


def _no_gpu_device_nodes() -> bool:
    """No DRM render node and no NVIDIA device node: no GPU a Vulkan driver could drive."""
    return not list(Path("/dev/dri").glob("renderD*")) and not Path("/dev/nvidia0").exists()


def test_the_build_is_recorded_with_its_flags_patches_and_rpc_server(vulkan_server: Path) -> None:
    stamp = inst.read_stamp(variant="vulkan")
    assert "-DGGML_VULKAN=ON" in stamp["cmake_flags"] and "-DGGML_RPC=ON" in stamp["cmake_flags"]
    assert stamp["patches"] == [p.name for p in patches.PATCHES["vulkan"] if p.needed()]
    assert os.access(vulkan_server.parent / "ggml-rpc-server", os.X_OK)


def test_lavapipe_is_vulkan0_only_when_named(vulkan_server: Path) -> None:
    named = list_devices(vulkan_server, env=_env(GGML_VK_VISIBLE_DEVICES="0"))
    assert [d.name for d in named if d.backend == "Vulkan"] == ["Vulkan0"]
    assert named[0].total_bytes > 0 and named[0].free_bytes > 0
    default = [d for d in list_devices(vulkan_server, env=_env()) if d.backend == "Vulkan"]
    # a CPU-type device is never used unless named; without a GPU the build lists nothing at all
    assert not any(d.description.startswith("llvmpipe") for d in default)
    if _no_gpu_device_nodes():
        assert default == []


def test_the_lookup_chooses_it_for_a_gpu_or_when_named(vulkan_server: Path) -> None:
    if inst.read_stamp(variant="cuda") is not None:
        pytest.skip("a CUDA build is installed here: the lookup prefers it to the Vulkan build")
    gpus = [d for d in list_devices(vulkan_server, env=_env()) if d.backend == "Vulkan"]
    r = inst.resolve_binary(env=_env())
    if gpus:
        assert r.path == vulkan_server and gpus[0].name in r.why
    else:  # this machine without a GPU (lavapipe only): the CPU build, saying why
        assert r.path == inst.installed_bin_dir() / "llama-server"
        assert "CPU build" in r.why and "lists no Vulkan device" in r.why
    r = inst.resolve_binary(env=_env(), vulkan_devices=(0,))
    assert r.path == vulkan_server and dict(r.env) == {vulkan.VISIBLE_ENV: "0"}
    assert "Vulkan build" in r.why and "Vulkan0" in r.why
    rpc = inst.resolve_binary("ggml-rpc-server", env=_env(), vulkan_devices=(0,))
    assert rpc.path == vulkan_server.parent / "ggml-rpc-server"


def test_engine_list_shows_every_build_and_which_the_lookup_chose(vulkan_server: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "fitevict.cli", "engine", "list", "--json"], capture_output=True,
                         text=True, timeout=120, env={**_env(), "PATH": os.environ.get("PATH", "")})
    assert out.returncode in (0, 1), out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert set(rows) == set(inst.BINARIES)
    builds = {b["variant"]: b for b in rows["llama-server"]["cached_builds"]}
    assert set(builds) == set(inst.VARIANTS)
    vk = builds["vulkan"]
    assert vk["installed"] and vk["bin_dir"] == str(vulkan_server.parent)
    assert vk["patches"] == inst.read_stamp(variant="vulkan")["patches"]
    assert vk["lookup"] in ("used", "shadowed") or vk["lookup"].startswith("passed over: the Vulkan build lists")
