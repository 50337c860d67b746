"""DRM fdinfo: per-process device memory for amdgpu, i915 and xe, on recorded fdinfo text, and a real /proc read
where this machine has a DRM device."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fitevict.host.fdinfo import drm_devices, parse_fdinfo, read_drm_usage

KiB, MiB = 1024, 1024**2

# as the kernel's drivers print them (Documentation/gpu/drm-usage-stats.rst and the drivers' fdinfo callbacks)
AMDGPU = """pos:\t0
flags:\t02100002
mnt_id:\t24
drm-driver:\tamdgpu
drm-client-id:\t42
drm-pdev:\t0000:03:00.0
pasid:\t32771
drm-memory-vram:\t1048576 KiB
drm-memory-gtt: \t2048 KiB
drm-memory-cpu: \t0 KiB
amd-memory-visible-vram:\t1048576 KiB
drm-engine-gfx:\t1000 ns
"""
AMDGPU_NEW = """drm-driver:\tamdgpu
drm-client-id:\t43
drm-pdev:\t0000:03:00.0
drm-total-vram:\t524288 KiB
drm-resident-vram:\t524288 KiB
drm-total-gtt:\t4096 KiB
drm-total-cpu:\t0
"""
I915 = """drm-driver:\ti915
drm-client-id:\t7
drm-pdev:\t0000:00:02.0
drm-total-system0:\t65536 KiB
drm-resident-system0:\t65536 KiB
drm-total-local0:\t262144 KiB
drm-resident-local0:\t262144 KiB
drm-engine-render:\t12345 ns
"""
XE = """drm-driver:\txe
drm-client-id:\t9
drm-pdev:\t0000:4d:00.0
drm-total-system:\t8 MiB
drm-total-gtt:\t0
drm-total-vram0:\t2 GiB
drm-resident-vram0:\t2 GiB
"""
NOT_DRM = "pos:\t0\nflags:\t0100002\nmnt_id:\t15\nino:\t1234\n"


def test_each_driver_s_device_memory_and_system_memory_apart() -> None:
    amd = parse_fdinfo(AMDGPU)
    assert amd is not None and (amd.driver, amd.pdev, amd.client_id) == ("amdgpu", "0000:03:00.0", "42")
    assert amd.device_bytes == 1048576 * KiB and amd.system_bytes == 2048 * KiB  # vram; gtt + cpu apart
    assert parse_fdinfo(AMDGPU_NEW).device_bytes == 512 * MiB  # drm-total-* wins over drm-memory-*
    i915 = parse_fdinfo(I915)
    assert i915.device_bytes == 256 * MiB and i915.system_bytes == 64 * MiB
    assert parse_fdinfo(XE).device_bytes == 2 * 1024**3 and parse_fdinfo(XE).system_bytes == 8 * MiB
    assert parse_fdinfo(NOT_DRM) is None


def _proc(tmp: Path, files: dict[int, list[str]]) -> Path:
    for pid, texts in files.items():
        d = tmp / str(pid) / "fdinfo"
        d.mkdir(parents=True)
        for i, t in enumerate(texts):
            (d / str(i + 3)).write_text(t)
    return tmp


def test_a_client_shared_by_several_fds_and_processes_counts_once(tmp_path: Path) -> None:
    # the engine and its child both hold fds of client 42; client 43 is a second context on the same card
    proc = _proc(tmp_path, {100: [AMDGPU, AMDGPU, NOT_DRM, AMDGPU_NEW], 101: [AMDGPU]})
    use = read_drm_usage([100, 101, 999], proc)  # 999: gone before the read
    assert use.device_bytes == {"0000:03:00.0": 1024 * MiB + 512 * MiB}
    assert use.drivers == {"0000:03:00.0": "amdgpu"} and use.reason == ""


@pytest.mark.skipif(not drm_devices(), reason="this machine has no DRM device (/dev/dri is absent)")
def test_a_real_process_holding_a_drm_device_is_read_from_proc() -> None:
    node = next(n for n in drm_devices() if "render" in n)
    fd = os.open(node, os.O_RDWR)
    try:
        use = read_drm_usage([os.getpid()])
        assert use.reason == "" and use.drivers, "an open render node is a DRM client with an fdinfo"
        assert all(n >= 0 for n in use.device_bytes.values())
    finally:
        os.close(fd)
