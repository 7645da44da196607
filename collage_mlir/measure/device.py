"""Device fingerprint: what a cost row was measured on (CPU model, ISA features, usable cores)."""

from __future__ import annotations

import hashlib
import os
import platform
from functools import lru_cache

#: ISA features that change which code backends generate (so timings from a CPU without them differ).
_FEATURES = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "asimd", "sve")


@lru_cache(maxsize=1)
def device_fingerprint() -> tuple[str, str]:
    """(fingerprint, description) of this host CPU: 16 hex digits of SHA-256 over the description."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    model = model or platform.processor() or "unknown"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    features = "+".join(f for f in _FEATURES if f in flags) or "none"
    description = f"cpu {platform.machine()} '{model}' {cores} cores [{features}]"
    return hashlib.sha256(description.encode()).hexdigest()[:16], description
