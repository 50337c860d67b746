"""The census: the engine's devices with whether each one's memory is host memory, and who said so."""

from __future__ import annotations

import pytest

from fitevict.engines.llama_cpp.census import census_of, vulkan_kinds
from fitevict.units import MiB

# ggml-vulkan's device lines, where a build's listing carries them, with two rpc-servers: lavapipe is CPU-type
LAVAPIPE = """ggml_vulkan: Found 1 Vulkan devices:
ggml_vulkan: 0 = llvmpipe (LLVM 15.0.6, 256 bits) (llvmpipe) | uma: 0 | fp16: 1 | bf16: 0 | warp size: 8
ggml_vulkan: Warning: Device type is CPU. This is probably not the device you want.
Available devices:
  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)
  RPC0: 127.0.0.1:50052 (24105 MiB, 24105 MiB free)
  RPC1: 127.0.0.1:50053 (24105 MiB, 24000 MiB free)
"""
# an integrated GPU (uma: 1) beside a discrete one
TWO_GPUS = """ggml_vulkan: 0 = AMD Radeon 890M (RADV GFX1150) (radv) | uma: 1 | fp16: 1 | warp size: 64
ggml_vulkan: 1 = AMD Radeon RX 7900 XTX (RADV NAVI31) (radv) | uma: 0 | fp16: 1 | warp size: 64
Available devices:
  Vulkan0: AMD Radeon 890M (RADV GFX1150) (16384 MiB, 15000 MiB free)
  Vulkan1: AMD Radeon RX 7900 XTX (RADV NAVI31) (24560 MiB, 24000 MiB free)
"""


def test_a_cpu_type_vulkan_device_is_unified_as_the_engine_says() -> None:
    c = census_of(LAVAPIPE, ("127.0.0.1:50052", "127.0.0.1:50053"), {})
    vk = c.device("Vulkan0")
    assert vk is not None and vk.unified and "device type CPU" in vk.unified_source
    assert vk.unified_source.startswith("engine-reported")
    assert vk.device.total_bytes == 2048 * MiB


def test_rpc_devices_keep_their_endpoints_and_their_own_memory() -> None:
    c = census_of(LAVAPIPE, ("127.0.0.1:50052", "127.0.0.1:50053"), {})
    rpc = [d for d in c.devices if d.backend == "RPC"]
    assert [(d.name, d.endpoint, d.unified) for d in rpc] == [("RPC0", "127.0.0.1:50052", False),
                                                              ("RPC1", "127.0.0.1:50053", False)]


def test_integrated_and_discrete_vulkan_gpus_are_told_apart_by_uma() -> None:
    kinds = vulkan_kinds(TWO_GPUS)
    assert kinds[0][0] is True and "uma: 1" in kinds[0][1]
    assert kinds[1][0] is False
    c = census_of(TWO_GPUS, (), {})
    assert [d.unified for d in c.devices] == [True, False]


def test_a_declaration_wins_over_the_engine_and_over_a_measurement() -> None:
    c = census_of(LAVAPIPE, (), {"Vulkan0": False, "RPC0": True})
    assert c.device("Vulkan0").unified is False and c.device("Vulkan0").unified_source == "declared: devices.uma"
    assert c.device("RPC0").unified is True
    assert c.learned("Vulkan0", True, "measured: x").device("Vulkan0").unified is False
    c2 = census_of(TWO_GPUS, (), {})
    learned = c2.learned("Vulkan1", True, "measured: its PSS grew by the device's bytes")
    assert learned.device("Vulkan1").unified and learned.device("Vulkan1").unified_source.startswith("measured")


def test_without_the_engine_s_word_a_vulkan_device_is_its_own_memory_by_a_labelled_rule() -> None:
    text = "Available devices:\n  Vulkan0: Some GPU (8192 MiB, 8000 MiB free)\n"
    d = census_of(text, (), {}).device("Vulkan0")
    assert d is not None and d.unified is False and d.unified_source.startswith("rule:")


# what `vulkaninfo --summary` prints on this kind of machine (Mesa's lavapipe) and on one with two GPUs
VULKANINFO = """Devices:
========
GPU0:
\tapiVersion         = 1.3.230
\tdeviceType         = PHYSICAL_DEVICE_TYPE_CPU
\tdeviceName         = llvmpipe (LLVM 15.0.6, 256 bits)
\tdriverID           = DRIVER_ID_MESA_LLVMPIPE
GPU1:
\tdeviceType         = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU
\tdeviceName         = AMD Radeon RX 7900 XTX (RADV NAVI31)
"""


def test_without_the_engine_s_word_the_machine_s_vulkan_loader_says_what_a_device_is() -> None:
    from fitevict.engines.llama_cpp.census import vulkaninfo_types

    types = vulkaninfo_types(VULKANINFO)
    assert types == {"llvmpipe (LLVM 15.0.6, 256 bits)": "CPU", "AMD Radeon RX 7900 XTX (RADV NAVI31)": "DISCRETE_GPU"}
    listing = ("Available devices:\n  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB free)\n"
               "  Vulkan1: AMD Radeon RX 7900 XTX (RADV NAVI31) (24560 MiB, 24000 MiB free)\n")
    c = census_of(listing, (), {}, types)
    assert c.device("Vulkan0").unified and c.device("Vulkan0").unified_source.startswith("machine-reported")
    assert c.device("Vulkan1").unified is False and "DISCRETE_GPU" in c.device("Vulkan1").unified_source


def test_the_vulkan_loader_itself_names_every_device_and_its_type() -> None:
    from fitevict.engines.llama_cpp import vkloader

    try:
        types = vkloader.loader_types()
    except vkloader.LoaderError as e:
        pytest.skip(f"no Vulkan loader to ask here: {e}")
    assert types and all(kind in vkloader.DEVICE_TYPES.values() for kind in types.values()), types
    # the child's answer is the loader's own: a CPU-type device (lavapipe) is reported as CPU
    if any(name.startswith("llvmpipe") for name in types):
        assert {types[n] for n in types if n.startswith("llvmpipe")} == {"CPU"}


def test_a_machine_without_a_vulkan_loader_is_told_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from fitevict.engines.llama_cpp import vkloader

    def no_library(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(vkloader.ctypes, "CDLL", no_library)
    with pytest.raises(vkloader.LoaderError, match="no Vulkan loader .libvulkan.so.1"):
        vkloader.ask_loader()
