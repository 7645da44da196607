"""Device fingerprint: what a cost row was measured on. On the CPU: the CPU model, ISA features and usable
cores. In a GPU program: the GPU IREE's driver sees (name and identity), plus the host CPU, which runs the
program's host engines and its glue."""

from __future__ import annotations

import hashlib
import os
import platform as host
from functools import lru_cache

from collage_runtime.types import Platform

from ..backends.host import host_cpu

#: ISA features that change which code backends generate (so timings from a CPU without them differ).
_FEATURES = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "asimd", "sve")


@lru_cache(maxsize=1)
def _cpu() -> str:
    model, flags = host_cpu()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    features = "+".join(f for f in _FEATURES if f in flags) or "none"
    return f"cpu {host.machine()} '{model}' {cores} cores [{features}]"


def platform_devices(platform: Platform) -> list[str]:
    """Names of the devices IREE's driver for ``platform`` sees here (the CPU: always one)."""
    if platform is Platform.CPU:
        return [_cpu()]
    import iree.runtime as rt

    try:
        found = rt.get_driver(platform.driver).query_available_devices()
    except (RuntimeError, ValueError):  # no driver library (libcuda.so, a Vulkan loader) or no device
        return []
    return [str(d.get("name", "?")) for d in found]


@lru_cache(maxsize=4)
def device_fingerprint(platform: Platform = Platform.CPU) -> tuple[str, str]:
    """(fingerprint, description) of this machine for programs on ``platform``: 16 hex digits of SHA-256
    over the description. A GPU platform's description names its first device and the host CPU."""
    description = _cpu()
    if platform is not Platform.CPU:
        devices = platform_devices(platform)
        description = f"{platform.value} '{devices[0] if devices else 'none'}' on {description}"
    return hashlib.sha256(description.encode()).hexdigest()[:16], description


def platform_problem(platform: Platform) -> str | None:
    """Why programs on ``platform`` cannot be measured here, else None."""
    if platform is Platform.CPU or platform_devices(platform):
        return None
    return (f"no {platform.value} device here (IREE's {platform.driver} driver lists none): compile for it here "
            f"(collage compile --device {platform.value}), measure and tune on a machine that has one")
