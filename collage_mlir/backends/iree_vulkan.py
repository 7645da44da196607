"""`iree-vulkan`: IREE SPIR-V codegen on Vulkan, the default backend of a Vulkan program.

IREE's generic Vulkan target (SPIR-V 1.3 with few capabilities) runs on any Vulkan 1.1 driver: real GPUs
and Mesa's software rasteriser (``llvmpipe``, ``apt-get install mesa-vulkan-drivers libvulkan1``), on
which CI tests device-only buffers. ``--iree-vulkan-target=...`` among the IREE flags picks another target.
"""

from __future__ import annotations

from .iree_codegen import IreeCodegenBackend, Platform


class IreeVulkanBackend(IreeCodegenBackend):
    name = "iree-vulkan"
    platform = Platform.VULKAN
    install_hint = "apt-get install mesa-vulkan-drivers libvulkan1 (or a GPU's Vulkan driver)"
    target_flags = ("--iree-hal-target-device=vulkan",)
    kernel_arch = "spirv"
