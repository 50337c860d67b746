"""GPU readings through NVML: a fake driver at the library edge, the real pynvml where it loads."""

from __future__ import annotations

from fitevict.host.nvml import read_gpus

from .fake_nvml import FakeGpu, FakeNvml

GiB = 1024**3


def two_gpus() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu("NVIDIA A", "GPU-aaaa-1111", total=24 * GiB, used=5 * GiB, processes=[(101, 3 * GiB), (102, 1 * GiB)]),
            FakeGpu("NVIDIA B", "GPU-bbbb-2222", total=80 * GiB, used=1 * GiB, processes=[(101, 512 * 1024**2)]),
        ]
    )


def test_devices_named_as_llama_cpp_names_them_with_nvml_numbers() -> None:
    nvml = two_gpus()
    r = read_gpus(nvml, environ={})
    assert r.reason == "" and r.available
    assert [d.name for d in r.devices] == ["CUDA0", "CUDA1"]
    a, b = r.devices
    assert (a.model, a.uuid, a.total_bytes, a.used_bytes, a.free_bytes) == ("NVIDIA A", "GPU-aaaa-1111", 24 * GiB, 5 * GiB, 19 * GiB)
    assert [(p.pid, p.used_bytes) for p in a.processes] == [(101, 3 * GiB), (102, 1 * GiB)]
    assert b.total_bytes == 80 * GiB and b.source == "nvml"
    assert nvml.inits == nvml.shutdowns == 1  # every init is paired with a shutdown


def test_bytes_of_a_process_set_per_device() -> None:
    r = read_gpus(two_gpus(), environ={})
    # pid 101 holds 3 GiB on CUDA0 and 512 MiB on CUDA1; with 102 CUDA0 adds 1 GiB
    assert r.used_by({101}) == {"CUDA0": 3 * GiB, "CUDA1": 512 * 1024**2}
    assert r.used_by({101, 102}) == {"CUDA0": 4 * GiB, "CUDA1": 512 * 1024**2}
    assert r.used_by({999}) == {"CUDA0": 0, "CUDA1": 0}  # read, and the process holds nothing there


def test_unattributed_process_memory_is_none_never_zero() -> None:
    nvml = FakeNvml([FakeGpu(processes=[(7, None)])])
    r = read_gpus(nvml, environ={})
    assert r.devices[0].processes[0].used_bytes is None
    assert r.devices[0].processes[0].reason
    assert r.used_by({7}) == {"CUDA0": None}


def test_unlistable_processes_say_why() -> None:
    r = read_gpus(FakeNvml([FakeGpu(broken_processes=True)]), environ={})
    d = r.devices[0]
    assert d.processes == () and "Not Supported" in d.processes_reason
    assert r.used_by({1}) == {"CUDA0": None}


def test_no_driver_reports_no_gpu_with_the_reason() -> None:
    nvml = FakeNvml(init_error="Driver Not Loaded")
    r = read_gpus(nvml, environ={})
    assert r.devices == () and not r.available
    assert r.reason.startswith("no NVIDIA GPU: ") and "Driver Not Loaded" in r.reason


def test_zero_devices_is_no_gpu() -> None:
    nvml = FakeNvml([])
    r = read_gpus(nvml, environ={})
    assert r.devices == () and "0 devices" in r.reason
    assert nvml.inits == nvml.shutdowns == 1


def test_one_unreadable_device_is_skipped_and_named() -> None:
    nvml = FakeNvml([FakeGpu(broken_memory=True), FakeGpu("NVIDIA B", "GPU-bbbb")])
    r = read_gpus(nvml, environ={})
    assert [(d.name, d.index) for d in r.devices] == [("CUDA1", 1)]
    assert "CUDA0" in r.reason and "GPU is lost" in r.reason


def test_cuda_visible_devices_reorders_and_hides() -> None:
    nvml = two_gpus()
    by_index = read_gpus(nvml, environ={"CUDA_VISIBLE_DEVICES": "1"})
    assert [(d.name, d.index, d.model) for d in by_index.devices] == [("CUDA0", 1, "NVIDIA B")]
    by_uuid = read_gpus(nvml, environ={"CUDA_VISIBLE_DEVICES": "GPU-bbbb,GPU-aaaa"})
    assert [(d.name, d.index) for d in by_uuid.devices] == [("CUDA0", 1), ("CUDA1", 0)]
    # CUDA stops enumerating at the first entry that is not a device
    cut = read_gpus(nvml, environ={"CUDA_VISIBLE_DEVICES": "0,7,1"})
    assert [d.index for d in cut.devices] == [0] and "'7'" in cut.reason
    hidden = read_gpus(nvml, environ={"CUDA_VISIBLE_DEVICES": ""})
    assert hidden.devices == () and hidden.reason.startswith("no NVIDIA GPU: ")


def test_real_pynvml_reads_or_says_why() -> None:
    """Against the real pynvml: with a driver, every device NVML lists with its total memory; without one, the
    reason NVML itself gave (so a reader that swallowed the error or never called NVML fails here)."""
    import pynvml

    r = read_gpus(environ={})
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        assert not r.available and r.devices == ()
        assert r.reason == f"no NVIDIA GPU: NVML init failed: {e}"
        return
    try:
        totals = [int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total)
                  for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()
    assert r.available
    assert [(d.name, d.total_bytes) for d in r.devices] == [(f"CUDA{i}", t) for i, t in enumerate(totals)]
