"""The host CPU as /proc/cpuinfo names it: its model and ISA flags (what a backend's availability and a cost
row's device fingerprint read)."""

from __future__ import annotations

import platform
from functools import lru_cache


@lru_cache(maxsize=1)
def host_cpu() -> tuple[str, frozenset[str]]:
    """(model name, ISA flags) of this machine's CPU; the flags are empty where /proc/cpuinfo is unreadable."""
    model, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = frozenset(value.split())
    except OSError:
        pass
    return model or platform.processor() or "unknown", flags
