"""Program: an artifact directory loaded into one IREE VM context."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Callable, Sequence

import iree.runtime as rt
import numpy as np

from .rt_module import create_rt_module

MANIFEST = "manifest.json"

#: Builds an extra VM module (e.g. IREE's `check` module for conformance tests) on the program's device.
ModuleFactory = Callable[[rt.HalDevice], rt.VmModule]


class ArtifactError(Exception):
    """The artifact directory is missing, incomplete or from an incompatible version."""


class Program:
    """A loaded artifact. ``invoke(name, *arrays)`` runs a public function and returns numpy arrays."""

    def __init__(self, root: str | Path, *, driver: str = "local-task", extra_modules: Sequence[ModuleFactory] = ()):
        self.root = Path(root)
        try:
            self.manifest = json.loads((self.root / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise ArtifactError(f"{self.root / MANIFEST}: cannot read artifact manifest ({exc})") from None
        if self.manifest.get("format") != "collage-artifact":
            raise ArtifactError(f"{self.root / MANIFEST}: not a collage artifact manifest")
        self.config = rt.Config(driver)
        device = self.config.device
        devices = len(self.manifest.get("devices") or ()) or 1
        if devices > 1:
            # The program's logical devices (codegen configurations, see the manifest's "devices") differ
            # only in the code compiled for them: one local device serves them all, so they share memory
            # and one task pool, and the context tears down like a single-device one.
            self.config.default_vm_modules = (
                rt.create_hal_module(self.config.vm_instance, devices=[device] * devices),)
        vmfb = (self.root / self.manifest["module"]).read_bytes()
        self._main = rt.VmModule.copy_buffer(self.config.vm_instance, vmfb)
        # Keep every module object alive as long as the context: a temporary segfaults later.
        self._modules = [create_rt_module(device, self.root, self.manifest["regions"])]
        self._modules += [factory(device) for factory in extra_modules]
        self._context = rt.SystemContext(
            vm_modules=(*self.config.default_vm_modules, *self._modules, self._main), config=self.config
        )
        self._functions = getattr(self._context.modules, self._main.name)

    @property
    def vm_module(self) -> rt.VmModule:
        """The compiled IREE module (for its function signatures)."""
        return self._main

    @property
    def functions(self) -> list[str]:
        """Public functions of the compiled module."""
        return [f for f in self._main.function_names if not f.startswith("__")]

    def invoke(self, name: str, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        """Runs function ``name`` on host arrays; returns its results as host arrays."""
        if name not in self.functions:
            raise ArtifactError(f"{self.root}: no function '{name}' (has: {', '.join(self.functions)})")
        result = self._functions[name](*[np.require(a, requirements="C") for a in arrays])  # keeps rank 0
        if result is None:
            return ()
        if not isinstance(result, (tuple, list)):
            result = (result,)
        return tuple(r.to_host() if hasattr(r, "to_host") else np.asarray(r) for r in result)

    def device_function(self, name: str) -> Callable:
        """Function ``name`` taking and returning device arrays (see ``to_device``): for timing loops that
        should not copy inputs in and results out on every call."""
        if name not in self.functions:
            raise ArtifactError(f"{self.root}: no function '{name}' (has: {', '.join(self.functions)})")
        return self._functions[name]

    def to_device(self, array: np.ndarray) -> rt.DeviceArray:
        """A copy of ``array`` on the program's device."""
        return rt.asdevicearray(self.config.device, np.require(array, requirements="C"))

    def close(self) -> None:
        """Tears the context down in order (two-module contexts otherwise crash at exit)."""
        for attr in ("_functions", "_context", "_main", "_modules"):
            if hasattr(self, attr):
                delattr(self, attr)
        gc.collect()

    def __enter__(self) -> "Program":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(root: str | Path, **kwargs) -> Program:
    """Loads the artifact directory ``root`` written by ``collage compile``."""
    return Program(root, **kwargs)
