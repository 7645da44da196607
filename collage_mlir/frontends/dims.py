"""Dynamic dimensions: declared ranges, the buckets they give, and a model specialised to one bucket.

A dimension is named as its source names it: an ONNX input's ``dim_param`` (``batch``), or
``INPUT.AXIS`` for an axis with no name (an ONNX input's name, or a torch factory's argument position:
``0.0`` is argument 0's axis 0). ``--dim NAME=MIN:OPT:MAX`` declares a range (``NAME=V`` pins the dim to
one value); ``--bucket NAME=V1,V2,...`` lists the values compiled for it (default: MIN, OPT and MAX).
Buckets are the grid of every dim's values. Each bucket is the model with its dynamic dims made static,
before any importer sees it: torch-mlir's dynamic lowering leaves ``tensor.from_elements`` shape
arithmetic that IREE refuses, and every backend and the static pipeline then apply unchanged.
"""

from __future__ import annotations

import itertools
import json
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from collage_runtime.shapes import Axes, DimRange, dims_label, serves

from ..errors import CollageError
from .onnx import fold_shapes

_RANGE = re.compile(r"^\s*([^=\s]+)\s*=\s*(\d+)(?:\s*:\s*(\d+)\s*:\s*(\d+))?\s*$")
_VALUES = re.compile(r"^\s*([^=\s]+)\s*=\s*(\d+(?:\s*,\s*\d+)*)\s*$")


def parse_dim(text: str) -> DimRange:
    """``NAME=MIN:OPT:MAX`` or ``NAME=V``; anything else is a CollageError (exit 2)."""
    m = _RANGE.match(text)
    if not m:
        raise CollageError(f"expected NAME=MIN:OPT:MAX (or NAME=VALUE), got '{text}'", where="--dim", exit_code=2)
    lo = int(m.group(2))
    opt, hi = (int(m.group(3)), int(m.group(4))) if m.group(3) else (lo, lo)
    try:
        return DimRange(m.group(1), lo, opt, hi)
    except ValueError as exc:
        raise CollageError(str(exc), where="--dim", exit_code=2) from None


def parse_bucket(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=V1,V2,...``: the values compiled for a dim."""
    m = _VALUES.match(text)
    if not m:
        raise CollageError(f"expected NAME=V1,V2,..., got '{text}'", where="--bucket", exit_code=2)
    return m.group(1), tuple(sorted({int(v) for v in m.group(2).split(",")}))


@dataclass(frozen=True)
class DimPlan:
    """The declared dims, the values compiled for each, and the dims declared paddable; ``buckets``, where
    given, the buckets themselves (chosen from a trace: ``choose_buckets``) instead of the values' grid."""

    dims: tuple[DimRange, ...]
    values: Mapping[str, tuple[int, ...]]
    pad: tuple[str, ...] = ()
    buckets: tuple[Mapping[str, int], ...] | None = None

    def with_buckets(self, buckets: Sequence[Mapping[str, int]]) -> "DimPlan":
        """These buckets (each a value of every dim), the values as they give them."""
        values = {d.name: tuple(sorted({b[d.name] for b in buckets})) for d in self.dims}
        return DimPlan(self.dims, values, self.pad, tuple(dict(b) for b in buckets))

    @classmethod
    def of(cls, dims: Sequence[DimRange], buckets: Mapping[str, Sequence[int]] = {},
           pad: Sequence[str] = (), words: "DimWords | None" = None) -> "DimPlan":
        """The plan of declared ``dims``; ``words``: how the user declared them, for error lines (default the
        command line's flags, ``CLI``)."""
        words = words or CLI
        names = [d.name for d in dims]
        if len(set(names)) != len(names):
            raise CollageError("a dim is declared twice", where=words.dim, exit_code=2)
        for name in [*buckets, *pad]:
            if name not in names:
                raise CollageError(f"'{name}' is not a declared dim (declared: {', '.join(names) or 'none'})",
                                   where=words.pad if name in pad else words.bucket, exit_code=2)
        values = {}
        for d in dims:
            chosen = tuple(sorted(set(buckets.get(d.name, (d.min, d.opt, d.max)))))
            outside = [v for v in chosen if v not in d]
            if outside:
                raise CollageError(f"bucket value {outside[0]} of '{d.name}' is outside its range {d.min}..{d.max}",
                                   where=words.bucket, exit_code=2)
            values[d.name] = chosen
        return cls(tuple(dims), values, tuple(pad))

    @classmethod
    def declared(cls, dims: Mapping[str, "int | tuple[int, int, int]"], buckets: Mapping[str, Sequence[int]] = {},
                 pad: Sequence[str] = ()) -> "DimPlan":
        """From Python's form: each dim's ``(MIN, OPT, MAX)`` or one value (``dims={"batch": (1, 8, 32)}``)."""
        return cls.of([DimRange(n, *((v, v, v) if isinstance(v, int) else v)) for n, v in dims.items()], buckets, pad,
                      PYTHON)

    def check(self, values: Mapping[str, int]) -> None:
        """A CollageError naming the first dim whose value lies outside its declared range."""
        for d in self.dims:
            if values[d.name] not in d:
                raise CollageError(f"dim '{d.name}' is {values[d.name]}, outside the declared range {d.min}..{d.max}")

    def grid(self) -> list[dict[str, int]]:
        """Every bucket: one value of each dim."""
        if self.buckets is not None:
            return [dict(b) for b in self.buckets]
        names = [d.name for d in self.dims]
        return [dict(zip(names, combo)) for combo in itertools.product(*(self.values[n] for n in names))]

    def unserved(self, fallback: bool) -> str | None:
        """A shape in range that no bucket, padding or fallback serves (as ``dim=value``), or None: without a
        fallback, every value of a dim that is not paddable must be a bucket's, and the top bucket (every dim
        at MAX) must be there for padding to reach the rest."""
        if fallback:
            return None
        for d in self.dims:
            missing = next((v for v in range(d.min, d.max + 1) if v not in self.values[d.name]), None)
            if d.name not in self.pad and missing is not None:
                return f"{d.name}={missing}"
        top = {d.name: d.max for d in self.dims}
        return None if top in self.grid() else dims_label(top)

    def require_served(self, fallback: bool) -> None:
        """One CollageError line where some shape in range would be served by nothing (``unserved``)."""
        gap = self.unserved(fallback)
        if gap is not None:
            raise CollageError(f"nothing would serve {gap}: it is between buckets and the model has no fallback "
                               "engine; list it among the buckets (--bucket, buckets=), or declare the dim "
                               "paddable (--pad, pad=: rows independent along it, as a batch)", where="--dim",
                               exit_code=2)


@dataclass(frozen=True)
class ShapeTrace:
    """``--shapes trace.json``: the shapes requests bring, as a JSON list of ``{dim: value}`` objects (one
    per request, repeats counting), which buckets are chosen for."""

    requests: tuple[Mapping[str, int], ...]

    def to_json(self) -> list:
        return [dict(r) for r in self.requests]

    @classmethod
    def from_json(cls, data, dims: Sequence[DimRange], where: str) -> "ShapeTrace":
        names = {d.name for d in dims}
        if not isinstance(data, list) or not data:
            raise CollageError("a shape trace is a non-empty JSON list of {dim: value} objects", where=where,
                               exit_code=2)
        for k, r in enumerate(data):
            if not (isinstance(r, dict) and set(r) == names and all(isinstance(v, int) for v in r.values())):
                raise CollageError(f"request {k}: expected a value of each of {', '.join(sorted(names))}, got "
                                   f"{json.dumps(r)[:80]}", where=where, exit_code=2)
            outside = next((d for d in dims if r[d.name] not in d), None)
            if outside is not None:
                raise CollageError(f"request {k}: {outside.name}={r[outside.name]} is outside its range "
                                   f"{outside.min}..{outside.max}", where=where, exit_code=2)
        return cls(tuple(dict(r) for r in data))

    @classmethod
    def load(cls, path: str | Path, dims: Sequence[DimRange]) -> "ShapeTrace":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise CollageError(f"cannot read the shape trace: {exc}", where=str(path), exit_code=2) from None
        return cls.from_json(data, dims, str(path))


def choose_buckets(plan: DimPlan, trace: ShapeTrace, ratio: float, max_buckets: int,
                   min_gain: float = 0.01) -> list[dict[str, int]]:
    """The buckets to compile for ``trace``: greedily, the one that cuts the trace's modelled time most,
    until ``max_buckets`` or a cut below ``min_gain`` of the time left. A request's time is proportional
    to its shape's size (the product of its dims): on a bucket that serves it, its bucket's size (padding
    included); else ``ratio`` times its own (the fallback engine on the dynamic model, ``ratio`` its time
    over a static program's, measured). Without a fallback (``ratio`` infinite) the top bucket (every
    dim at MAX) comes first, as padding needs it. At least one bucket: the OPT shape where no bucket cuts
    the time (a fallback timed as fast as a static program).

    The trace stands for the requests to come, so a bucket must serve at least two of its requests (a shape
    it holds once is a bucket only where padding serves others from it): a serving trace of 40 BERT requests,
    70 % at four shapes, otherwise got buckets at three one-off shapes of batch 4 (seq 120, 123, 125: the
    largest requests, hence the most modelled time) and none at the common seq 32 and 64."""
    def size(shape: Mapping[str, int]) -> float:
        return float(np.prod([shape[d.name] for d in plan.dims]))

    def cost(chosen: list[dict]) -> float:
        total = 0.0
        for r in trace.requests:
            on = [size(b) for b in chosen if serves(b, r, plan.pad)]
            total += min(on) if on else ratio * size(r)
        return total

    chosen: list[dict[str, int]] = []
    if not np.isfinite(ratio):
        chosen.append({d.name: d.max for d in plan.dims})
    shapes = [dict(c) for c in {tuple(sorted(r.items())) for r in trace.requests}]
    candidates = [c for c in shapes if sum(serves(c, r, plan.pad) for r in trace.requests) > 1]
    candidates.sort(key=lambda c: [c[d.name] for d in plan.dims])
    now = cost(chosen)
    while len(chosen) < max_buckets:
        options = [(cost(chosen + [c]), k) for k, c in enumerate(candidates) if c not in chosen]
        if not options:
            break
        best, k = min(options)
        if np.isfinite(now) and now - best < min_gain * now:
            break
        chosen.append(candidates[k])
        now = best
    if not chosen:  # the fallback measured as fast as a static program: still one bucket, the OPT shape
        chosen.append({d.name: d.opt for d in plan.dims})
    return sorted(chosen, key=lambda b: [b[d.name] for d in plan.dims])


# --- ONNX ---------------------------------------------------------------------------------------------------


def onnx_axes(model) -> tuple[Axes, Axes]:
    """(input axes, output axes) of an ONNX ``ModelProto``: per graph input (not initializers) and output,
    per axis, the dim's name where it is not a fixed size (``dim_param``, else ``INPUT.AXIS``)."""
    constants = {t.name for t in model.graph.initializer}

    def axes(values) -> Axes:
        out = []
        for v in values:
            dims = v.type.tensor_type.shape.dim if v.type.tensor_type.HasField("shape") else ()
            out.append(tuple(None if d.HasField("dim_value") and d.dim_value > 0
                             else (d.dim_param or f"{v.name}.{k}") for k, d in enumerate(dims)))
        return tuple(out)

    return axes([i for i in model.graph.input if i.name not in constants]), axes(model.graph.output)


def read_onnx_axes(path: str | Path) -> tuple[Axes, list[str]]:
    """The input axes of the ONNX model at ``path`` (``onnx_axes``) and its inputs' names."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001  onnx raises DecodeError, OSError...: the import says it in full
        raise CollageError(f"cannot read the ONNX model: {' '.join(str(exc).split())[:300]}", where=str(path)) from None
    constants = {t.name for t in model.graph.initializer}
    return onnx_axes(model)[0], [i.name for i in model.graph.input if i.name not in constants]


def named_onnx_dims(model, axes: Axes) -> bytes:
    """The ONNX model (at a path, or an ``onnx.ModelProto``, renamed in place) with its inputs' ``dim_param``s
    renamed as ``axes`` names their axes (an exporter's symbols, torch's ``s31``, become the names the caller
    declared ranges for), everywhere they appear (inputs, outputs, value infos); serialized."""
    import onnx

    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    constants = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in constants]
    names = {}
    for value, row in zip(inputs, axes):
        for dim, name in zip(value.type.tensor_type.shape.dim, row):
            if name is not None and dim.dim_param:
                names[dim.dim_param] = name
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in names:
                dim.dim_param = names[dim.dim_param]
    return model.SerializeToString()


def dynamic_dims(axes: Axes) -> list[str]:
    """The dim names in ``axes``, first use first."""
    return list(dict.fromkeys(n for a in axes for n in a if n is not None))


def check_declared(axes: Axes, dims: Sequence[DimRange], words: "DimWords | None" = None) -> None:
    """Every dynamic dim of the model declared, and every declared dim one of them (else one line, in
    ``words``: the command line's by default)."""
    words = words or CLI
    declared, dynamic = [d.name for d in dims], dynamic_dims(axes)
    unknown = [n for n in declared if n not in dynamic]
    if unknown:
        raise CollageError(f"'{unknown[0]}' is not a dynamic dim of the model (it has: {', '.join(dynamic) or 'none'})",
                           where=words.dim, exit_code=2)
    missing = [n for n in dynamic if n not in declared]
    if missing:
        raise CollageError(f"dynamic dim '{missing[0]}' has no range: give {words.range_of(missing[0])}",
                           where=words.dim, exit_code=2)


@dataclass(frozen=True)
class DimWords:
    """How a user declares dims, for the error lines that name them: the command line's flags or Python's
    keywords."""

    dim: str
    bucket: str
    pad: str
    #: How a range of dim NAME is written.
    range_form: str

    def range_of(self, name: str) -> str:
        return self.range_form.format(name=name)


CLI = DimWords("--dim", "--bucket", "--pad", "--dim {name}=MIN:OPT:MAX (or --dim {name}=VALUE to fix it)")
PYTHON = DimWords("dims", "buckets", "pad", "dims={{'{name}': (MIN, OPT, MAX)}} (or one value to fix it)")


def specialise_onnx(path: str | Path, values: Mapping[str, int], out_dir: str | Path) -> Path:
    """A copy of the ONNX model at ``path`` with each dynamic input dim fixed to ``values`` (and output dims
    of the same names), written into ``out_dir``; the shapes in between are inferred again at import."""
    import onnx

    model = onnx.load(str(path))
    inputs, outputs = onnx_axes(model)
    constants = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in constants]
    for tensors, axes in ((graph_inputs, inputs), (model.graph.output, outputs)):
        for tensor, names in zip(tensors, axes):
            for d, name in zip(tensor.type.tensor_type.shape.dim, names):
                if name in values:
                    d.dim_value = values[name]
    del model.graph.value_info[:]  # inferred again for the static shapes
    out = Path(out_dir) / f"{Path(path).stem}.{'_'.join(f'{v}' for v in values.values()) or 'static'}.onnx"
    onnx.save(model, str(out))
    return fold_shapes(out, Path(out_dir))


def input_values(axes: Axes, arrays: Sequence, where: str = "--input") -> dict[str, int]:
    """The value of each dynamic dim in ``arrays`` (numpy arrays, tensors, or shapes as tuples; a CollageError
    where they disagree, located at ``where``: the command line's example inputs, or a call)."""
    values: dict[str, int] = {}
    for k, (names, array) in enumerate(zip(axes, arrays)):
        shape = array if isinstance(array, tuple) else tuple(array.shape) if hasattr(array, "shape") else np.shape(array)
        if len(shape) != len(names):
            raise CollageError(f"input {k} has shape {list(shape)}, the model's input {k} has rank "
                               f"{len(names)}", where=where, exit_code=2)
        for axis, name in enumerate(names):
            if name is not None and values.setdefault(name, shape[axis]) != shape[axis]:
                raise CollageError(f"input {k} gives dim '{name}' = {shape[axis]}, another input "
                                   f"{values[name]}", where=where, exit_code=2)
    return values


def inputs_values(axes: Axes, input_names: Sequence[str], inputs: Sequence, where: str) -> dict[str, int]:
    """The value of each dynamic dim in example ``inputs`` (``input_values``); with none, one CollageError
    naming each dim and the flag that declares it (``undeclared_line``)."""
    if not inputs:
        raise CollageError(undeclared_line(axes, input_names), where=where, exit_code=2)
    return input_values(axes, inputs)


def undeclared_line(axes: Axes, input_names: Sequence[str]) -> str:
    """The one line for a model with dynamic dims and neither ``--dim`` nor ``--input``."""
    uses = [f"{name} ({input_names[k]} axis {axis})" for k, a in enumerate(axes) for axis, name in enumerate(a)
            if name is not None]
    first = dynamic_dims(axes)[0]
    return (f"the model has dynamic dims: {', '.join(uses)}; declare each one's range with --dim NAME=MIN:OPT:MAX "
            f"(e.g. --dim {first}=1:8:32), or give --input arrays to compile for their shape")


# --- torch and JAX (positional inputs) ----------------------------------------------------------------------


@dataclass(frozen=True)
class PositionalDims:
    """Declared dims of positional inputs (``jax.jit``'s ``dims``, ``torch.compile``'s option): ``plan``, one dim
    per key; ``each`` declared axis (``ARG.AXIS``) → its range; ``same``: an axis declared with others → the
    first of its key (the dim's name)."""

    plan: DimPlan
    each: Mapping[str, "int | tuple[int, int, int]"]
    same: Mapping[str, str]

    def axes(self, examples: Sequence) -> Axes:
        """The axes of ``examples`` (positional arrays or tensors) the dims name, each by its key's first axis."""
        return renamed_axes(argument_axes(examples, DimPlan.declared(self.each).dims, PYTHON), self.same)


def positional_dims(dims: Mapping, pad: Sequence[str] = (), exported: bool = False) -> PositionalDims:
    """Declared ``dims`` with a key naming several axes (``("0.1", "1.1")``: token ids' and their mask's
    sequence, one size) as one dim, named by its first axis; ``pad`` names dims by any of their axes.
    ``exported``: keys are an exported module's symbols, one each."""
    each: dict = {}
    same: dict[str, str] = {}
    for key, value in dims.items():
        names = (key,) if isinstance(key, str) else tuple(key)
        if not names or not all(isinstance(n, str) for n in names) or (exported and len(names) > 1):
            raise CollageError(f"dims: a key is an axis ('ARG.AXIS'){'' if exported else ' or a tuple of axes of one size'}"
                               f"{', a symbol of the exported module' if exported else ''}; got {key!r}")
        for name in names:
            if name in each:
                raise CollageError(f"dims: axis '{name}' is declared twice")
            each[name] = value
            if name != names[0]:
                same[name] = names[0]
    plan = DimPlan.declared({n: v for n, v in each.items() if n not in same}, pad=[same.get(n, n) for n in pad])
    return PositionalDims(plan, each, same)


def argument_axes(examples: Sequence, dims: Sequence[DimRange], words: "DimWords | None" = None) -> Axes:
    """The axes of positional example inputs (a torch factory's tensors, a JAX function's flattened
    arrays) that ``dims`` name (``ARG.AXIS``)."""
    named = {}
    for d in dims:
        arg, _, axis = d.name.partition(".")
        if not (arg.isdigit() and axis.isdigit() and int(arg) < len(examples)
                and int(axis) < len(examples[int(arg)].shape)):
            raise CollageError(f"dim '{d.name}': a torch or JAX model's dims are named ARGUMENT.AXIS (e.g. 0.0 for "
                               f"argument 0's axis 0) within its {len(examples)} example input(s)",
                               where=(words or CLI).dim, exit_code=2)
        named[(int(arg), int(axis))] = d.name
    return tuple(tuple(named.get((k, a)) for a in range(len(e.shape))) for k, e in enumerate(examples))


def exported_dims(program, examples: Sequence, named: bool = False) -> tuple[list[DimRange], Axes]:
    """The dynamic dims of a ``torch.export.ExportedProgram`` and the axes of its (flattened, positional)
    user inputs that carry them: each symbol named ``ARG.AXIS`` by its first axis (axes sharing a
    ``torch.export.Dim`` share it), or with ``named`` by its ``Dim``'s own name where the program still
    knows it (``Dim("seq")``: ``seq``; ``dim_names`` pairs the two), its range the program's
    ``range_constraints``, its OPT the example inputs' size. A derived size (``2*batch``) or a range without a
    bound is one CollageError line."""
    from torch.export.graph_signature import InputKind
    from torch.utils._sympy.numbers import int_oo

    user = {s.arg.name for s in program.graph_signature.input_specs if s.kind is InputKind.USER_INPUT}
    holders = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in user]
    names: dict = {}
    dims: list[DimRange] = []
    axes = []
    for k, (node, example) in enumerate(zip(holders, examples)):
        row = []
        for a, size in enumerate(node.meta["val"].shape):
            if isinstance(size, int):
                row.append(None)
                continue
            symbol = size.node.expr
            if symbol not in program.range_constraints or not symbol.is_Symbol:
                raise CollageError(f"input {k} axis {a} of the exported program has size {symbol}: give each "
                                   "dynamic axis a torch.export.Dim of its own (derived sizes are not taken)",
                                   where="torch.export")
            if symbol not in names:
                bounds = program.range_constraints[symbol]
                if bounds.upper == int_oo:
                    raise CollageError(f"input {k} axis {a} has no upper bound: give its torch.export.Dim a max",
                                       where="torch.export")
                low, high = max(int(bounds.lower), 1), int(bounds.upper)
                names[symbol] = (named and _dim_name(size, names.values())) or f"{k}.{a}"
                dims.append(DimRange(names[symbol], low, min(max(int(example.shape[a]), low), high), high))
            row.append(names[symbol])
        axes.append(tuple(row))
    return dims, tuple(axes)


def _dim_name(size, taken) -> str | None:
    """The ``torch.export.Dim`` name the user gave the symbol of ``size`` (a SymInt of an exported program's
    input), where its shape environment names every source of it so; None where it does not (a loaded
    program, a name already taken, or one of the ``ARG.AXIS`` form)."""
    env = getattr(size.node, "shape_env", None)
    sources = getattr(env, "var_to_sources", {}).get(size.node.expr, [])
    found = {getattr(env, "source_name_to_debug_name", {}).get(src.name) for src in sources}
    name = found.pop() if len(found) == 1 else None
    if not name or name in taken or re.fullmatch(r"\d+\.\d+", name):
        return None
    return name


def dim_names(axes: Axes) -> dict[str, str]:
    """``ARG.AXIS`` → the dim ``axes`` name that axis by: a dim named by its ``torch.export.Dim`` may be
    called either way (``pad=["0.1"]`` or ``pad=["seq"]``)."""
    return {f"{k}.{a}": name for k, row in enumerate(axes) for a, name in enumerate(row) if name is not None}


def renamed_axes(axes: Axes, names: Mapping[str, str]) -> Axes:
    """``axes`` with each dim ``names`` maps renamed (axes declared apart that are one dim)."""
    return tuple(tuple(names.get(n, n) if n else None for n in row) for row in axes)


def resized(examples: Sequence, axes: Axes, values: Mapping[str, int]) -> list:
    """The example arrays (numpy arrays or torch tensors) at a bucket's shape: each entry repeated, then cut,
    along each dynamic axis."""
    out = []
    for tensor, names in zip(examples, axes):
        for axis, name in enumerate(names):
            if name is not None:
                n = values[name]
                reps = -(-n // tensor.shape[axis])
                if isinstance(tensor, np.ndarray):
                    tensor = np.repeat(tensor, reps, axis=axis).take(np.arange(n), axis=axis)
                else:
                    tensor = tensor.repeat_interleave(reps, dim=axis).narrow(axis, 0, n)
        out.append(tensor)
    return out


def resized_batch(batch, shapes: Sequence[tuple]):
    """A calibration batch (an array or tensor, or a tuple of them: the model's inputs) at ``shapes``: each of
    the same rank cut, or its entries repeated, along each axis of another size (``resized``: an ids sequence of
    32 tokens calibrates a call on 20 or 64); the rest left as they are, for the compile to say what does not
    fit."""
    arrays = list(batch) if isinstance(batch, (tuple, list)) else [batch]
    fits = [hasattr(t, "shape") and k < len(shapes) and len(t.shape) == len(shapes[k]) for k, t in enumerate(arrays)]
    axes = tuple(tuple(f"{k}.{a}" if ok and t.shape[a] != shapes[k][a] else None for a in range(len(t.shape)))
                 if ok else () for k, (t, ok) in enumerate(zip(arrays, fits)))
    values = {name: shapes[k][a] for k, row in enumerate(axes) for a, name in enumerate(row) if name}
    out = [r if ok else t for t, r, ok in zip(arrays, resized(arrays, axes, values), fits)]
    return tuple(out) if isinstance(batch, (tuple, list)) else out[0]


def workdir() -> tempfile.TemporaryDirectory:
    """Where specialised model files are written while they are imported."""
    return tempfile.TemporaryDirectory(prefix="collage-dims-")
