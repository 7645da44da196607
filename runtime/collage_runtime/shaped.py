"""ShapedProgram: an artifact of shape buckets (``shapes.json``) loaded as one program that takes any
shape in its declared ranges. Each call picks what serves the inputs' shape: the bucket compiled for it;
else, where every dim that differs is declared paddable, the smallest bucket that holds the shape (inputs
zero-padded, outputs sliced back); else the fallback engine (ONNX Runtime or OpenVINO on the source
ONNX model, IREE on a StableHLO module) with its dynamic dims. Nothing compiles at request time: every bucket is loaded with the program."""

from __future__ import annotations

import shutil
import threading
import weakref
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .engines import Engines, engine_message, iree_device, release_device, usable_cores
from .manifest import ArtifactError
from .package import is_package, unpack
from .program import InputError, Program, close_at_exit, mapped_array
from .rt_module import RegionFailure
from .shapes import Bucket, Fallback, ShapeTable, bucket_for, cut_to, dims_label, load_shape_table, pad_to
from .types import NumberFormat
from .weights import WEIGHTS, WeightStore


class ShapedProgram:
    """The buckets of a shaped artifact, one ``Program`` each, behind ``Program``'s ``invoke``.

    ``served(*arrays)`` says what would serve a call ("bucket batch=8", "padded to batch=8", "ort
    fallback"), for tests and ``collage report``."""

    def __init__(self, root: str | Path, *, threads: int | None = None, **kwargs):
        self.root = Path(root)
        if is_package(self.root):
            self.root = unpack(self.root)
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, True)
        self.table: ShapeTable = load_shape_table(self.root)
        self._programs: dict[str, Program] = {}
        self._fallback = None
        # One mapping of the weight store for every bucket and the fallback.
        self.weights = WeightStore(self.root / WEIGHTS) if self.table.weights_sha256 is not None else None
        try:
            for b in self.table.buckets:
                self._programs[b.path] = Program(self.root / b.path, threads=threads, weights=self.weights, **kwargs)
        except BaseException:
            self.close()
            raise
        if self.table.fallback is not Fallback.NONE:
            engines = Engines(usable_cores() if threads is None else threads, sole=self.table.fallback.value,
                              weights=self.weights)
            try:
                self._fallback = dynamic_runner(self.table.fallback, self.root / self.table.fallback.file, engines)
            except Exception as exc:  # noqa: BLE001  ORT and OpenVINO raise their own types
                self.close()
                raise ArtifactError(f"{self.root / self.table.fallback.file}: {self.table.fallback.value} cannot load "
                                    f"the fallback model ({engine_message(exc)})") from None
        self._lock = threading.Lock()

    def program(self, bucket: Bucket) -> Program:
        """The program compiled for ``bucket`` (one of ``table.buckets``)."""
        return self._programs[bucket.path]

    @property
    def functions(self) -> list[str]:
        return [self.table.function]

    def dims_of(self, arrays: Sequence) -> dict[str, int]:
        """The value of every declared dim in ``arrays`` (InputError: a count, dtype, rank, static size or
        consistency mismatch, or a value outside its range: one line naming the dim, the value and the
        range). Checked before any engine sees the arrays: the fallback engine's own errors are not ours
        to pass on."""
        fn, table = self.table.function, self.table
        if len(arrays) != len(table.inputs):
            raise InputError(f"{fn}: takes {len(table.inputs)} input(s), got {len(arrays)}")
        first = self._programs[table.buckets[0].path].signature(fn)
        specs = first.inputs if first is not None else (None,) * len(arrays)
        values: dict[str, int] = {}
        for k, (axes, array, spec) in enumerate(zip(table.inputs, arrays, specs)):
            if not isinstance(array, (np.ndarray, np.generic)):
                raise InputError(f"{fn}: input {k}: expected a numpy array, got {type(array).__name__}", k)
            shape = np.shape(array)
            if len(shape) != len(axes):
                raise InputError(f"{fn}: input {k}: expected rank {len(axes)}, got shape {list(shape)}", k)
            if spec is not None and spec.dtype is not None and np.asarray(array).dtype != spec.dtype:
                raise InputError(f"{fn}: input {k}: expected {spec.dtype}, got {np.asarray(array).dtype}", k)
            for axis, name in enumerate(axes):
                if name is None:
                    if spec is not None and spec.shape[axis] is not None and shape[axis] != spec.shape[axis]:
                        raise InputError(f"{fn}: input {k} axis {axis} is {shape[axis]}, the model's is "
                                         f"{spec.shape[axis]}", k)
                    continue
                value = shape[axis]
                if value not in table.dim(name):
                    d = table.dim(name)
                    raise InputError(f"{fn}: input {k} axis {axis} (dim '{name}') is {value}, outside the declared "
                                     f"range {d.min}..{d.max}", k)
                if values.setdefault(name, value) != value:
                    raise InputError(f"{fn}: input {k} axis {axis} (dim '{name}') is {value}, but another input "
                                     f"gives '{name}' = {values[name]}", k)
        return values

    def _route(self, values: dict[str, int]) -> tuple[str, Bucket | None]:
        chosen = bucket_for([b.values for b in self.table.buckets], values, self.table.pad)
        if chosen is not None:
            bucket = next(b for b in self.table.buckets if b.values is chosen)
            return ("bucket" if dict(chosen) == values else "padded"), bucket
        if self._fallback is not None:
            return "fallback", None
        served = "; ".join(b.label for b in self.table.buckets)
        raise InputError(f"{self.table.function}: no bucket serves {dims_label(values)} and the artifact has no "
                         f"fallback (buckets: {served})")

    def served(self, *arrays) -> str:
        """What serves a call on ``arrays``: ``bucket L``, ``padded to L`` or ``ort fallback``."""
        how, bucket = self._route(self.dims_of(arrays))
        if how == "fallback":
            return f"{self.table.fallback.value} fallback"
        return f"bucket {bucket.label}" if how == "bucket" else f"padded to {bucket.label}"

    def invoke(self, name: str, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        if name != self.table.function:
            raise InputError(f"'{name}' is not a function of this artifact (it has '{self.table.function}')")
        values = self.dims_of(arrays)
        how, bucket = self._route(values)
        if how == "bucket":
            return self._programs[bucket.path].invoke(name, *arrays)
        if how == "padded":
            grown = [pad_to(np.asarray(a), axes, bucket.values) for a, axes in zip(arrays, self.table.inputs)]
            outs = self._programs[bucket.path].invoke(name, *grown)
            return tuple(cut_to(o, axes, values) for o, axes in zip(outs, self.table.outputs))
        return self._run_fallback(arrays)

    def invoke_fallback(self, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        """The fallback engine on ``arrays`` whatever their shape (a bucket's too): to check it against a
        bucket. An ArtifactError where the artifact has none."""
        if self._fallback is None:
            raise ArtifactError(f"{self.root}: the artifact has no fallback engine")
        return self._run_fallback(arrays)

    def _run_fallback(self, arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        """The fallback engine on ``arrays``, one call at a time (as a Program's); what the engine raises (an
        index out of an embedding's range, say) is a RegionFailure naming it, as a region's error is."""
        with self._lock:
            try:
                return self._fallback(arrays)
            except ArtifactError:
                raise
            except Exception as exc:  # noqa: BLE001  each engine raises its own types
                raise RegionFailure("fallback", self.table.fallback.value, exc) from None

    def close(self) -> None:
        for p in self._programs.values():
            p.close()
        self._fallback = None
        if self.weights is not None:
            self.weights.close()
        cleanup = getattr(self, "_cleanup", None)
        if cleanup is not None:
            cleanup()

    def __enter__(self) -> "ShapedProgram":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def dynamic_runner(kind: Fallback, model: Path, engines: Engines) -> Callable[[Sequence[np.ndarray]], tuple]:
    """A callable running ``model`` (dynamic dims kept: an ONNX model, or IREE's program of a StableHLO
    module) on ``kind``'s engine: arrays in, arrays out."""
    if kind is Fallback.ORT:
        import onnxruntime as ort  # the engines are imported only where a fallback runs on them

        from .executors.onnxruntime_session import model_source

        options = engines.ort_session_options()
        source, keep = model_source(model, engines, options)
        session = ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]

        def run_ort(arrays: Sequence[np.ndarray]) -> tuple:
            return tuple(session.run(None, {n: np.asarray(a) for n, a in zip(names, arrays)}))

        run_ort.weights = keep  # type: ignore[attr-defined]  (the session reads them as long as it runs)
        return run_ort
    if kind in (Fallback.OPENVINO, Fallback.OPENVINO_BF16):
        from .executors.openvino_model import read_model

        core = engines.openvino_core()
        read, keep = read_model(core, model, engines)
        precision = NumberFormat.BF16 if kind is Fallback.OPENVINO_BF16 else NumberFormat.F32
        compiled = core.compile_model(read, "CPU", engines.openvino_config(precision=precision))
        request = compiled.create_infer_request()
        count = len(compiled.outputs)

        def run(arrays: Sequence[np.ndarray]) -> tuple:
            results = request.infer([np.ascontiguousarray(a) for a in arrays])
            return tuple(np.array(results[k]) for k in range(count))

        run.weights = keep  # type: ignore[attr-defined]
        return run
    if kind is Fallback.IREE:
        return IreeRunner(model, engines)
    raise ValueError(f"no dynamic runner for {kind}")


class IreeRunner:
    """IREE's CPU program of a module with dynamic dims (``main.vmfb``), on the process's IREE device: host
    arrays in, host arrays out (each over its own result buffer, as ``Program.invoke`` gives them). Closed
    at exit if still open (``program.close_at_exit``)."""

    def __init__(self, path: Path, engines: Engines):
        import iree.runtime as rt

        config = rt.Config(device=iree_device("local-task", engines.threads))
        self._device_held = weakref.finalize(self, release_device, "local-task")
        module = rt.VmModule.mmap(config.vm_instance, str(path))
        self._context = rt.SystemContext(vm_modules=[module], config=config)
        self._main = getattr(self._context.modules, module.name)["main"]
        close_at_exit(self)

    def __call__(self, arrays: Sequence[np.ndarray]) -> tuple:
        if self._main is None:
            raise ArtifactError("the IREE fallback is closed")
        results = self._main(*(np.ascontiguousarray(a) for a in arrays))
        results = results if isinstance(results, tuple) else (results,)
        return tuple(mapped_array(r._buffer_view, tuple(r.shape), r.dtype) for r in results)

    def close(self) -> None:
        self._main = self._context = None
        self._device_held()

