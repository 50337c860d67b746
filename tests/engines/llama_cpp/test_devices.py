"""The engine's own device list, parsed: names as -dev takes them, sizes as the engine reports them."""

from __future__ import annotations

import pytest

from fitevict.engines.llama_cpp.devices import DeviceListError, list_devices, parse_device_list
from fitevict.units import MiB

LISTED = """ggml_vulkan: Found 1 Vulkan devices:
ggml_vulkan: 0 = llvmpipe (LLVM 15.0.6, 256 bits) (llvmpipe) | uma: 0 | fp16: 1 | bf16: 0 | warp size: 8
Available devices:
  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2047 MiB free)
  RPC0: 127.0.0.1:50052 (24105 MiB, 24105 MiB free)
  RPC1: 127.0.0.1:50053 (100 MiB, 0 MiB free)
"""


def test_each_listed_device_keeps_its_engine_name_backend_and_sizes() -> None:
    got = parse_device_list(LISTED)
    assert [(d.name, d.backend, d.description) for d in got] == [
        ("Vulkan0", "Vulkan", "llvmpipe (LLVM 15.0.6, 256 bits)"),
        ("RPC0", "RPC", "127.0.0.1:50052"),
        ("RPC1", "RPC", "127.0.0.1:50053"),
    ]
    assert (got[0].total_bytes, got[0].free_bytes) == (2048 * MiB, 2047 * MiB)
    assert got[2].free_bytes == 0
    assert all("engine-reported" in d.source for d in got)


def test_a_build_without_devices_lists_none() -> None:
    assert parse_device_list("Available devices:\n  (none)\n") == ()


def test_a_binary_that_cannot_list_says_what_it_said(tmp_path) -> None:
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'error: unknown argument: --list-devices' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(DeviceListError, match="exited 1.*unknown argument"):
        list_devices(fake)
