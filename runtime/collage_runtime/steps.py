"""The oneDNN step program: what the ``onednn`` backend (``collage_mlir.backends.steps``) writes for a region
and ``executors.torch_steps`` runs with torch. A frozen value with its JSON form, validated when read.

Value ids number the program's inputs first, then each step's result. A step reads ``ins`` and defines
``out``; ``results`` are the value ids the region returns, in output order. On disk (``to_json``)::

    {"version": 2, "inputs": [{"shape", "dtype"}...], "outputs": [...], "steps": [step...],
     "results": [value id...]}

with a step ``{"in": [ids], "out": id, "op": name, ...}`` whose remaining keys are its attributes (the
fields of its op's attribute class below, and for conv2d and matmul those of :class:`PostOps`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Union

import numpy as np

from .types import TensorSpec, numpy_dtype

VERSION = 2


class StepOp(str, Enum):
    """A step's operation (its JSON name is the value)."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"
    CONV2D = "conv2d"
    MATMUL = "matmul"
    BROADCAST = "broadcast"
    CONVERT = "convert"
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    CONST = "const"


#: Binary elementwise ops on two same-shaped operands.
ELEMENTWISE = frozenset({StepOp.ADD, StepOp.SUB, StepOp.MUL, StepOp.DIV, StepOp.MAX, StepOp.MIN})
#: oneDNN eltwise post-ops a conv2d or matmul step may end with ("none": no activation).
ACTIVATIONS = ("none", "relu", "gelu", "sigmoid", "swish", "tanh", "hardtanh", "hardswish", "hardsigmoid",
               "leaky_relu")


# -- JSON readers: each returns the typed value or raises a one-line ValueError naming the key -------------

def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(data: dict, key: str, minimum: int | None = None) -> int:
    v = data.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or (minimum is not None and v < minimum):
        raise ValueError(f"{key}: expected an integer{'' if minimum is None else f' >= {minimum}'}, "
                         f"got {_short(v)}")
    return v


def _ints(data: dict, key: str, length: int | None = None, minimum: int | None = None) -> tuple[int, ...]:
    v = data.get(key)
    if not (isinstance(v, list) and (length is None or len(v) == length)
            and all(isinstance(x, int) and not isinstance(x, bool) and (minimum is None or x >= minimum)
                    for x in v)):
        size = "" if length is None else f"{length} "
        raise ValueError(f"{key}: expected a list of {size}integers{'' if minimum is None else f' >= {minimum}'}, "
                         f"got {_short(v)}")
    return tuple(v)


def _str(data: dict, key: str, choices: tuple[str, ...] | None = None) -> str:
    v = data.get(key)
    if not isinstance(v, str) or (choices is not None and v not in choices):
        raise ValueError(f"{key}: expected {'a string' if choices is None else 'one of ' + ', '.join(choices)}, "
                         f"got {_short(v)}")
    return v


def _bool(data: dict, key: str) -> bool:
    v = data.get(key)
    if not isinstance(v, bool):
        raise ValueError(f"{key}: expected true or false, got {_short(v)}")
    return v


def _element(data: dict, key: str) -> str:
    v = data.get(key)
    if not isinstance(v, str) or numpy_dtype(v) is None:
        raise ValueError(f"{key}: expected an element type numpy carries, got {_short(v)}")
    return v


# -- attributes, one class per op family ----------------------------------------------------------------

@dataclass(frozen=True)
class PostOps:
    """The epilogue fused into a conv2d or matmul step, applied in this order: a bias (the step's next
    input, ``bias_size`` elements along the output channel), a binary op with the input after it
    (``"add"``: a residual), an activation (``act`` with its ``scalars`` and ``algorithm``)."""

    bias: bool = False
    binary: str | None = None
    act: str = "none"
    scalars: tuple[float, ...] = ()
    algorithm: str = ""
    bias_size: int | None = None

    def to_json(self) -> dict:
        out: dict = {"bias": self.bias, "binary": self.binary, "act": self.act, "scalars": list(self.scalars),
                     "algorithm": self.algorithm}
        if self.bias_size is not None:
            out["bias_size"] = self.bias_size
        return out

    @classmethod
    def from_json(cls, data: dict) -> "PostOps":
        bias = _bool(data, "bias")
        binary = data.get("binary")
        if binary not in (None, "add"):
            raise ValueError(f"binary: expected null or 'add', got {_short(binary)}")
        scalars = data.get("scalars")
        if not (isinstance(scalars, list)
                and all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scalars)):
            raise ValueError(f"scalars: expected a list of numbers, got {_short(scalars)}")
        bias_size = _int(data, "bias_size", 1) if bias or "bias_size" in data else None
        return cls(bias, binary, _str(data, "act", ACTIVATIONS), tuple(scalars), _str(data, "algorithm"), bias_size)

    @property
    def extra_inputs(self) -> int:
        """Inputs the epilogue reads after the anchor's two."""
        return int(self.bias) + int(self.binary is not None)


@dataclass(frozen=True)
class Conv2d:
    """A 2-D convolution; ``layouts`` are the input, kernel and output dimension letters (``b01f``,
    ``oi01``, ...: batch/feature, output/input channel, spatial 0 and 1), ``padding`` symmetric per axis."""

    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    layouts: tuple[str, str, str]

    def to_json(self) -> dict:
        return {"stride": list(self.stride), "padding": list(self.padding), "dilation": list(self.dilation),
                "groups": self.groups, "layouts": list(self.layouts)}

    @classmethod
    def from_json(cls, data: dict) -> "Conv2d":
        layouts = data.get("layouts")
        if not (isinstance(layouts, list) and len(layouts) == 3 and all(isinstance(s, str) for s in layouts)
                and sorted(layouts[0]) == sorted(layouts[2]) == sorted("bf01") and sorted(layouts[1]) == sorted("oi01")):
            raise ValueError(f"layouts: expected [input, kernel, output] permutations of bf01, oi01, bf01, "
                             f"got {_short(layouts)}")
        return cls(_ints(data, "stride", 2, 1), _ints(data, "padding", 2, 0),  # type: ignore[arg-type]
                   _ints(data, "dilation", 2, 1), _int(data, "groups", 1), tuple(layouts))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Matmul:
    """``[batch..] x M x K`` times ``[batch..] x K x N``, or ``N x K`` where ``transpose_rhs``."""

    transpose_rhs: bool

    def to_json(self) -> dict:
        return {"transpose_rhs": self.transpose_rhs}

    @classmethod
    def from_json(cls, data: dict) -> "Matmul":
        return cls(_bool(data, "transpose_rhs"))


@dataclass(frozen=True)
class Broadcast:
    """Input axis ``i`` becomes output axis ``dims[i]`` of ``shape`` (stablehlo.broadcast_in_dim)."""

    dims: tuple[int, ...]
    shape: tuple[int, ...]

    def to_json(self) -> dict:
        return {"dims": list(self.dims), "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: dict) -> "Broadcast":
        shape = _ints(data, "shape", minimum=0)
        dims = _ints(data, "dims", minimum=0)
        if any(d >= len(shape) for d in dims):
            raise ValueError(f"dims: {list(dims)} outside rank {len(shape)}")
        return cls(dims, shape)


@dataclass(frozen=True)
class Convert:
    """Element type conversion to ``dtype``."""

    dtype: str

    def to_json(self) -> dict:
        return {"dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict) -> "Convert":
        return cls(_element(data, "dtype"))


@dataclass(frozen=True)
class Reshape:
    shape: tuple[int, ...]

    def to_json(self) -> dict:
        return {"shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: dict) -> "Reshape":
        return cls(_ints(data, "shape", minimum=0))


@dataclass(frozen=True)
class Transpose:
    """Output axis ``i`` is input axis ``perm[i]``."""

    perm: tuple[int, ...]

    def to_json(self) -> dict:
        return {"perm": list(self.perm)}

    @classmethod
    def from_json(cls, data: dict) -> "Transpose":
        perm = _ints(data, "perm")
        if sorted(perm) != list(range(len(perm))):
            raise ValueError(f"perm: expected a permutation, got {_short(list(perm))}")
        return cls(perm)


@dataclass(frozen=True)
class Const:
    """A constant tensor: ``value`` is its nested list of numbers as ``numpy.ndarray.tolist`` writes it
    (kept as is, not hashed: constants may hold weights)."""

    value: Any = field(hash=False)
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"value": self.value, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict) -> "Const":
        shape, dtype = _ints(data, "shape", minimum=0), _element(data, "dtype")
        value = data.get("value")
        try:
            arr = np.asarray(value)
        except ValueError:  # ragged
            arr = None
        if arr is None or arr.dtype.kind not in "biuf" or arr.shape != shape:
            raise ValueError(f"value: expected a nested list of numbers of shape {list(shape)}")
        return cls(value, shape, dtype)


Attrs = Union[Conv2d, Matmul, Broadcast, Convert, Reshape, Transpose, Const]

#: Each op's attribute class (None: elementwise ops have none).
ATTRS: dict[StepOp, type | None] = {
    **{op: None for op in ELEMENTWISE},
    StepOp.CONV2D: Conv2d, StepOp.MATMUL: Matmul, StepOp.BROADCAST: Broadcast, StepOp.CONVERT: Convert,
    StepOp.RESHAPE: Reshape, StepOp.TRANSPOSE: Transpose, StepOp.CONST: Const,
}
_FUSED = (StepOp.CONV2D, StepOp.MATMUL)


@dataclass(frozen=True)
class Step:
    """One operation: ``op`` on the values ``ins`` defining value ``out``, with its op's ``attrs`` and, for
    conv2d and matmul, the fused epilogue ``post``."""

    op: StepOp
    ins: tuple[int, ...]
    out: int
    attrs: Attrs | None = None
    post: PostOps | None = None

    def __post_init__(self) -> None:
        want = ATTRS[self.op]
        if (self.attrs is None) != (want is None) or (want is not None and not isinstance(self.attrs, want)):
            raise ValueError(f"{self.op.value}: attributes {type(self.attrs).__name__}, expected "
                             f"{getattr(want, '__name__', None)}")
        if (self.post is not None) != (self.op in _FUSED):
            raise ValueError(f"{self.op.value}: post-ops belong to conv2d and matmul steps only")
        arity = (2 if self.op in ELEMENTWISE else 0 if self.op is StepOp.CONST
                 else 2 + self.post.extra_inputs if self.post is not None else 1)
        if len(self.ins) != arity:
            raise ValueError(f"{self.op.value}: {len(self.ins)} inputs, expected {arity}")

    def to_json(self) -> dict:
        out = {"in": list(self.ins), "out": self.out, "op": self.op.value}
        if self.attrs is not None:
            out.update(self.attrs.to_json())
        if self.post is not None:
            out.update(self.post.to_json())
        return out

    @classmethod
    def from_json(cls, data: object) -> "Step":
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, got {_short(data)}")
        try:
            op = StepOp(data.get("op"))
        except ValueError:
            raise ValueError(f"op: unknown step op {_short(data.get('op'))}") from None
        kind = ATTRS[op]
        return cls(op, _ints(data, "in", minimum=0), _int(data, "out", 0),
                   kind.from_json(data) if kind is not None else None,  # type: ignore[attr-defined]
                   PostOps.from_json(data) if op in _FUSED else None)


@dataclass(frozen=True)
class StepProgram:
    """A region as steps: its tensor signature, the steps in dependency order and the value ids it
    returns. Built valid: every step reads only inputs or earlier steps' values, each value is defined
    once, and ``results`` name one defined value per output."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    steps: tuple[Step, ...]
    results: tuple[int, ...]
    version: int = VERSION

    def __post_init__(self) -> None:
        if self.version != VERSION:
            raise ValueError(f"step program version {self.version!r} (this runtime reads {VERSION})")
        defined = set(range(len(self.inputs)))
        for k, step in enumerate(self.steps):
            missing = [i for i in step.ins if i not in defined]
            if missing:
                raise ValueError(f"step {k} ({step.op.value}) reads value {missing[0]} before it is defined")
            if step.out in defined:
                raise ValueError(f"step {k} ({step.op.value}) defines value {step.out} again")
            defined.add(step.out)
        if len(self.results) != len(self.outputs):
            raise ValueError(f"{len(self.results)} results for {len(self.outputs)} outputs")
        missing = [r for r in self.results if r not in defined]
        if missing:
            raise ValueError(f"result value {missing[0]} is never defined")

    def to_json(self) -> dict:
        """The program's JSON object (``json.dumps`` writes the file)."""
        return {"version": self.version, "inputs": [s.to_json() for s in self.inputs],
                "outputs": [s.to_json() for s in self.outputs], "steps": [s.to_json() for s in self.steps],
                "results": list(self.results)}

    @classmethod
    def from_json(cls, data: object) -> "StepProgram":
        """The program ``to_json`` wrote; a one-line ValueError naming what is wrong otherwise."""
        if not isinstance(data, dict):
            raise ValueError(f"step program: expected an object, got {_short(data)}")
        version = data.get("version")
        if version != VERSION:
            raise ValueError(f"step program version {_short(version)} (this runtime reads {VERSION})")
        specs = {}
        for key in ("inputs", "outputs"):
            items = data.get(key)
            try:
                if not isinstance(items, list):
                    raise ValueError
                specs[key] = tuple(TensorSpec.from_json(s) for s in items)
            except ValueError:
                raise ValueError(f"{key}: expected a list of {{shape: [int...], dtype}} entries") from None
        raw = data.get("steps")
        if not isinstance(raw, list):
            raise ValueError(f"steps: expected a list, got {_short(raw)}")
        steps = []
        for k, s in enumerate(raw):
            try:
                steps.append(Step.from_json(s))
            except ValueError as exc:
                raise ValueError(f"step {k}: {exc}") from None
        return cls(specs["inputs"], specs["outputs"], tuple(steps), _ints(data, "results", minimum=0), version)


__all__ = ["VERSION", "StepOp", "ELEMENTWISE", "ACTIVATIONS", "PostOps", "Conv2d", "Matmul", "Broadcast",
           "Convert", "Reshape", "Transpose", "Const", "Attrs", "Step", "StepProgram"]
