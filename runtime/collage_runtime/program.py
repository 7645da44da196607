"""Program: an artifact directory loaded into one IREE VM context."""

from __future__ import annotations

import gc
import shutil
import weakref
from pathlib import Path
from typing import Callable, Sequence

import iree.runtime as rt
import numpy as np

from .manifest import MANIFEST, ArtifactError, load_manifest
from .package import is_package, unpack
from .engines import Engines, iree_device, usable_cores
from .rt_module import RegionFailure, RegionTimer, create_rt_module  # noqa: F401  (RegionFailure: raised by invoke)
from .types import SUB_BYTE_BITS, Signature, TensorSpec, parse_declaration

#: Builds an extra VM module (e.g. IREE's `check` module for conformance tests) on the program's device.
ModuleFactory = Callable[[rt.HalDevice], rt.VmModule]


class InputError(ValueError):
    """Arrays given to a function do not match its compiled signature (count, dtype or shape);
    ``index`` is the offending input's position (None for a wrong count)."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


class Program:
    """A loaded artifact (a directory, or one packed ``.collage`` file). ``invoke(name, *arrays)`` runs a
    public function and returns numpy arrays."""

    def __init__(self, root: str | Path, *, driver: str = "local-task", extra_modules: Sequence[ModuleFactory] = (),
                 threads: int | None = None, region_timer: RegionTimer | None = None):
        # region_timer(region, call seconds, executor seconds) is told every library region call.
        self.root = Path(root)
        if is_package(self.root):
            self.root = unpack(self.root)
            # The unpacked copy goes when the program is closed or collected, or at exit.
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, True)
        self.manifest = load_manifest(self.root)
        # One thread budget for every engine in the program (default: all usable cores).
        self.engines = Engines(usable_cores() if threads is None else threads)
        self.config = rt.Config(device=iree_device(driver, self.engines.threads))
        device = self.config.device
        devices = len(self.manifest.get("devices") or ()) or 1
        if devices > 1:
            # The program's logical devices (codegen configurations, see the manifest's "devices") differ
            # only in the code compiled for them: one local device serves them all, so they share memory
            # and one task pool, and the context tears down like a single-device one.
            self.config.default_vm_modules = (
                rt.create_hal_module(self.config.vm_instance, devices=[device] * devices),)
        vmfb = (self.root / self.manifest["module"]).read_bytes()
        try:
            self._main = rt.VmModule.copy_buffer(self.config.vm_instance, vmfb)
        except (RuntimeError, ValueError) as exc:
            raise ArtifactError(f"{self.root / self.manifest['module']}: IREE cannot load the module "
                                f"({' '.join(str(exc).split())[:200]})") from None
        # Keep every module object alive as long as the context: a temporary segfaults later.
        self._failures: list[Exception] = []
        self._modules = [create_rt_module(device, self.root, self.manifest["regions"], self.engines, self._failures,
                                          region_timer)]
        self._modules += [factory(device) for factory in extra_modules]
        try:
            self._context = rt.SystemContext(
                vm_modules=(*self.config.default_vm_modules, *self._modules, self._main), config=self.config
            )
        except RuntimeError as exc:  # e.g. a region's signature in the manifest does not match the module's import
            why = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
            raise ArtifactError(f"{self.root / MANIFEST}: the module does not link with the manifest's regions "
                                f"({why[:240]}); recompile the artifact") from None
        self._functions = getattr(self._context.modules, self._main.name)
        self._signatures: dict[str, Signature | None] = {
            f: parse_declaration(self._main.lookup_function(f).reflection.get("iree.abi.declaration", ""))
            for f in self.functions}

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
        signature = self._signatures.get(name)
        if signature is not None:
            check_inputs(name, signature, arrays)
        self._failures.clear()
        try:
            result = self._functions[name](*[np.require(a, requirements="C") for a in arrays])  # keeps rank 0
        except RuntimeError:
            if self._failures:  # a region's engine raised: say which, in one line
                raise self._failures[-1] from None
            raise
        if result is None:
            return ()
        if not isinstance(result, (tuple, list)):
            result = (result,)
        specs = signature.outputs if signature is not None else ()
        return tuple(_to_host(r, specs[k] if k < len(specs) else None) for k, r in enumerate(result))

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
        if hasattr(self, "_cleanup"):
            self._cleanup()

    def __enter__(self) -> "Program":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_inputs(function: str, signature: Signature, arrays: Sequence) -> None:
    """Raises InputError unless ``arrays`` match the function's inputs in count, dtype and shape: an input
    read directly by a library region is not checked by IREE, and a mismatch there computes garbage."""
    if len(arrays) != len(signature.inputs):
        raise InputError(f"{function}: takes {len(signature.inputs)} input(s), got {len(arrays)}")
    for k, (spec, array) in enumerate(zip(signature.inputs, arrays)):
        if spec is None:
            continue
        if isinstance(array, np.generic):  # a numpy scalar is a rank-0 array
            array = np.asarray(array)
        if not isinstance(array, np.ndarray):
            raise InputError(f"{function}: input {k}: expected {spec} as a numpy array, got {type(array).__name__}", k)
        if not spec.accepts(array):
            raise InputError(f"{function}: input {k}: expected {spec}, got {array.dtype}{list(array.shape)}", k)


def _to_host(value, spec: TensorSpec | None) -> np.ndarray:
    """A result as a host array; sub-byte integers unpacked one per byte, empty tensors as empty arrays
    (IREE's own conversion refuses both)."""
    if not hasattr(value, "to_host"):
        return np.asarray(value)
    if spec is None or spec.dtype is None or (spec.element not in SUB_BYTE_BITS and 0 not in value.shape):
        return value.to_host()
    shape = tuple(value.shape)
    if 0 in shape:
        return np.empty(shape, spec.dtype)
    bits = SUB_BYTE_BITS[spec.element]
    packed = np.frombuffer(bytes(value._buffer_view.map()), np.uint8)
    count = int(np.prod(shape))
    index = np.arange(count) * bits
    raw = (packed[index // 8] >> (index % 8).astype(np.uint8)) & np.uint8((1 << bits) - 1)
    if spec.dtype.kind == "i":  # two's complement: sign-extend
        raw = raw.astype(np.int16)
        raw = np.where(raw >= 1 << (bits - 1), raw - (1 << bits), raw)
    return raw.astype(spec.dtype).reshape(shape)


def load(root: str | Path, **kwargs) -> Program:
    """Loads the artifact directory ``root`` written by ``collage compile``."""
    return Program(root, **kwargs)
