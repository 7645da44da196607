"""PyTorch entry points: ``torch.compile(model, backend="collage")`` and ``collage_mlir.torch.compile``.

    compiled = collage_mlir.torch.compile(model, [x])            # tuned before? that plan; else the default
    compiled = collage_mlir.torch.compile(model, [x], tune_budget=120)   # else tune for up to 120 s
    y = compiled(x)
    y = torch.compile(model, backend="collage", options={"tune_budget": 120})(x)

The model goes through the torch frontend (torch-mlir's fx importer to StableHLO, cached on disk), is
placed by a plan (``collage_mlir.entry.choose_plan``: the one tuned before for this structure, found in the
cost DB by structural hash; else a tune within ``tune_budget``; else the default plan; or the ``plan``
named: ``default``, ``random:N``, ``prefer:B1,B2``, a plan file, ``tune``), compiled into an artifact
under the cache directory, and returned as a callable on torch tensors, which passes them in and out
through DLPack without copies (``CompiledModule``). A graph collage cannot take falls back to eager
PyTorch with one warning naming the reason. ``torch.compile`` compiles dynamo's graph with the weights
frozen back in (``DynamoGraph``): the same module as ``compile(model, ...)``, so the same tuned plan.
"""

from __future__ import annotations

import math
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from collage_runtime.shapes import Fallback, dims_label
from collage_runtime.types import NumberFormat

from .entry import (BuildOptions, Int8, PlanChoice, cached_artifact, choose_plan, compile_cached, compile_int8,
                    compile_int8_range, planned_buckets)
from .errors import CollageError
from .frontends.dims import (PYTHON, DimPlan, dim_names, exported_dims, input_values,
                              named_onnx_dims, positional_dims, renamed_axes, resized, resized_batch)
from .frontends.onnx_calibrate import Agreement
from .frontends.torch import export_onnx, import_exported_dynamic, import_torch, to_numpy, to_torch
from .ir import new_context
from .measure.import_check import check_import as check, torch_source

#: The keywords of ``compile`` a program per shape bucket is compiled with (the rest quantize: ``Int8``).
SHAPED_OPTIONS = tuple(f.name for f in fields(BuildOptions))
#: ``torch.compile(..., options={...})`` keys the ``collage`` backend takes (``compile``'s keywords).
DYNAMO_OPTIONS = (*SHAPED_OPTIONS, "calibrate", "calibration_method", "max_drop")


class CompiledModule:
    """A model compiled by collage: call it with tensors like the model; results come back as tensors.

    No copies on the way in or out (``Program.invoke_dlpack``): a contiguous CPU tensor whose data is
    64-byte aligned (any tensor torch allocates; not a view at an offset) is read in place, and each result
    is a tensor over the IREE result buffer (``torch.from_dlpack``; the tensor keeps the buffer alive). An
    unaligned or strided input, a tensor on another device, or a sub-byte/empty result is copied once. A
    result can share memory with an input, as in eager PyTorch, where the model returns that input."""

    def __init__(self, program, out_spec, choice: PlanChoice, agreement: Agreement | None = None):
        self.program = program
        self.plan = choice.plan
        self.plan_how = choice.how  # entry.PlanHow: "given", "tuned before", "faster in f32", ...
        #: int8 (``precision="int8"``): the program against the f32 model on the held-out samples.
        self.agreement = agreement
        self._out_spec = out_spec

    def __call__(self, *args):
        import torch
        from torch.utils import _pytree as pytree

        # detach: DLPack refuses tensors that require grad; cpu(): a no-op for a CPU tensor.
        inputs = [a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args]
        outs = self.program.invoke_dlpack("main", *inputs)
        # Host arrays (results IREE cannot export) may be read-only, which DLPack cannot say: from_numpy.
        tensors = [to_torch(o) if isinstance(o, np.ndarray) else torch.from_dlpack(o) for o in outs]
        return pytree.tree_unflatten(tensors, self._out_spec)


def compile(model, example_inputs: Sequence | None = None, *, plan: str | None = None,  # noqa: A001
            tune_budget: float | None = None, backends: Sequence[str] | None = None, precision: str | None = None,
            seed: int = 0, db: str | Path | None = None, threads: int | None = None, check_import: bool = True,
            buckets: Mapping[str, Sequence[int]] | None = None, pad: Sequence[str] = (),
            calibrate: Sequence | None = None, calibration_method: str = "minmax",
            max_drop: float | None = None) -> "CompiledModule | ShapedModule":
    """Compiles ``model`` for ``example_inputs``' shapes and dtypes; raises CollageError when it cannot.
    The plan: ``plan`` when given, else the one tuned before for this model's structure (cost DB
    ``db``), else a tune over ``backends`` (and with ``precision="bf16"`` the backends computing in bf16; default: the model's own)
    within ``tune_budget`` seconds when given, else the default.
    ``check_import``: the import runs with IREE alone on the example inputs and must match the eager
    model (``measure.import_check``; the verdict is cached).

    ``model`` may be a ``torch.export.ExportedProgram`` (``example_inputs`` default: its own). With dynamic
    dims (``torch.export.Dim`` with a max) it compiles one program per shape bucket (``ShapedModule``): each
    dim, named by its ``Dim`` (``"seq"``; ``ARG.AXIS`` of an axis of it too, and alone where the program no
    longer knows the name, a loaded one), has the buckets ``buckets`` lists, else its MIN, the example's
    size and its MAX; along the dims in ``pad`` a shape between buckets runs zero-padded on the next one up;
    a range some shape of which neither serves is refused. Each bucket's plan is chosen as above
    (``tune_budget`` shared between them).

    ``precision="int8"`` quantizes the f32 model first, as ``collage compile --precision int8`` does
    (``entry.quantize``): ``calibrate`` is a sequence of batches, each the model's inputs (a tensor, or a
    tuple of tensors) with the example inputs' shapes; ranges by ``calibration_method`` (``minmax``,
    ``percentile``, ``entropy``); the last quarter of the batches is held out, and where the int8 model
    changes the top class of more than ``max_drop`` of those samples, nodes fall back to f32. The compiled
    program is checked on them too (``agreement``); above ``max_drop``, a CollageError."""
    import torch
    from torch.utils import _pytree as pytree

    import collage_runtime

    int8 = Int8.requested(precision, calibrate, calibration_method, max_drop, _arrays)
    precision = None if int8 else precision  # an int8 module is tuned at its own precision
    if isinstance(model, torch.export.ExportedProgram):
        args, kwargs = model.example_inputs if example_inputs is None else (tuple(example_inputs), {})
        if kwargs:
            raise CollageError("the exported program takes keyword inputs: collage passes inputs by position")
        dims, axes = exported_dims(model, args, named=True)
        alias = dim_names(axes)  # a Dim("seq") of argument 0's axis 1 is "seq" or "0.1"
        buckets, pad = {alias.get(n, n): v for n, v in (buckets or {}).items()}, [alias.get(n, n) for n in pad]
        options = BuildOptions(plan, tune_budget, backends, precision, seed, db, threads, check_import)
        if dims and int8:
            return _compile_int8_shaped(model, list(args), DimPlan.of(dims, buckets or {}, pad, PYTHON), axes, options,
                                        int8)
        if dims:
            return _compile_shaped(model.module(), list(args), DimPlan.of(dims, buckets or {}, pad, PYTHON), axes, options,
                                   program=model)
        model, example_inputs = model.module(), list(args)
    elif example_inputs is None:
        raise CollageError("example inputs are needed to compile a torch model (its shapes and dtypes)")
    elif buckets or pad:
        raise CollageError("buckets and pad go with an exported program's dynamic dims (torch.export.Dim)")

    with torch.no_grad():
        eager = model(*example_inputs)
    _, out_spec = pytree.tree_flatten(eager)
    module = import_torch(model, list(example_inputs), new_context())
    arrays = [to_numpy(a) for a in example_inputs]
    if check_import:
        check(module, torch_source(model, list(example_inputs), eager), arrays, where=f"torch:{type(model).__name__}")
    source = f"torch:{type(model).__name__}"
    if int8 is not None:  # an int8 engine must agree with ONNX Runtime on the example inputs
        options = BuildOptions(plan, tune_budget, backends, None, seed, db, threads, check_import)
        out, choice, quantized = compile_int8(module, int8, arrays, options, source)
        program = collage_runtime.load(out, threads=threads)
        return CompiledModule(program, out_spec, choice, quantized.check(program))
    choice = choose_plan(module, plan, tune_budget=tune_budget, backends=backends, seed=seed, db=db,
                         examples={"main": arrays}, precision=precision)
    program = collage_runtime.load(compile_cached(module, choice, source=source), threads=threads)
    return CompiledModule(program, out_spec, choice)


def _arrays(batch) -> list[np.ndarray]:
    """A calibration batch (a tensor, or a tuple of them: the model's inputs) as arrays."""
    return [to_numpy(t) for t in (batch if isinstance(batch, (tuple, list)) else (batch,))]


class ShapedModule:
    """An exported program with dynamic dims compiled by collage: one program per shape bucket
    (``collage_runtime.shapes``); call it with tensors of any shape in range (results are tensors)."""

    def __init__(self, program, out_spec, agreement: Agreement | None = None):
        self.program = program
        #: int8 (``precision="int8"``): the program against the f32 model on the held-out samples.
        self.agreement = agreement
        self._out_spec = out_spec

    def __call__(self, *args):
        from torch.utils import _pytree as pytree

        arrays = [to_numpy(a) for a in pytree.tree_leaves(args)]
        outs = self.program.invoke(self.program.table.function, *arrays)
        return pytree.tree_unflatten([to_torch(o) for o in outs], self._out_spec)


def _compile_shaped(model, example: list, dim_plan: DimPlan, axes, options: BuildOptions, program=None) -> ShapedModule:
    """Every bucket of ``dim_plan`` imported, checked and given its plan, then compiled into one artifact of
    shape buckets under the cache directory (keyed by the buckets' modules and plans). Shapes between
    buckets that padding does not serve run on the exported ``program`` with its dynamic dims kept:
    imported by torch-mlir (``frontends.torch.import_exported_dynamic``), IREE's dynamic program of it or its
    ONNX translation on ONNX Runtime or OpenVINO, the fastest (``shaped.choose_fallback``); where the
    translation fails (torch-mlir's dynamic lowering leaves shape arithmetic: GPT-2, Hugging Face's
    DistilBERT), torch's ONNX exporter's model on ONNX Runtime or OpenVINO, where they run it faster than IREE
    (timed apart: DistilBERT between buckets ran 2.4x slower than Inductor on IREE's dynamic program), or
    where IREE cannot compile it either. Checked against the OPT bucket."""
    import torch
    from torch.utils import _pytree as pytree

    import collage_runtime

    # Imported when used, as collage_mlir.iree does: at module load, shaped's imports change the interpreter's
    # teardown order so that nanobind reports the cached device as leaked (test_exit_is_quiet_...).
    from .shaped import choose_fallback, compile_shaped, fallback_kinds

    needed, dynamic, refused = dim_plan.unserved(fallback=False) is not None, None, None
    if needed:
        if program is None:
            dim_plan.require_served(fallback=False)  # before any bucket is imported: one line
        try:
            dynamic = import_exported_dynamic(program, new_context())
        except CollageError as exc:  # torch's ONNX exporter, below
            refused = str(exc)
    with torch.no_grad():
        _, out_spec = pytree.tree_flatten(model(*example))
    def imported(values: dict[str, int], arrays: list[np.ndarray]):
        inputs = resized(example, axes, values)
        module = import_torch(model, inputs, new_context())
        if options.check_import:
            check(module, torch_source(model, inputs), arrays, where=f"torch:{type(model).__name__} at "
                                                                 f"{dims_label(values)}")
        return module

    grid, models, key = planned_buckets(dim_plan, lambda values: [to_numpy(a) for a in resized(example, axes, values)],
                                        options, imported, seed=b"")
    if needed:
        key.update(dynamic.operation.get_asm(binary=True) if dynamic is not None else program.graph_module.code.encode())
    out = cached_artifact(key.hexdigest()[:16])
    if not out.exists():
        with tempfile.TemporaryDirectory(prefix="collage-dynamic-") as tmp:
            fallback, kind = None, Fallback.NONE
            bf16 = options.precision == NumberFormat.BF16.value  # the fallback may compute in bf16 too

            def torch_export():  # torch's own ONNX export, dims kept, and its fastest engine
                onnx = export_onnx(program, (), Path(tmp) / "dynamic.onnx", "the exported program")
                return onnx, choose_fallback(onnx, dim_plan, axes, fallback_kinds(onnx, bf16))

            if dynamic is not None:  # the fastest engine that runs it: IREE, or its ONNX translation
                fallback = Path(tmp) / "dynamic.mlirbc"
                with open(fallback, "wb") as f:
                    dynamic.operation.write_bytecode(f)
                try:
                    choice = choose_fallback(fallback, dim_plan, axes, fallback_kinds(fallback, bf16))
                    kind = choice.chosen
                except CollageError as exc:
                    refused, fallback = str(exc), None
                if fallback is not None and kind is Fallback.IREE and choice.failed:
                    # ONNX Runtime and OpenVINO could not take its ONNX translation (torch-mlir's dynamic lowering
                    # leaves shape arithmetic): on torch's own export of the program, where they run it faster.
                    try:
                        onnx, other = torch_export()
                        if other.times.get(other.chosen, math.inf) < choice.times[Fallback.IREE]:
                            fallback, kind = onnx, other.chosen
                    except CollageError:
                        pass
            if needed and fallback is None:
                try:
                    fallback, other = torch_export()
                    kind = other.chosen
                except CollageError as exc:
                    raise CollageError(f"{refused}; and {exc}") from None
            compile_shaped(dim_plan, axes, lambda values: models[grid.index(values)], out,
                           source=f"torch:{type(model).__name__}", fallback_model=fallback, fallback=kind,
                           translated=fallback is not None)
    return ShapedModule(collage_runtime.load(out, threads=options.threads), out_spec)


def _compile_int8_shaped(program, example: list, dim_plan: DimPlan, axes, options: BuildOptions,
                         int8: Int8) -> ShapedModule:
    """An exported program with dynamic dims, in int8: torch's ONNX exporter writes it with its dims kept (each
    renamed as ``axes`` names them), then ``entry.compile_int8_range`` quantizes it once and compiles its
    buckets and what serves between them; checked on the held-out batches, batched each way the artifact
    serves a batch."""
    import torch
    from torch.utils import _pytree as pytree

    import collage_runtime

    with tempfile.TemporaryDirectory(prefix="collage-int8-") as tmp:
        exported = export_onnx(program, (), Path(tmp) / "model.onnx", "the exported program")
        data = named_onnx_dims(exported, axes)
    with torch.no_grad():
        _, out_spec = pytree.tree_flatten(program.module()(*example))
    out, quantized = compile_int8_range(data, dim_plan, lambda values: [to_numpy(a) for a in resized(example, axes, values)],
                                        options, int8, source=f"torch:{type(program).__name__}")
    compiled = collage_runtime.load(out, threads=options.threads)
    return ShapedModule(compiled, out_spec, quantized.check(compiled))


def dynamo_backend(gm, example_inputs: Sequence, options: dict | None = None) -> Callable[..., Any]:
    """torch.compile backend ``collage`` (``options``: ``compile``'s keywords, e.g. ``tune_budget``); eager
    with one warning where collage cannot. The graph is compiled with the module's weights frozen in as
    constants (``DynamoGraph``), so it imports to the module ``compile(model, ...)`` imports and finds the
    plan tuned for the model."""
    import torch

    try:
        unknown = sorted(set(options or {}) - set(DYNAMO_OPTIONS) - {"dims", "pad"})
        if unknown:
            raise CollageError(f"unknown collage option(s) {', '.join(unknown)} (known: "
                               f"{', '.join([*DYNAMO_OPTIONS, 'dims', 'pad'])})")
        options = dict(options or {})
        dims, pad = options.pop("dims", None), options.pop("pad", ())
        symbolic = any(not isinstance(e, torch.Tensor) for e in example_inputs)
        if dims and not symbolic and torch._dynamo.config.assume_static_by_default:
            # dynamo traced one shape (no dynamic=True): its guards send any other shape to a new trace, so
            # this graph serves only this shape; a range built now would be built again at that trace
            warnings.warn("collage: dims declared, but dynamo traced this graph at one shape (torch.compile "
                          "without dynamic=True): compiled for that shape alone; pass dynamic=True to build the "
                          "declared range at the first call", RuntimeWarning,
                          stacklevel=2)
            dims = None
        compiled = DynamicGraph(gm, example_inputs, options, dims, pad) if symbolic or dims \
            else DynamoGraph(gm, example_inputs, options)
    except (CollageError, Exception) as exc:  # noqa: BLE001  any failure falls back, as torch backends do
        why = " ".join(str(exc).split())[:200] or type(exc).__name__
        warnings.warn(f"collage: running this graph eagerly: {why}", RuntimeWarning, stacklevel=2)
        return gm.forward
    return compiled


class DynamoGraph:
    """A graph dynamo captured, compiled with its weights as constants.

    Dynamo passes a module's parameters and buffers to the graph as inputs; imported like that, the graph
    would differ from the model's own import (weights as arguments, not constants), miss the plan tuned
    for the model, and keep IREE and the backends from folding and packing weights. So the weight inputs
    are frozen into the graph (``freeze_weights``), which then imports to the same module, and the
    program takes only the real inputs. Dynamo does not recompile when weights change, so each call
    checks that the weights are the same tensors, unmodified (storage and version counter), and compiles
    again with the current ones when not. Where dynamo splits a model into several graphs (graph breaks),
    each is a module of its own, and a plan tuned for the whole model fits none of them."""

    def __init__(self, gm, example_inputs: Sequence, options: dict, roles: "_Roles | None" = None):
        self._gm, self._options = gm, options
        self._roles = roles or _Roles.of(gm, example_inputs)
        self._compile(example_inputs)

    def _compile(self, args: Sequence) -> None:
        frozen = freeze_weights(self._gm, {k: args[k] for k in self._roles.weights}, self._roles.scalars)
        self._seen = self._roles.state(args)
        self.compiled = compile(frozen, self._real(args), **self._options)

    def _real(self, args: Sequence) -> list:
        return [a for k, a in enumerate(args) if k not in self._roles.weights]

    def __call__(self, *args):
        if self._roles.state(args) != self._seen:
            self._compile(args)
        return self.compiled(*self._real(args))


class DynamicGraph:
    """A graph dynamo captured with dynamic shapes (``torch.compile(..., dynamic=True)``, or a second
    shape): its size arguments (SymInts) and tensor axes take a new value on each call.

    ``dims`` (option ``{"ARG.AXIS": (MIN, OPT, MAX)}``, ``ARG`` counting the graph's tensor inputs, a tuple of
    them for axes of one size: ``{("0.1", "1.1"): (8, 64, 128)}``, token ids' and their mask's sequence, the
    dim named by the first) declares ranges, served by one shape-bucket artifact (``ShapedModule``) built at the first call: the graph, its
    weights frozen in and its sizes read off its tensors (``_sized_graph``), is exported with a dynamic hint
    per declared axis (declared axes the graph makes one size, such as token ids' and their mask's sequence,
    become one dim, named by the first) and compiled as ``compile`` compiles an exported program (in int8
    with ``precision="int8"``: quantized once for the range, ``_compile_int8_shaped``): a program per
    bucket (MIN, OPT and MAX of each dim), along the dims in ``pad`` (rows independent along them, such as a
    batch) the next bucket up, zero-padded, and between buckets the fastest engine on the graph with its
    dims kept. Nothing compiles at request time; a shape outside a range is a CollageError. A graph that does
    not export with symbolic dims (Python branching on a size) warns once and compiles the shapes no bucket
    or padding serves on first use. Without ``dims``, each shape is compiled as a static graph
    (``DynamoGraph`` of the graph with the sizes bound), once: programs are kept per shape, and
    ``compile_cached`` keeps artifacts across processes; in int8 each shape is calibrated on the batches cut
    or repeated to it (``dims.resized_batch``)."""

    def __init__(self, gm, example_inputs: Sequence, options: dict, dims: dict | None, pad: Sequence[str]):
        import torch

        self._gm, self._options = gm, options
        holders = _placeholders(gm)
        self._roles = _Roles.of(gm, example_inputs)  # now: dynamo drops the placeholders' grapharg after the backend
        self._sizes = [k for k, e in enumerate(example_inputs) if not isinstance(e, torch.Tensor)]
        self._tensors = [k for k in range(len(holders)) if k not in self._roles.weights and k not in self._sizes]
        # Each size argument the graph computes with is the size of some tensor input's axis: its symbol names it.
        # One it does not use (a view's storage offset, made symbolic when another module compiled in this process,
        # its frame shared, saw other shapes) is dropped.
        self._unused = {k: 0 for k in self._sizes if not holders[k].users}
        self._size_axes = {k: _axis_of(holders[k], [holders[t] for t in self._tensors]) for k in self._sizes
                           if k not in self._unused}
        self._programs: dict[tuple, DynamoGraph | None] = {}  # None: eager at that shape
        self._plan = None
        # Per the sizes of the undeclared axes: the range's artifact, or None where the graph does not export.
        self._ranges: dict[tuple, ShapedModule | None] = {}
        self._seen: list | None = None
        self._int8 = Int8.requested(options.get("precision"), options.get("calibrate"),
                                    options.get("calibration_method", "minmax"), options.get("max_drop"), _arrays)
        if dims:
            declared = positional_dims(dims, pad)
            self._plan, self._axes = declared.plan, declared.axes([example_inputs[t] for t in self._tensors])
        elif pad:
            raise CollageError("the 'pad' option goes with 'dims'")

    def _run_per_shape(self, args: Sequence):
        """``args``' shape on its own static program, compiled on first use; eagerly, with one warning, where
        collage cannot compile it (as dynamo_backend falls back for a whole graph)."""
        key = tuple(tuple(args[t].shape) for t in self._tensors)
        if key not in self._programs:
            sizes = {k: args[k] for k in self._sizes}
            options = self._options
            if self._int8 is not None:  # calibrated at this shape: the batches cut or repeated to it
                options = options | {"calibrate": [resized_batch(b, key) for b in self._options["calibrate"]]}
            try:
                self._programs[key] = DynamoGraph(_BoundSizes(self._gm, sizes),
                                                  [a for k, a in enumerate(args) if k not in self._sizes],
                                                  options, self._roles.without(self._sizes))
            except Exception as exc:  # noqa: BLE001  any failure falls back, as torch backends do
                why = " ".join(str(exc).split())[:200] or type(exc).__name__
                warnings.warn(f"collage: running this graph eagerly at shape {list(key)}: {why}", RuntimeWarning,
                              stacklevel=3)
                self._programs[key] = None
        program = self._programs[key]
        return self._gm(*args) if program is None else program(*[a for k, a in enumerate(args) if k not in self._sizes])

    def __call__(self, *args):
        tensors = [args[t] for t in self._tensors]
        if self._plan is None:
            return self._run_per_shape(args)
        values = input_values(self._axes, tensors, "torch.compile")
        self._plan.check(values)
        seen = self._roles.state(args)
        if seen != self._seen:  # the first call, or weights replaced or changed in place: built again
            self._ranges, self._seen = {}, seen
        fixed = tuple(tuple(None if name else n for n, name in zip(t.shape, names))
                      for t, names in zip(tensors, self._axes))
        if fixed not in self._ranges:
            self._ranges[fixed] = self._compile_range(args)
        shaped = self._ranges[fixed]
        if shaped is None:
            return self._run_per_shape(args)
        return shaped(*tensors)

    def _compile_range(self, args: Sequence) -> "ShapedModule | None":
        """The declared range's artifact for the graph at ``args``; None (and a warning) where the graph does
        not export with symbolic dims and padding does not reach every shape in range."""
        import torch

        model = _sized_graph(self._gm, {k: args[k] for k in self._roles.weights}, self._roles.scalars, self._tensors,
                             self._size_axes, self._unused)
        example = [args[t] for t in self._tensors]
        # Hints, not named Dims: export finds the declared axes the graph makes one size (a model's token ids'
        # and attention mask's sequence), where named Dims are a violated constraint.
        ranges = {d.name: d for d in self._plan.dims}
        shapes = tuple({a: torch.export.Dim.DYNAMIC(min=ranges[n].min, max=ranges[n].max) for a, n in enumerate(names)
                        if n} for names in self._axes)
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=r".*LeafSpec.* is deprecated", category=FutureWarning)
                program = torch.export.export(model, tuple(example), dynamic_shapes=shapes)
        except Exception as exc:  # noqa: BLE001  torch.export raises many types (guards, constraints, unsupported)
            program = None
            if self._plan.unserved(fallback=False) is not None or self._int8:
                why = " ".join(str(exc).split())[:160]
                warnings.warn(f"collage: the graph does not export with symbolic dims ({why}); shapes no bucket "
                              "or padding serves compile on first use", RuntimeWarning, stacklevel=3)
                return None
        options = BuildOptions(**{k: v for k, v in self._options.items() if k in SHAPED_OPTIONS})
        try:
            if program is not None:
                self._plan, self._axes = _one_per_size(program, example, self._plan, self._axes)
            if self._int8 is not None:
                return _compile_int8_shaped(program, example, self._plan, self._axes, replace(options, precision=None),
                                            self._int8)
            return _compile_shaped(model, example, self._plan, self._axes, options, program=program)
        except CollageError as exc:  # torch-mlir cannot import it with its dims, say: shape by shape, as above
            warnings.warn(f"collage: the declared range is not served by one artifact ({exc}){_one_size_hint(self._plan)}"
                          "; shapes compile on first use", RuntimeWarning, stacklevel=3)
            return None


def _one_size_hint(plan: DimPlan) -> str:
    """Where ``plan`` declares dims of equal ranges apart, that they may be one size (token ids' and their mask's
    sequence: the buckets cross them, and the model fails where they differ) and how to declare them so."""
    ranges: dict[tuple, list[str]] = {}
    for d in plan.dims:
        ranges.setdefault((d.min, d.opt, d.max), []).append(d.name)
    tied = next((names for names in ranges.values() if len(names) > 1), None)
    if tied is None:
        return ""
    return (f"; if axes {', '.join(tied)} are one size (token ids' and their mask's sequence), declare them as one "
            f"dim: {{{tuple(tied)!r}: (MIN, OPT, MAX)}}")


def _one_per_size(program, example: Sequence, plan: DimPlan, axes):
    """``plan`` and ``axes`` with the declared dims that ``program`` (exported with a hint per declared axis)
    makes one size named once: by the first of them (one CollageError line where their ranges differ)."""
    _, exported = exported_dims(program, example)
    first: dict[str, str] = {}  # the export's name of a size → the first declared dim of that size
    renamed = {n: first.setdefault(e, n) for names, sizes in zip(axes, exported) for n, e in zip(names, sizes)
               if n is not None and e is not None}
    if all(n == kept for n, kept in renamed.items()):
        return plan, axes
    ranges = {d.name: d for d in plan.dims}
    for name, kept in renamed.items():
        a, b = ranges[name], ranges[kept]
        if (a.min, a.opt, a.max) != (b.min, b.opt, b.max):
            raise CollageError(f"dims '{kept}' and '{name}' are one size in the graph: declare them with one range "
                               f"(got {b} and {a})")
    return (DimPlan.of([d for d in plan.dims if renamed.get(d.name, d.name) == d.name], {},
                       list(dict.fromkeys(renamed.get(n, n) for n in plan.pad)), PYTHON),
            renamed_axes(axes, renamed))


def _sized_graph(gm, weights: dict, scalars: frozenset, tensors: Sequence[int],
                 size_axes: Mapping[int, tuple[int, int, bool]], fixed: Mapping[int, int]):
    """Dynamo graph ``gm`` with ``weights`` frozen in (``freeze_weights``) as a graph of its tensor inputs
    alone: each size placeholder (``size_axes``: its position → (tensor input position, axis, whether a
    stride)) becomes that axis's size (or stride) read off the tensor, so that torch.export traces it as the
    axis's symbol (a contiguous input's stride: a product of sizes); those of ``fixed`` (position → value)
    become constants."""
    import torch

    frozen = freeze_weights(gm, weights, scalars)
    kept = [k for k in range(len(weights) + len(_placeholders(frozen))) if k not in weights]
    holders = dict(zip(kept, _placeholders(frozen)))
    with frozen.graph.inserting_after(holders[kept[-1]]):
        for k, (position, axis, stride) in size_axes.items():
            read = torch.ops.aten.sym_stride.int if stride else torch.ops.aten.sym_size.int
            size = frozen.graph.call_function(read, (holders[tensors[position]], axis))
            holders[k].replace_all_uses_with(size)
            frozen.graph.erase_node(holders[k])
    for k, value in fixed.items():
        _substitute(holders[k], value)
        frozen.graph.erase_node(holders[k])
    frozen.recompile()
    return frozen


class _BoundSizes:
    """A dynamo graph with its size arguments bound to values: a graph on tensors alone."""

    def __new__(cls, gm, sizes: dict):
        import torch

        graph = torch.fx.Graph()
        graph.output(graph.graph_copy(gm.graph, {}))
        bound = torch.fx.GraphModule(gm, graph)
        for k, node in enumerate(_placeholders(bound)):
            if k in sizes:
                _substitute(node, sizes[k])
                graph.erase_node(node)
        bound.recompile()
        return bound


def _axis_of(holder, tensor_holders: list) -> tuple[int, int, bool]:
    """(tensor input position, axis, whether a stride) whose size, or else stride, is the symbol of size
    placeholder ``holder``: dynamo makes a stride symbolic where an input is a view (``ids[:, :n]``)."""
    symbol = str(holder.meta.get("example_value"))
    for stride in (False, True):
        for position, node in enumerate(tensor_holders):
            value = node.meta.get("example_value")
            sizes = (value.stride() if stride else value.shape) if hasattr(value, "shape") else ()
            for axis, size in enumerate(sizes):
                if str(size) == symbol:
                    return position, axis, stride
    raise CollageError(f"size argument {holder.name} is not the size or stride of any input's axis")


def freeze_weights(gm, weights: dict, scalars: frozenset = frozenset()):
    """A copy of fx graph ``gm`` whose placeholders ``weights`` (position → tensor) read attributes
    holding those tensors (not copied): parameters stay parameters, buffers buffers. The ``scalars`` among
    them (a module's number that dynamo passes as a tensor: ``_Roles``) become their value where the graph
    reads them."""
    import torch

    graph = torch.fx.Graph()  # a copy node by node: deepcopy warns about torch's own pytree specs
    graph.output(graph.graph_copy(gm.graph, {}))
    frozen = torch.fx.GraphModule(gm, graph)
    for k, node in enumerate(_placeholders(frozen)):
        if k not in weights:
            continue
        if k in scalars:
            for read in list(node.users):
                _substitute(read, weights[k].item())
                graph.erase_node(read)
            graph.erase_node(node)
            continue
        name = f"_collage_weight_{k}"
        tensor = weights[k].detach()
        if isinstance(weights[k], torch.nn.Parameter):
            frozen.register_parameter(name, torch.nn.Parameter(tensor, requires_grad=False))
        else:
            frozen.register_buffer(name, tensor)
        with graph.inserting_before(node):
            attribute = graph.get_attr(name)
        node.replace_all_uses_with(attribute)
        graph.erase_node(node)
    frozen.recompile()
    return frozen


def _substitute(node, value) -> None:
    """Every use of fx ``node`` replaced by the constant ``value``, nested ones too (a slice's bound, a list)."""
    import torch

    for user in list(node.users):
        user.args, user.kwargs = torch.fx.node.map_arg((user.args, user.kwargs), lambda a: value if a is node else a)


def _placeholders(gm) -> list:
    return [node for node in gm.graph.nodes if node.op == "placeholder"]


def _is_weight(node, example) -> bool:
    """Whether dynamo passes placeholder ``node`` a module's parameter or buffer (its guard source)."""
    import torch

    source = getattr(node.meta.get("grapharg"), "source", None)
    if source is None or not isinstance(example, torch.Tensor):
        return False
    return source.guard_source.is_unspecialized_nn_module() or source.guard_source.is_specialized_nn_module()


@dataclass(frozen=True)
class _Roles:
    """Which of a dynamo graph's placeholders are weights (a module's parameters and buffers, frozen into the
    graph) and which of those are ``scalars``: a module's or a global's Python number that dynamo passes as
    a 0-d tensor the graph only reads back with ``.item()`` (with ``dynamic=True``: a LayerNorm's ``eps``, a
    Dropout's ``p``, an attention's ``scaling``, ``math.pi`` in Hugging Face's GELU), which torch.export
    cannot trace (a data-dependent value) and which is bound in by value (a number the caller passes stays
    an input). Read from the placeholders' ``grapharg`` while the backend runs: dynamo drops it after."""

    weights: frozenset
    scalars: frozenset

    @classmethod
    def of(cls, gm, example_inputs: Sequence) -> "_Roles":
        import torch

        from torch._guards import GuardSource

        holders = _placeholders(gm)
        weights = frozenset(k for k, node in enumerate(holders) if _is_weight(node, example_inputs[k]))
        scalars = frozenset(
            k for k, node in enumerate(holders)
            if getattr(node.meta.get("grapharg"), "pass_arg_as_tensor", False)
            and (k in weights or node.meta["grapharg"].source.guard_source in (GuardSource.GLOBAL, GuardSource.CONSTANT))
            and all((u.op == "call_method" and u.target == "item") or u.target is torch.ops.aten.item.default
                    for u in node.users))
        return cls(weights | scalars, scalars)

    def without(self, removed: Sequence[int]) -> "_Roles":
        """The roles once the placeholders at ``removed`` are gone (the others move up)."""
        def shift(k: int) -> int:
            return k - sum(r < k for r in removed)
        return _Roles(frozenset(map(shift, self.weights)), frozenset(map(shift, self.scalars)))

    def state(self, args: Sequence) -> list:
        """What the frozen weights were: each tensor's identity (storage and version counter; the version
        counts in-place changes: an optimizer step, ``copy_`` under no_grad), each scalar's value (dynamo
        wraps the number in a new tensor per call)."""
        return [args[k].item() if k in self.scalars else (id(args[k]), args[k].data_ptr(), args[k]._version)
                for k in sorted(self.weights)]
