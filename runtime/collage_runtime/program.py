"""Program: an artifact directory loaded into one IREE VM context."""

from __future__ import annotations

import atexit
import gc
import shutil
import threading
import weakref
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import iree.runtime as rt
import numpy as np
from iree.runtime.dtypes import map_dtype_to_hal_element_type

from .manifest import MANIFEST, ArtifactError, load_manifest
from .package import is_package, unpack
from .engines import Engines, iree_device, release_device, usable_cores
from .shapes import bucket_store
from .weights import WeightStore
from .rt_module import (DLPACK_PLATFORMS, DLPackView, RegionFailure, RegionTimer,  # noqa: F401  (RegionFailure: raised by invoke)
                        Transfers, create_rt_module, host_array)
from .types import SUB_BYTE_BITS, Platform, Signature, TensorSpec, parse_declaration

#: Builds an extra VM module (e.g. IREE's `check` module for conformance tests) on the program's device.
ModuleFactory = Callable[[rt.HalDevice], rt.VmModule]


class InputError(ValueError):
    """Arrays given to a function do not match its compiled signature (count, dtype or shape);
    ``index`` is the offending input's position (None for a wrong count)."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


class ProgramClosed(RuntimeError):
    """A call of a program after its ``close``."""


#: Every program not closed yet: closed at exit, before the interpreter tears modules down (a context
#: still alive then, say one a torch.compile cache holds, is reported by nanobind as leaked).
_OPEN: weakref.WeakSet = weakref.WeakSet()  # open programs (and other IREE contexts: close_at_exit)


@atexit.register
def _close_open_programs() -> None:
    for program in list(_OPEN):
        program.close()


def close_at_exit(closable) -> None:
    """Has ``closable`` (anything holding an IREE context: a program, a shaped artifact's IREE fallback)
    closed at interpreter exit if it is still open, as every ``Program`` is: what outlives IREE's devices
    nanobind reports as leaked."""
    _OPEN.add(closable)


class Program:
    """A loaded artifact (a directory, or one packed ``.collage`` file). ``invoke(name, *arrays)`` runs a
    public function and returns numpy arrays.

    The module runs on the manifest's platform (``Manifest.platform``: the CPU, CUDA or Vulkan) with that
    platform's IREE driver unless ``driver`` names another (``local-sync`` for a CPU program, say). On a
    device platform the program's buffers are device-only: host arrays go in and come out through copies
    (``invoke``, ``to_device``, ``to_host``), and ``invoke_dlpack`` takes and gives device tensors.

    A program may be called from several threads: its calls run one at a time (a lock per program),
    since its regions' engines keep per-region state between calls (ORT's I/O binding, OpenVINO's infer
    request, the tensors bound to them) and share one thread budget. Unserialized, 4 threads calling one
    program returned results off by up to 2.8 (docs/reliability.md). Separate programs run concurrently.
    """

    def __init__(self, root: str | Path, *, driver: str | None = None, extra_modules: Sequence[ModuleFactory] = (),
                 threads: int | None = None, region_timer: RegionTimer | None = None,
                 weights: WeightStore | None = None):
        # region_timer(region, call seconds, executor seconds) is told every library region call; weights:
        # the weight store of the shaped artifact this program is a bucket of (collage_runtime.weights;
        # default: found beside the bucket, so one bucket's directory loads on its own too).
        self.root = Path(root)
        if is_package(self.root):
            self.root = unpack(self.root)
            # The unpacked copy goes when the program is closed or collected, or at exit.
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, True)
        self.manifest = load_manifest(self.root)
        if weights is None and self.root.is_dir():
            weights = bucket_store(self.root)
        # One thread budget for every engine in the program (default: all usable cores).
        regions = self.manifest.regions
        self.engines = Engines(usable_cores() if threads is None else threads,
                               sole=regions[0].backend if len(regions) == 1 else None, weights=weights)
        self.platform: Platform = self.manifest.platform
        driver = driver or self.platform.driver
        self.config = rt.Config(device=iree_device(driver, self.engines.threads, sync_allocations=bool(regions)))
        # Once, when the program is closed or collected (a Vulkan device goes with its last program).
        self._device_held = weakref.finalize(self, release_device, driver)
        # The CPU drivers' buffers are host memory: mapped in place, DLPack tensors imported and exported
        # in place. A device platform's are device-only: the host reads and writes them through copies.
        self._host_memory = self.platform.host_memory
        device = self.config.device
        self._transfers = None if self._host_memory else Transfers(device)
        devices = len(self.manifest.devices) or 1
        if devices > 1:
            # The program's logical devices (codegen configurations, see the manifest's "devices") differ
            # only in the code compiled for them: one local device serves them all, so they share memory
            # and one task pool, and the context tears down like a single-device one.
            self.config.default_vm_modules = (
                rt.create_hal_module(self.config.vm_instance, devices=[device] * devices),)
        vmfb = (self.root / self.manifest.module).read_bytes()
        try:
            self._main = rt.VmModule.copy_buffer(self.config.vm_instance, vmfb)
        except (RuntimeError, ValueError) as exc:
            raise ArtifactError(f"{self.root / self.manifest.module}: IREE cannot load the module "
                                f"({' '.join(str(exc).split())[:200]})") from None
        # Keep every module object alive as long as the context: a temporary segfaults later.
        self._failures: list[Exception] = []
        self._lock = threading.Lock()  # one call at a time (see the class docstring)
        self._modules = [create_rt_module(device, self.root, self.manifest.regions, self.engines, self._failures,
                                          region_timer, platform=self.platform, transfers=self._transfers)]
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
        #: Public functions (not ``__init``-like ones) and their declared signatures; kept after ``close``.
        self._signatures: dict[str, Signature | None] = {
            f: parse_declaration(self._main.lookup_function(f).reflection.get("iree.abi.declaration", ""))
            for f in self._main.function_names if not f.startswith("__")}
        self._direct_calls: dict[str, DirectCall | None] = {}
        self._tail = None
        if self.manifest.tail is not None:
            import onnxruntime as ort

            self._tail = ort.InferenceSession(str(self.root / self.manifest.tail.artifact),
                                              self.engines.ort_session_options(), providers=["CPUExecutionProvider"])
        _OPEN.add(self)

    @property
    def vm_module(self) -> rt.VmModule:
        """The compiled IREE module (for its function signatures); ProgramClosed after ``close``."""
        self._live()
        return self._main

    @property
    def functions(self) -> list[str]:
        """Public functions of the compiled module (also after ``close``)."""
        return list(self._signatures)

    def signature(self, name: str) -> Signature | None:
        """Function ``name``'s declared signature (None where IREE's reflection gives none)."""
        return self._signatures.get(name)

    def invoke(self, name: str, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        """Runs function ``name`` on host arrays; returns its results as host arrays. IREE copies each
        input into a buffer of its own; a result is a view of the result's buffer where IREE can map it
        (the CPU), else a view of one host staging buffer the results are copied into."""
        # Only arrays are made contiguous here: anything else is for check_inputs to refuse.
        contiguous = [np.require(a, requirements="C") if isinstance(a, (np.ndarray, np.generic)) else a
                      for a in arrays]  # keeps rank 0
        direct = self._direct(name, contiguous)
        if direct is not None:
            results = direct.to_host(self._guarded(direct, contiguous))
        else:
            result, specs = self._call(name, contiguous)
            results = self.to_host(*result, specs=specs)
        return self._with_tail(contiguous, results) if name == "main" and self._tail is not None else results

    def _with_tail(self, args: Sequence[np.ndarray], results: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        """``main``'s outputs of a program with an ONNX tail (``Manifest.tail``): the tail run by ONNX
        Runtime on the IREE function's results and the call's arguments, the outputs picked from both."""
        tail = self.manifest.tail
        given = {"result": results, "arg": args}
        feeds = {i.name: np.asarray(given[kind][k]) for i, (kind, k) in zip(self._tail.get_inputs(), tail.inputs)}
        try:
            ran = self._tail.run(None, feeds)
        except Exception as exc:  # noqa: BLE001  (ONNX Runtime raises its own exception types)
            raise RegionFailure("onnx_tail", "ort", exc) from None
        given["tail"] = ran
        return tuple(given[kind][k] for kind, k in tail.outputs)

    def to_host(self, *values, specs: Sequence[TensorSpec | None] = ()) -> tuple[np.ndarray, ...]:
        """Results of the program (``DeviceArray``s, as ``device_function`` returns them) as host arrays;
        ``specs``, where known, their declared types (sub-byte integers come unpacked one per byte). On a
        device platform every result is copied into one staging buffer (one command buffer)."""
        spec = [specs[k] if k < len(specs) else None for k in range(len(values))]
        if self._host_memory:
            return tuple(_to_host(v, s) for v, s in zip(values, spec))
        staged = [k for k, v in enumerate(values) if isinstance(v, rt.DeviceArray) and v._buffer_view.byte_length]
        raw = dict(zip(staged, self._transfers.to_host([values[k]._buffer_view for k in staged]))) if staged else {}
        return tuple(_to_host(v, s, raw.get(k)) for k, (v, s) in enumerate(zip(values, spec)))

    def invoke_dlpack(self, name: str, *tensors) -> tuple:
        """Runs function ``name`` on tensors given through DLPack (``__dlpack__``: torch tensors, numpy
        arrays). A dense input on the program's device (host memory for a CPU program; a CUDA tensor for
        a CUDA program) is read in place where IREE can import it (on the CPU: 64-byte aligned data); any
        other input (unaligned, strided, on another device, or a value without ``__dlpack__``) is copied
        in as by ``invoke``. A result comes back as a ``DLPackView`` over the result's own buffer
        (``torch.from_dlpack(r)``: no copy; the tensor keeps the buffer alive), on the program's device.
        Results IREE cannot export (sub-byte or empty tensors, non-tensors; every result of a Vulkan
        program) are host arrays as ``invoke`` returns them. A result may share memory with an input (the
        function returns that input). On CUDA (untested: no GPU where this was written) the caller's
        tensors must be ready (their stream synchronised): IREE's stream does not wait for torch's."""
        signature = self._signatures.get(name)
        specs = signature.inputs if signature is not None else ()
        values = [self._import(t, specs[k] if k < len(specs) else None) for k, t in enumerate(tensors)]
        result, specs = self._call(name, values)
        spec = [specs[k] if k < len(specs) else None for k in range(len(result))]
        out = [self._export(r, s) for r, s in zip(result, spec)]
        rest = [k for k, e in enumerate(out) if e is None]  # as invoke returns them, in one staging copy
        for k, host in zip(rest, self.to_host(*(result[k] for k in rest), specs=[spec[k] for k in rest])):
            out[k] = host
        return tuple(out)

    def _dlpack_device(self) -> int | None:
        """DLPack's device type of the program's buffers, if IREE imports and exports them through DLPack."""
        return self.platform.dlpack_device if self.platform in DLPACK_PLATFORMS else None

    def _import(self, tensor, spec: TensorSpec | None):
        """``tensor`` as a buffer view over its own memory, or else as a host array (which IREE copies)."""
        if (hasattr(tensor, "__dlpack__") and spec is not None and spec.dtype is not None
                and spec.element not in SUB_BYTE_BITS and tensor.__dlpack_device__()[0] == self._dlpack_device()):
            try:
                return self.config.device.from_dlpack_capsule(tensor.__dlpack__())
            except (IndexError, ValueError, RuntimeError, BufferError):  # unaligned, strided, read-only
                pass
        if isinstance(tensor, np.ndarray) or not hasattr(tensor, "__dlpack__"):
            return np.require(tensor, requirements="C") if isinstance(tensor, np.ndarray) else tensor
        return np.require(host_array(tensor), requirements="C")  # IREE copies it

    def _export(self, value, spec: TensorSpec | None) -> DLPackView | None:
        """``value`` as a DLPack producer on the program's device, or None where IREE cannot export it."""
        dl_type = self._dlpack_device()
        if (dl_type is None or not isinstance(value, rt.DeviceArray) or spec is None or spec.dtype is None
                or spec.element in SUB_BYTE_BITS or 0 in value.shape):
            return None
        view, dl_device = value._buffer_view, (dl_type, 0)  # IREE's default device: the platform's device 0
        if self._transfers is not None:  # device memory: a copy where IREE cannot export the program's buffer
            view = self._transfers.exportable(view, dl_device)
        return DLPackView(self.config.device, view, dl_device)

    def _call(self, name: str, values: Sequence) -> tuple[Sequence, tuple[TensorSpec | None, ...]]:
        """Runs ``name`` on checked inputs (host arrays or buffer views); its raw results and their specs."""
        if name not in self._signatures:
            raise ArtifactError(f"{self.root}: no function '{name}' (has: {', '.join(self._signatures)})")
        signature = self._signatures[name]
        if signature is not None:
            check_inputs(name, signature, values)
        result = self._guarded(lambda args: self._live()[name](*args), values)
        if result is None:
            result = ()
        elif not isinstance(result, (tuple, list)):
            result = (result,)
        return result, signature.outputs if signature is not None else ()

    def _guarded(self, call: Callable[[Sequence], object], values: Sequence):
        """``call(values)`` under the program's lock; a region's failure during it is raised as itself
        (``RegionFailure``, one line), not as IREE's error; ProgramClosed where ``close`` came first."""
        with self._lock:
            self._live()
            self._failures.clear()
            try:
                result = call(values)
            except RuntimeError:
                if not self._failures:
                    raise
                result = None
            failure = self._failures[-1] if self._failures else None
            self._failures.clear()
        if failure is not None:  # a region's engine raised: say which, in one line
            # raised here, outside the except clause: no context holding IREE's error, its frames and the
            # VM's argument lists (a cycle through this program that outlived the call)
            raise failure
        return result

    def _direct(self, name: str, values: Sequence) -> "DirectCall | None":
        """The function's ``DirectCall`` where it takes ``values`` that way (see ``DirectCall``), else None;
        ProgramClosed after ``close``."""
        self._live()
        if name not in self._direct_calls:
            signature = self._signatures.get(name)
            self._direct_calls[name] = DirectCall.make(self, name, signature) if signature is not None else None
        direct = self._direct_calls[name]
        return direct if direct is not None and direct.takes(values) else None

    def device_function(self, name: str) -> Callable:
        """Function ``name`` taking and returning device arrays (see ``to_device``): for timing loops that
        should not copy inputs in and results out on every call. Its calls hold the program's lock too.
        Of a program with an ONNX tail (``Manifest.tail``) it calls the IREE function alone, as
        ``invoke_dlpack`` does: ``invoke`` runs the tail."""
        if name not in self._signatures:
            raise ArtifactError(f"{self.root}: no function '{name}' (has: {', '.join(self._signatures)})")
        lock, live = self._lock, self._live

        def serialized(*args):
            direct = self._direct(name, args)
            if direct is not None:
                return direct.as_device_arrays(self._guarded(direct, args))
            with lock:
                return live()[name](*args)

        return serialized

    def _live(self):
        """The context's functions; raises ProgramClosed after ``close``."""
        functions = getattr(self, "_functions", None)
        if functions is None:
            raise ProgramClosed(f"{self.root}: the program is closed")
        return functions

    def to_device(self, array: np.ndarray) -> rt.DeviceArray:
        """A copy of ``array`` on the program's device."""
        self._live()
        return rt.asdevicearray(self.config.device, np.require(array, requirements="C"))

    def close(self) -> None:
        """Tears the context down in order (two-module contexts otherwise crash at exit). A call running on
        another thread finishes first; later calls raise ProgramClosed."""
        with self._lock:
            self._direct_calls.clear()  # they hold the context
            for attr in ("_functions", "_context", "_main", "_modules", "_transfers", "config"):
                if hasattr(self, attr):
                    delattr(self, attr)
            gc.collect()
        if hasattr(self, "_device_held"):
            self._device_held()
        _OPEN.discard(self)
        self._tail = None
        if hasattr(self, "_cleanup"):
            self._cleanup()

    def __enter__(self) -> "Program":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DirectCall:
    """A public function of a host-memory (CPU) program called straight through the VM context: host
    arrays copied into new buffers (as IREE's ``FunctionInvoker`` does), buffer views and ``DeviceArray``s
    passed as they are, the results' buffer views mapped. It skips the invoker's per-call Python (argument
    packing, invocation records, result conversion), which on this 2-core machine cost 0.4-0.6 ms a call
    in a loop of other work (a JAX LSTM whole on XLA: 6.24 ms through ``invoke``, 5.58 this way, 5.72 for
    ``jax.jit``). Only for ``sync`` functions whose inputs and results are all dense tensors of byte-sized
    element types; ``takes`` sends anything else (wrong shapes included: ``check_inputs`` words the error)
    the invoker's way."""

    __slots__ = ("_invoke", "_function", "_device", "_allocate", "_inputs", "_elements", "_outputs")

    def __init__(self, program: "Program", name: str, signature: Signature):
        self._invoke = program._context.vm_context.invoke
        self._function = program._main.lookup_function(name)
        self._device = program.config.device
        self._allocate = partial(self._device.allocator.allocate_buffer_copy, memory_type=rt.MemoryType.DEVICE_LOCAL,
                                 allowed_usage=rt.BufferUsage.DEFAULT, device=self._device)
        self._inputs = signature.inputs
        self._elements = tuple(map_dtype_to_hal_element_type(s.dtype) for s in signature.inputs)
        self._outputs = tuple(s.dtype for s in signature.outputs)

    @classmethod
    def make(cls, program: "Program", name: str, signature: Signature) -> "DirectCall | None":
        """The direct call of ``name``, or None where the program or the function does not allow one."""
        declaration = program._main.lookup_function(name).reflection.get("iree.abi.declaration", "")
        specs = (*signature.inputs, *signature.outputs)
        if not (program._host_memory and declaration.startswith("sync func")
                and all(s is not None and s.dtype is not None and s.element not in SUB_BYTE_BITS for s in specs)):
            return None
        return cls(program, name, signature)

    def takes(self, values: Sequence) -> bool:
        """Whether every value is a non-empty host array of its input's dtype and shape, or a device value."""
        if len(values) != len(self._inputs):
            return False
        for v, spec in zip(values, self._inputs):
            if isinstance(v, np.ndarray):
                if not (v.size and spec.accepts(v)):
                    return False
            elif not isinstance(v, (rt.DeviceArray, rt.HalBufferView)):
                return False
        return True

    def __call__(self, values: Sequence) -> list[rt.HalBufferView]:
        args = rt.VmVariantList(len(values))
        for v, element in zip(values, self._elements):
            if isinstance(v, np.ndarray):
                v = self._allocate(buffer=v, element_type=element)
            elif isinstance(v, rt.DeviceArray):
                v = v._buffer_view
            args.push_ref(v)
        results = rt.VmVariantList(len(self._outputs))
        self._invoke(self._function, args, results)
        return [results.get_as_object(k, rt.HalBufferView) for k in range(len(results))]

    def to_host(self, views: list[rt.HalBufferView]) -> tuple[np.ndarray, ...]:
        """The results as host arrays: views of their mapped buffers (see ``mapped_array``)."""
        return tuple(mapped_array(v, tuple(v.shape), dtype) if v.byte_length else np.empty(tuple(v.shape), dtype)
                     for v, dtype in zip(views, self._outputs))

    def as_device_arrays(self, views: list[rt.HalBufferView]):
        """The results as IREE's invoker gives them: one ``DeviceArray``, a tuple of them, or None."""
        arrays = tuple(rt.DeviceArray(self._device, v, implicit_host_transfer=True) for v in views)
        return arrays[0] if len(arrays) == 1 else arrays or None


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
        if isinstance(array, rt.HalBufferView):  # an imported tensor (invoke_dlpack)
            if not (spec.dtype is not None and int(array.element_type) == int(map_dtype_to_hal_element_type(spec.dtype))
                    and len(array.shape) == len(spec.shape)
                    and all(d is None or d == n for d, n in zip(spec.shape, array.shape))):
                raise InputError(f"{function}: input {k}: expected {spec}, got a tensor of element type "
                                 f"{rt.HalElementType(array.element_type).name}{list(array.shape)}", k)
            continue
        if not isinstance(array, np.ndarray):
            raise InputError(f"{function}: input {k}: expected {spec} as a numpy array, got {type(array).__name__}", k)
        if not spec.accepts(array):
            raise InputError(f"{function}: input {k}: expected {spec}, got {array.dtype}{list(array.shape)}", k)


def mapped_array(view: rt.HalBufferView, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A host array over ``view``'s mapped buffer, with the mapping (which holds the buffer) as its base, so
    every view of it (a padded result cut back, a user's slice) keeps the buffer alive. Not IREE's
    ``MappedMemory.asarray`` nor ``DeviceArray.to_host``: the array they return holds the mapping by
    itself, its views do not, and a slice that outlived that array read a buffer IREE's allocator had
    handed to the next call's result (IREE 3.13)."""
    return np.ndarray(shape, dtype, view.map())


def _to_host(value, spec: TensorSpec | None, raw: np.ndarray | None = None) -> np.ndarray:
    """A result as a host array; sub-byte integers unpacked one per byte, empty tensors as empty arrays
    (IREE's own conversion refuses both). ``raw``: the result's bytes already copied to the host (a
    device-only buffer, see ``Program.to_host``); else the result is mapped (host memory)."""
    if not hasattr(value, "to_host"):
        return np.asarray(value)
    shape = tuple(value.shape)
    dtype = spec.dtype if spec is not None and spec.dtype is not None else value.dtype
    if 0 in shape:
        return np.empty(shape, dtype)
    if spec is None or spec.element not in SUB_BYTE_BITS:
        return mapped_array(value._buffer_view, shape, dtype) if raw is None else raw.view(dtype).reshape(shape)
    bits = SUB_BYTE_BITS[spec.element]
    packed = np.frombuffer(bytes(value._buffer_view.map()), np.uint8) if raw is None else raw
    count = int(np.prod(shape))
    index = np.arange(count) * bits
    raw = (packed[index // 8] >> (index % 8).astype(np.uint8)) & np.uint8((1 << bits) - 1)
    if spec.dtype.kind == "i":  # two's complement: sign-extend
        raw = raw.astype(np.int16)
        raw = np.where(raw >= 1 << (bits - 1), raw - (1 << bits), raw)
    return raw.astype(spec.dtype).reshape(shape)
