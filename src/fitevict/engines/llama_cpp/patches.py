"""Source patches applied to the pinned llama.cpp at build time, each as small as the build's headers need.

A patch is a frozen record: the file it changes, the exact text it replaces, what it puts there, and the condition
under which it is needed. ``apply`` changes the source in place, idempotently, and returns the names of the patches
applied, which the build record keeps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class PatchError(RuntimeError):
    """A patch's text was not found where the pinned source should have it."""


@dataclass(frozen=True, slots=True)
class Patch:
    name: str
    file: str  # relative to the llama.cpp source root
    old: str
    new: str
    why: str
    needed: Callable[[], bool]


VULKAN_CORE_H = Path("/usr/include/vulkan/vulkan_core.h")


def _headers_lack_layer_settings(header: Path = VULKAN_CORE_H) -> bool:
    """Whether the system's Vulkan headers lack VK_EXT_layer_settings (Debian 12's 1.3.239 do)."""
    try:
        return "VK_EXT_LAYER_SETTINGS_EXTENSION_NAME" not in header.read_text(errors="replace")
    except OSError:
        return False  # no headers: the build's own configure step says so


_LAYER_OLD = """    VkBool32 enable_best_practice = layer_settings;
    std::vector<vk::LayerSettingEXT> settings = {
        {
            "VK_LAYER_KHRONOS_validation",
            "validate_best_practices",
            vk::LayerSettingTypeEXT::eBool32,
            1,
            &enable_best_practice
        },
    };
    vk::LayerSettingsCreateInfoEXT layer_setting_info(settings);
    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions, &layer_setting_info);
"""

VULKAN_LAYER_SETTINGS = Patch(
    name="vulkan-layer-settings-guard",
    file="ggml/src/ggml-vulkan/ggml-vulkan.cpp",
    old=_LAYER_OLD,
    new="#ifdef VK_EXT_LAYER_SETTINGS_EXTENSION_NAME\n" + _LAYER_OLD
        + "#else  // headers without VK_EXT_layer_settings: no validation-layer option\n"
        + "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions);\n"
        + "#endif\n",
    why="the Vulkan headers lack VK_EXT_layer_settings (before 1.3.261), which one block of instance creation uses "
        "only to set a validation-layer option",
    needed=_headers_lack_layer_settings,
)

# the patches each build variant may need, in order
PATCHES: dict[str, tuple[Patch, ...]] = {"vulkan": (VULKAN_LAYER_SETTINGS,)}


def apply(source: Path, variant: str) -> tuple[str, ...]:
    """Apply the variant's needed patches to ``source`` (llama.cpp's root); the names of those now in place."""
    applied: list[str] = []
    for p in PATCHES.get(variant, ()):
        if not p.needed():
            continue
        path = source / p.file
        text = path.read_text()
        if p.new in text:
            applied.append(p.name)
            continue
        if text.count(p.old) != 1:
            raise PatchError(f"patch {p.name}: the text to replace occurs {text.count(p.old)} times in {path} "
                             f"(expected once in the pinned source); delete the source folder and install again")
        path.write_text(text.replace(p.old, p.new))
        applied.append(p.name)
    return tuple(applied)
