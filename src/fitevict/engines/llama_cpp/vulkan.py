"""llama.cpp's Vulkan build: what building it needs, and whether the cache lookup may choose it on this machine.

ggml-vulkan uses discrete and integrated GPUs by default and skips CPU-type devices (Mesa's lavapipe) unless
``GGML_VK_VISIBLE_DEVICES`` names them. So the Vulkan build earns the lookup's choice on its own only where it lists a
device with the environment it will run in: a real GPU, or a device the user named (``engine.vulkan_devices`` or
their own ``GGML_VK_VISIBLE_DEVICES``). The answer costs an engine start, so it is stored per binary file (path,
size, modification time), per naming, and per installed Vulkan driver manifest: a door's lookup reads it back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fitevict.engines.llama_cpp.devices import DeviceListError, EngineDevice, list_devices
from fitevict.paths import cache_dir

VISIBLE_ENV = "GGML_VK_VISIBLE_DEVICES"  # the engine's own variable: which Vulkan devices it may use, by index
# Debian's packages for a Vulkan build and its devices: the loader's headers, the shader compiler, SPIR-V headers
# (CMake config), and Mesa's drivers (lavapipe on any CPU, radv for AMD, anv for Intel)
PACKAGES: tuple[str, ...] = ("mesa-vulkan-drivers", "libvulkan-dev", "glslc", "spirv-headers")
LOOKUP_VERSION = 1  # the stored answer's form changed: older ones are not read
_ICD_DIRS = ("usr/share/vulkan/icd.d", "etc/vulkan/icd.d", "usr/local/share/vulkan/icd.d")
_SPIRV_CONFIGS = ("usr/share/cmake/SPIRV-Headers", "usr/lib/cmake/SPIRV-Headers", "usr/local/share/cmake/SPIRV-Headers",
                  "usr/lib/x86_64-linux-gnu/cmake/SPIRV-Headers", "usr/lib/aarch64-linux-gnu/cmake/SPIRV-Headers")


def missing(root: Path = Path("/"), env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """[(what, Debian package)] for each thing a Vulkan build (and a device to run it on) needs that is absent."""
    env = os.environ if env is None else env
    out: list[tuple[str, str]] = []
    if not (root / "usr/include/vulkan/vulkan.h").is_file():
        out.append(("the Vulkan headers (vulkan/vulkan.h)", "libvulkan-dev"))
    if not shutil.which("glslc", path=env.get("PATH")):
        out.append(("the shader compiler glslc", "glslc"))
    if not any((root / d / "SPIRV-HeadersConfig.cmake").is_file() for d in _SPIRV_CONFIGS):
        out.append(("SPIR-V headers (CMake's SPIRV-HeadersConfig.cmake)", "spirv-headers"))
    if not driver_manifests(root, env):
        out.append(("a Vulkan driver (no ICD manifest in " + ", ".join("/" + d for d in _ICD_DIRS) + ")",
                    "mesa-vulkan-drivers"))
    return out


def driver_manifests(root: Path = Path("/"), env: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """The Vulkan loader's driver manifests: ``$VK_DRIVER_FILES`` / ``$VK_ICD_FILENAMES`` when set, else the
    system's ICD folders."""
    env = os.environ if env is None else env
    named = env.get("VK_DRIVER_FILES") or env.get("VK_ICD_FILENAMES")
    if named:
        return tuple(Path(p) for p in named.split(os.pathsep) if p)
    return tuple(sorted(p for d in _ICD_DIRS if (root / d).is_dir() for p in (root / d).glob("*.json")))


@dataclass(frozen=True, slots=True)
class VulkanChoice:
    """What the Vulkan build lists with the environment it would run in, and so whether the lookup may choose it."""

    binary: Path
    visible: str | None  # GGML_VK_VISIBLE_DEVICES as it would run (configured or the user's), None: not set
    devices: tuple[EngineDevice, ...]  # its Vulkan devices
    error: str | None = None  # why it could not list them
    stored: bool = False  # read back from an earlier lookup, not asked now

    @property
    def chosen(self) -> bool:
        return self.error is None and bool(self.devices)

    def words(self) -> str:
        """Why the lookup chooses it or not, with the devices it lists."""
        named = f"with {VISIBLE_ENV}={self.visible}" if self.visible is not None else f"without {VISIBLE_ENV}"
        if self.error is not None:
            return f"the Vulkan build could not list its devices ({self.error})"
        if self.devices:
            listed = ", ".join(f"{d.name}: {d.description}" for d in self.devices)
            return f"the Vulkan build lists {listed} ({named})"
        if self.visible is not None:
            return f"the Vulkan build lists no Vulkan device {named}: no device has those indices"
        return (f"the Vulkan build lists no Vulkan device {named}: no discrete or integrated GPU, and CPU-type "
                f"devices such as lavapipe are used only when named (engine.vulkan_devices, or {VISIBLE_ENV})")


def visible_setting(configured: Sequence[int] | None, env: Mapping[str, str]) -> str | None:
    """GGML_VK_VISIBLE_DEVICES as a seat will run: the configured indices, else the user's own variable."""
    if configured:
        return ",".join(str(i) for i in configured)
    return env.get(VISIBLE_ENV)


def lookup(binary: Path, env: Mapping[str, str], visible: str | None) -> VulkanChoice:
    """The Vulkan devices ``binary`` lists with ``visible`` named (or not); stored per binary file and naming."""
    run_env = {k: v for k, v in env.items() if k != VISIBLE_ENV}
    if visible is not None:
        run_env[VISIBLE_ENV] = visible
    key = _lookup_key(binary, visible, run_env)
    path = cache_dir() / "probe" / f"vulkan-lookup-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
    kept = _stored(path, key, binary, visible)
    if kept is not None:
        return kept
    try:
        devices = tuple(d for d in list_devices(binary, env=run_env) if d.backend == "Vulkan")
        error = None
    except DeviceListError as e:
        devices, error = (), str(e)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, "error": error, "devices": [
        {"name": d.name, "description": d.description, "total_bytes": d.total_bytes, "free_bytes": d.free_bytes,
         "source": d.source} for d in devices]}))
    os.replace(tmp, path)
    return VulkanChoice(binary, visible, devices, error)


def _stored(path: Path, key: str, binary: Path, visible: str | None) -> VulkanChoice | None:
    """The answer stored for this key; None when it was never asked (or the record cannot be read: asked again)."""
    try:
        kept = json.loads(path.read_text())
        if kept.get("key") != key:
            return None
        return VulkanChoice(binary, visible, tuple(EngineDevice(**d) for d in kept["devices"]), kept["error"],
                            stored=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _lookup_key(binary: Path, visible: str | None, env: Mapping[str, str]) -> str:
    """The binary file (path, size, mtime), the naming, and the driver manifests: a change to any asks again."""
    st = binary.stat()
    drivers = [f"{p}:{p.stat().st_mtime_ns}" for p in driver_manifests(env=env) if p.exists()]
    return json.dumps([LOOKUP_VERSION, str(binary.resolve()), st.st_size, st.st_mtime_ns, visible, drivers])
