"""What the machine's Vulkan loader says of its physical devices: name -> deviceType (``CPU``, ``INTEGRATED_GPU``,
``DISCRETE_GPU``, ...), asked of ``libvulkan.so.1`` itself through ctypes.

It needs only the loader the Vulkan build already needs (``libvulkan-dev``), not the ``vulkaninfo`` tool. It runs in
a child process (``python -m fitevict.engines.llama_cpp.vkloader`` prints JSON), so that the drivers the loader opens
(lavapipe brings LLVM) never enter the front door's memory.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from collections.abc import Mapping

TIMEOUT_S = 30.0
DEVICE_TYPES = {0: "OTHER", 1: "INTEGRATED_GPU", 2: "DISCRETE_GPU", 3: "VIRTUAL_GPU", 4: "CPU"}
_API_1_1 = (1 << 22) | (1 << 12)  # VK_MAKE_API_VERSION(0, 1, 1, 0)
_PROPERTIES_BYTES = 4096  # VkPhysicalDeviceProperties is about 824 bytes; its head is all that is read
_NAME_OFFSET, _NAME_BYTES = 20, 256  # apiVersion, driverVersion, vendorID, deviceID, deviceType, then deviceName


class _AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]


class _InstanceInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(_AppInfo)), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


class LoaderError(RuntimeError):
    """The Vulkan loader could not be asked; the message says why."""


def ask_loader() -> dict[str, str]:
    """Every physical device the loader enumerates, by name, with its deviceType (in this process)."""
    try:
        vk = ctypes.CDLL("libvulkan.so.1")
    except OSError as e:
        raise LoaderError(f"no Vulkan loader (libvulkan.so.1: {e})") from e
    app = _AppInfo(0, None, b"fitevict", 1, b"fitevict", 1, _API_1_1)
    info = _InstanceInfo(1, None, 0, ctypes.pointer(app), 0, None, 0, None)
    instance = ctypes.c_void_p()
    rc = vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance))
    if rc != 0:
        raise LoaderError(f"vkCreateInstance returned VkResult {rc}")
    try:
        count = ctypes.c_uint32(0)
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        handles = (ctypes.c_void_p * count.value)()
        rc = vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
        if rc not in (0, 5):  # VK_SUCCESS, VK_INCOMPLETE
            raise LoaderError(f"vkEnumeratePhysicalDevices returned VkResult {rc}")
        out: dict[str, str] = {}
        for handle in handles[: count.value]:
            props = ctypes.create_string_buffer(_PROPERTIES_BYTES)
            vk.vkGetPhysicalDeviceProperties(ctypes.c_void_p(handle), props)
            kind = int.from_bytes(props.raw[16:20], "little")
            name = props.raw[_NAME_OFFSET:_NAME_OFFSET + _NAME_BYTES].split(b"\0", 1)[0].decode(errors="replace")
            out[name] = DEVICE_TYPES.get(kind, f"UNKNOWN_{kind}")
        return out
    finally:
        vk.vkDestroyInstance(instance, None)


def loader_types(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``ask_loader`` in a child process; raises LoaderError with the child's reason when it cannot answer."""
    try:
        out = subprocess.run([sys.executable, "-m", __name__], capture_output=True, text=True, timeout=TIMEOUT_S,
                             env=None if env is None else dict(env))
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LoaderError(f"the Vulkan loader query did not finish ({e})") from e
    if out.returncode != 0:
        raise LoaderError((out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1])
    return json.loads(out.stdout)


def main() -> int:
    try:
        print(json.dumps(ask_loader()))
    except LoaderError as e:
        print(f"LoaderError: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
