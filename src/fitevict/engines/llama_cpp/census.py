"""The devices a seat may use, as the engine build sees them, and whether each one's memory is host memory.

The census asks the build once (``llama-server [--rpc ENDPOINTS] --list-devices``, with ``devices.rpc`` from the
config) and keeps every device under the engine's own name. Whether a device is *unified* (its buffers are host
memory, so its bytes are RAM: ``fitevict.budget``'s rule counts them once) is learned, in this order:

1. declared: ``devices.uma`` in the config;
2. engine-reported: ggml-vulkan's device lines (``ggml_vulkan: 0 = NAME (DRIVER) | uma: 1 | ...`` for an integrated
   GPU, and its warning that a device's type is CPU, as lavapipe's is), where the listing's output has them (the
   pinned build logs them at debug level before its log is set up, so its listing does not);
3. machine-reported: the Vulkan loader's own account (asked of ``libvulkan.so.1`` in a child process, ``vkloader``, or
   else ``vulkaninfo --summary``: ``deviceType`` CPU or INTEGRATED_GPU is host memory, DISCRETE_GPU its own), matched
   by the device's name;
4. a labelled rule by backend: Metal shares memory (Apple silicon); RPC, CUDA and the rest have their own;
5. measured, later: a seat's committed PSS holds its device's allocated bytes (``seat.measure.memory_kind_seen``),
   which replaces a rule's word.

Pure but for ``take_census`` (which runs the engine).
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from fitevict.engines.llama_cpp import vkloader
from fitevict.engines.llama_cpp.devices import DeviceListError, EngineDevice, list_devices_text, parse_device_list

log = logging.getLogger("fitevict.devices")
VULKANINFO_TIMEOUT_S = 30.0
_VK_LINE = re.compile(r"ggml_vulkan: (?P<i>\d+) = .*\| uma: (?P<uma>\d)")
_VK_CPU = "Device type is CPU"
_SHARED_BACKENDS = {"Metal": "rule: a Metal device's memory is the host's (Apple silicon's unified memory)"}


@dataclass(frozen=True, slots=True)
class CensusDevice:
    """One device a seat may use: the engine's record, whether its memory is host memory and who said so, and for an
    RPC device the endpoint it lives behind."""

    device: EngineDevice
    unified: bool
    unified_source: str
    endpoint: str = ""  # RPC: HOST:PORT of its rpc-server

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def backend(self) -> str:
        return self.device.backend


@dataclass(frozen=True, slots=True)
class Census:
    """Every device the engine build lists (with ``rpc``), or none and why (``reason``)."""

    devices: tuple[CensusDevice, ...] = ()
    rpc: tuple[str, ...] = ()
    reason: str = ""

    def device(self, name: str) -> CensusDevice | None:
        return next((d for d in self.devices if d.name == name), None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    def learned(self, name: str, unified: bool, source: str) -> Census:
        """This census with ``name``'s memory kind as a measurement found it (a declaration still wins)."""
        out = []
        for d in self.devices:
            if d.name == name and not d.unified_source.startswith("declared"):
                d = replace(d, unified=unified, unified_source=source)
            out.append(d)
        return replace(self, devices=tuple(out))

    def to_json(self) -> dict:
        return {"devices": [{"name": d.name, "backend": d.backend, "description": d.device.description,
                             "total_bytes": d.device.total_bytes, "free_bytes": d.device.free_bytes,
                             "source": d.device.source, "unified": d.unified, "unified_source": d.unified_source,
                             "endpoint": d.endpoint} for d in self.devices],
                "rpc": list(self.rpc), "reason": self.reason}


def vulkan_kinds(text: str) -> dict[int, tuple[bool, str]]:
    """What ggml-vulkan said of each of its devices in ``text`` (by index): unified and why, where it said."""
    out: dict[int, tuple[bool, str]] = {}
    last: int | None = None
    for line in text.splitlines():
        m = _VK_LINE.search(line)
        if m:
            last = int(m["i"])
            if m["uma"] == "1":
                out[last] = (True, "engine-reported: ggml_vulkan uma: 1 (an integrated GPU shares host memory)")
            else:
                out[last] = (False, "engine-reported: ggml_vulkan uma: 0 (a discrete GPU)")
        elif _VK_CPU in line and last is not None:
            out[last] = (True, "engine-reported: ggml_vulkan device type CPU (its heap is host memory)")
    return out


_VKINFO_NAME = re.compile(r"^\s*deviceName\s*=\s*(?P<name>.+?)\s*$")
_VKINFO_TYPE = re.compile(r"^\s*deviceType\s*=\s*PHYSICAL_DEVICE_TYPE_(?P<type>\w+)\s*$")
_HOST_TYPES = {"CPU": "a CPU-type device: its heap is host memory", "INTEGRATED_GPU": "an integrated GPU shares "
               "host memory"}


def vulkaninfo_types(text: str) -> dict[str, str]:
    """Device name -> deviceType (``CPU``, ``INTEGRATED_GPU``, ``DISCRETE_GPU``, ...) in ``vulkaninfo --summary``."""
    out: dict[str, str] = {}
    kind: str | None = None
    for line in text.splitlines():
        if m := _VKINFO_TYPE.match(line):
            kind = m["type"]
        elif (m := _VKINFO_NAME.match(line)) and kind is not None:
            out[m["name"]] = kind
            kind = None
    return out


def memory_kind(dev: EngineDevice, text: str, declared: Mapping[str, bool],
                vk_types: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Whether ``dev``'s memory is host memory, and who said so (see the module doc for the order)."""
    if dev.name in declared:
        return declared[dev.name], "declared: devices.uma"
    if dev.backend == "Vulkan":
        said = vulkan_kinds(text).get(int(dev.name.removeprefix("Vulkan") or 0))
        if said is not None:
            return said
        kind = (vk_types or {}).get(dev.description)
        if kind is not None:
            why = _HOST_TYPES.get(kind, "its memory is its own")
            return kind in _HOST_TYPES, f"machine-reported: the Vulkan loader's deviceType {kind} ({why})"
        return False, "rule: neither ggml_vulkan nor vulkaninfo said what this device is; its own memory until a seat measures it"
    if dev.backend in _SHARED_BACKENDS:
        return True, _SHARED_BACKENDS[dev.backend]
    if dev.backend == "RPC":
        return False, "rule: an RPC device's memory lives in its rpc-server process"
    return False, f"rule: a {dev.backend} device has its own memory"


def census_of(text: str, rpc: Sequence[str], declared: Mapping[str, bool],
              vk_types: Mapping[str, str] | None = None) -> Census:
    """The census in a listing's output ``text`` (stdout and stderr) taken with ``rpc`` endpoints, ``vk_types`` what
    vulkaninfo says of each Vulkan device by name. Pure."""
    devs = parse_device_list(text)
    out = []
    rpc_i = 0
    for d in devs:
        endpoint = ""
        if d.backend == "RPC":
            endpoint = d.description.strip() if d.description.strip() in rpc else (
                rpc[rpc_i] if rpc_i < len(rpc) else "")
            rpc_i += 1
        unified, source = memory_kind(d, text, declared, vk_types)
        out.append(CensusDevice(d, unified, source, endpoint))
    return Census(tuple(out), tuple(rpc))


def take_census(binary: Path, *, rpc: Sequence[str] = (), declared: Mapping[str, bool] | None = None,
                env: Mapping[str, str] | None = None) -> Census:
    """Ask ``binary`` for its devices (see the module doc). A build that cannot list them gives an empty census that
    says why: the seats then run on the host and on the GPUs NVML sees."""
    try:
        text = list_devices_text(binary, rpc=rpc, env=env)
    except DeviceListError as e:
        return Census((), tuple(rpc), f"unavailable, because {e}")
    vk_types = read_vulkaninfo(env) if any(d.backend == "Vulkan" for d in parse_device_list(text)) else {}
    return census_of(text, rpc, declared or {}, vk_types)


def read_vulkaninfo(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the machine's Vulkan loader says of its devices: asked of the loader itself (``vkloader``), else of
    ``vulkaninfo --summary``; {} where neither answers (the census then falls back to a labelled rule and the seats'
    measurement)."""
    try:
        return vkloader.loader_types(env)
    except vkloader.LoaderError as e:
        log.info("the Vulkan loader could not be asked (%s): trying vulkaninfo", e)
    try:
        out = subprocess.run(["vulkaninfo", "--summary"], capture_output=True, text=True, timeout=VULKANINFO_TIMEOUT_S,
                             env=None if env is None else dict(env))
    except (OSError, subprocess.TimeoutExpired) as e:
        log.info("vulkaninfo --summary could not run (%s): the census falls back to a rule", e)
        return {}
    return vulkaninfo_types(out.stdout)
