"""Thin read-only accessors for StableHLO ops, which have no Python op classes in IREE's bindings."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from collage_runtime.types import NumberFormat, byte_dtype, numpy_dtype

from ..ir import ir


@dataclass(frozen=True)
class QuantType:
    """A ``!quant.uniform`` element type: integer ``storage`` (``i8``, ``u8``) holding ``expressed`` values
    (``f32``) as ``scale * (stored - zero_point)``; one scale and zero point, or one per index of ``axis``.
    ``storage_range``: a narrowed range (``i8<-127:127>``), else None (the storage type's full range)."""

    storage: str
    expressed: str
    scales: tuple[float, ...]
    zero_points: tuple[int, ...]
    axis: int | None = None
    storage_range: tuple[int, int] | None = None

    def spelled(self) -> str:
        """The type as MLIR spells it (``quant_type``'s inverse)."""
        storage = self.storage if self.storage_range is None else f"{self.storage}<{self.storage_range[0]}:" \
            f"{self.storage_range[1]}>"
        params = [f"{s!r}:{z}" for s, z in zip(self.scales, self.zero_points)]
        if self.axis is None:
            return f"!quant.uniform<{storage}:{self.expressed}, {params[0]}>"
        return f"!quant.uniform<{storage}:{self.expressed}:{self.axis}, {{{','.join(params)}}}>"

    #: numpy dtype of each storage type.
    NUMPY = {"i8": np.int8, "u8": np.uint8, "i16": np.int16, "u16": np.uint16, "i32": np.int32}

    def _view(self, ndim: int) -> tuple[np.ndarray, np.ndarray]:
        shape = [1] * ndim
        if self.axis is not None:
            shape[self.axis] = len(self.scales)
        return (np.array(self.scales, np.float32).reshape(shape if self.axis is not None else ()),
                np.array(self.zero_points, np.float32).reshape(shape if self.axis is not None else ()))

    def quantize(self, value: np.ndarray) -> np.ndarray:
        """``value`` quantized as ``uniform_quantize`` (and ONNX's ``QuantizeLinear``) does: divided by the
        scale, rounded half to even, offset by the zero point, saturated to the storage range."""
        scale, zero_point = self._view(value.ndim)
        dtype = self.NUMPY[self.storage]
        lo, hi = self.storage_range or (np.iinfo(dtype).min, np.iinfo(dtype).max)
        stored = np.rint(value.astype(np.float32) / scale).astype(np.float64) + zero_point
        return np.clip(stored, lo, hi).astype(dtype)

    def expressed_range(self) -> tuple[float, float] | None:
        """The values a per-tensor quantization can express, (lowest, highest) in f32 (what a quantize
        saturates to); None per axis."""
        if self.axis is not None:
            return None
        dtype = self.NUMPY[self.storage]
        lo, hi = self.storage_range or (np.iinfo(dtype).min, np.iinfo(dtype).max)
        return tuple(float(v) for v in self.dequantize(np.array([lo, hi])))

    def dequantize(self, stored: np.ndarray) -> np.ndarray:
        """``uniform_dequantize``: ``scale * (stored - zero_point)`` in the expressed type (f32)."""
        scale, zero_point = self._view(stored.ndim)
        return ((stored.astype(np.float64) - zero_point) * scale).astype(np.float32)

    def signed(self) -> "QuantType":
        """The same values in signed storage: ``u8`` as ``i8`` with each zero point (and the range) 128 lower."""
        if not self.storage.startswith("u"):
            return self
        bits = int(self.storage[1:])
        shift = 1 << (bits - 1)
        return QuantType(f"i{bits}", self.expressed, self.scales, tuple(z - shift for z in self.zero_points), self.axis,
                         None if self.storage_range is None else tuple(r - shift for r in self.storage_range))


_QUANT = re.compile(r"!quant\.uniform<([iu]\d+)(?:<(-?\d+):(-?\d+)>)?:(\w+)(?::(\d+))?,\s*(.*)>$")


#: A ``!quant.uniform`` type in MLIR text (its storage type may carry a ``<lo:hi>`` range).
QUANT_TYPE_TEXT = re.compile(r"!quant\.uniform<[^<>]*(?:<[^<>]*>)?[^<>]*>")


#: A reduction body's single combining op, by name, as ``reduce_kind`` gives it.
REDUCE_KINDS = {"stablehlo.add": "add", "stablehlo.multiply": "mul", "stablehlo.maximum": "max",
                "stablehlo.minimum": "min", "stablehlo.and": "and", "stablehlo.or": "or"}


def reduce_kind(op: ir.Operation) -> str | None:
    """What the body of ``op`` (a ``stablehlo.reduce``/``reduce_window``) does when it is one add, multiply,
    maximum, minimum, and or or of its two block arguments, returned (``REDUCE_KINDS``); else None."""
    body = op.regions[0].blocks[0] if op.regions and len(op.regions[0].blocks) else None
    if body is None:
        return None
    ops = [o.operation for o in body.operations]
    if len(ops) != 2 or ops[1].name != "stablehlo.return":
        return None
    args = list(body.arguments)
    if not all(any(x == a for a in args) for x in ops[0].operands) or len(ops[0].operands) != 2:
        return None
    return REDUCE_KINDS.get(ops[0].name)


def matching_ops(module: ir.Module | ir.Operation, predicate) -> list[ir.Operation]:
    """The ops of ``module`` (nested ones included, in walk order: producers before their users) for which
    ``predicate(op)`` holds."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if predicate(op.operation):
            found.append(op.operation)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def quantizes(module: ir.Module | ir.Operation) -> bool:
    """Whether the module holds a ``uniform_quantize`` or ``uniform_dequantize``."""
    found = False

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal found
        found = op.name in ("stablehlo.uniform_quantize", "stablehlo.uniform_dequantize")
        return ir.WalkResult.INTERRUPT if found else ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def dequantize_pairs(ops: list[ir.Operation]) -> list[ir.Operation]:
    """The float form of a region (``ops``, top-level): each use, by an op of ``ops`` or nested in one, of a
    ``uniform_dequantize(uniform_quantize(x))`` with ``x`` float reads ``x`` instead, clamped to the range
    the quantization expresses where that range starts at exactly 0 (a quantizer folded a ReLU or ReLU6
    into it: that saturation is the model's; saturation at a calibrated edge is quantization error, which
    the float form drops with the rounding). The quantize may be outside ``ops`` (a weight's constant
    expression). Pairs whose result leaves ``ops``, and a per-axis pair of a computed value, keep serving
    those uses. A clamp and its bounds are inserted before the dequantize, with its attributes but its
    ``collage.id``. Returns the dequantize and quantize ops left without uses, in an order the caller
    erases them in."""
    # Compared with ``==`` (the same op): a set of Python op objects loses track of an op once one of its
    # operands changes through another object of it.
    inside: list[ir.Operation] = []
    for op in ops:
        op.operation.walk(lambda o: inside.append(o.operation) or ir.WalkResult.ADVANCE)
    dead: list[ir.Operation] = []
    for dq in [op.operation for op in ops if op.operation.name == "stablehlo.uniform_dequantize"]:
        owner = dq.operands[0].owner
        if not isinstance(owner, (ir.Operation, ir.OpView)) or owner.operation.name != "stablehlo.uniform_quantize":
            continue
        x = owner.operation.operands[0]
        tt = tensor_type(owner.operation.results[0])
        q = None if tt is None else quant_type(tt[1])
        if x.type != dq.results[0].type or q is None:  # a requantize (x quantized), or a float of another width
            continue
        bounds = q.expressed_range()
        if const_expr_ops(x, readable=False) is not None:
            bounds = None  # a weight: within its own range
        elif bounds is None:
            continue
        elif bounds[0] != 0.0:
            bounds = None
        uses = [u for u in dq.results[0].uses if any(u.owner.operation == o for o in inside)]
        if not uses:
            continue
        value = x
        if bounds is not None:
            attrs = {name: dq.attributes[name] for name in list(dq.attributes) if name != "collage.id"}
            with dq.context, dq.location, ir.InsertionPoint(dq):
                scalar = ir.RankedTensorType.get([], ir.RankedTensorType(x.type).element_type)
                lo, hi = (ir.Operation.create("stablehlo.constant", results=[scalar], attributes={
                    **attrs, "value": ir.DenseElementsAttr.get(np.array(b, np.float32), type=scalar)})
                    for b in bounds)
                value = ir.Operation.create("stablehlo.clamp", results=[x.type], operands=[
                    lo.results[0], x, hi.results[0]], attributes=attrs).results[0]
        for use in uses:
            use.owner.operation.operands[use.operand_number] = value
        if not list(dq.results[0].uses):
            dead.append(dq)
    dequantizes = len(dead)
    for dq in dead[:dequantizes]:
        q = dq.operands[0].owner.operation
        if not any(q == d for d in dead) and all(any(u.owner.operation == d for d in dead) for u in q.results[0].uses):
            dead.append(q)
    return dead


def fold_constant_quantization(module: ir.Module | ir.Operation) -> int:
    """Replaces each ``uniform_dequantize(uniform_quantize(c))`` of a constant expression ``c`` by the f32
    constant it computes; returns how many. (For IREE 3.13, which leaves a per-axis quantize of a
    constant as an illegal ``chlo.broadcast_divide``; it computes the pair in f32 anyway.)"""
    def quantized_pair(op: ir.Operation) -> bool:
        owner = op.operands[0].owner if op.name == "stablehlo.uniform_dequantize" else None
        return isinstance(owner, (ir.Operation, ir.OpView)) and owner.operation.name == "stablehlo.uniform_quantize"

    pairs = matching_ops(module, quantized_pair)
    folded = 0
    for dq in pairs:
        quantize = dq.operands[0].owner.operation
        value, tt = const_expr_value(quantize.operands[0]), tensor_type(quantize.results[0])
        q = None if tt is None else quant_type(tt[1])
        if value is None or q is None or q.expressed != "f32" or q.storage not in QuantType.NUMPY \
                or tensor_type(dq.results[0]) is None or tensor_type(dq.results[0])[1] != "f32":
            continue
        real = np.ascontiguousarray(q.dequantize(q.quantize(np.asarray(value))))
        with dq.context, dq.location, ir.InsertionPoint(dq):
            const = ir.Operation.create("stablehlo.constant", results=[dq.results[0].type], attributes={
                "value": ir.DenseElementsAttr.get(real, type=dq.results[0].type)})
        dq.results[0].replace_all_uses_with(const.results[0])
        dq.erase()
        if not list(quantize.results[0].uses):
            quantize.erase()
        folded += 1
    return folded


#: Elementwise float ops ``fold_splat_math`` computes when every operand is a splat constant.
SPLAT_MATH = {
    "stablehlo.rsqrt": lambda x: 1 / np.sqrt(x), "stablehlo.sqrt": np.sqrt, "stablehlo.negate": np.negative,
    "stablehlo.exponential": np.exp, "stablehlo.log": np.log, "stablehlo.abs": np.abs, "stablehlo.tanh": np.tanh,
    "stablehlo.logistic": lambda x: 1 / (1 + np.exp(-x)), "stablehlo.add": np.add,
    "stablehlo.subtract": np.subtract, "stablehlo.multiply": np.multiply, "stablehlo.divide": np.divide,
    "stablehlo.maximum": np.maximum, "stablehlo.minimum": np.minimum, "stablehlo.power": np.power,
}


def _splat(value: ir.Value) -> np.ndarray | None:
    """The scalar of a splat float constant (numpy-typed), else None."""
    owner = value.owner
    if isinstance(owner, ir.Block) or owner.operation.name != "stablehlo.constant":
        return None
    attr, tt = owner.operation.attributes["value"], tensor_type(value)
    if not isinstance(attr, ir.DenseElementsAttr) or not attr.is_splat or tt is None:
        return None
    splat, dtype = attr.get_splat_value(), byte_dtype(tt[1])
    if not isinstance(splat, ir.FloatAttr) or dtype is None or dtype.kind != "f":
        return None
    return np.asarray(splat.value, dtype)


def fold_splat_math(module: ir.Module | ir.Operation) -> int:
    """Replaces each elementwise float op of ``SPLAT_MATH`` whose operands are all splat constants by the
    splat constant it computes (in the element type); returns how many. Importers write a GELU's
    ``1/sqrt(2)`` as ``rsqrt`` of a splat 2.0 shaped like the activation, and CSE shares it between every
    layer: left as an op, it is computed once and crosses every region boundary after it as a run-time
    tensor (a BERT cut in two passed a 1.5 MB [1, 128, 3072] splat from one OpenVINO region to the next,
    which then could not fuse its GELUs)."""
    folded = 0
    # Producers first (walk order), so a chain of splat math folds in one pass.
    for op in matching_ops(module, lambda op: op.name in SPLAT_MATH):
        operands = [_splat(v) for v in op.operands]
        tt = tensor_type(op.results[0])
        if any(x is None for x in operands) or tt is None or byte_dtype(tt[1]) != operands[0].dtype:
            continue
        with np.errstate(all="ignore"):
            value = np.asarray(SPLAT_MATH[op.name](*operands)).astype(operands[0].dtype)
        if not np.isfinite(value):
            continue
        result = op.results[0].type
        element = ir.RankedTensorType(result).element_type
        with op.context, op.location, ir.InsertionPoint(op):
            const = ir.Operation.create("stablehlo.constant", results=[result], attributes={
                "value": ir.DenseElementsAttr.get_splat(result, ir.FloatAttr.get(element, float(value)))})
        sources: list[ir.Operation] = []
        for v in op.operands:  # x * x reads one constant twice: erase it once
            if not any(v.owner.operation == s for s in sources):
                sources.append(v.owner.operation)
        op.results[0].replace_all_uses_with(const.results[0])
        op.erase()
        for source in sources:
            if not list(source.results[0].uses):
                source.erase()
        folded += 1
    return folded


#: Ops ``fold_identity_ops`` drops where they give their operand's own type, in order.
IDENTITY_CANDIDATES = ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.convert", "stablehlo.transpose")


def fold_identity_ops(module: ir.Module | ir.Operation) -> int:
    """Replaces each op that returns its operand unchanged (a ``broadcast_in_dim``, ``reshape``,
    ``convert`` or ``transpose`` to its operand's own type, in order) by that operand; returns how many.
    Importers leave them (torch-mlir's index wrap-around of an embedding broadcasts an i1 [1, 128] to
    itself), and each is an op the plan must place: ``prefer:openvino`` gave that one a region of its own
    between IREE ops, ~0.1-0.2 ms of boundaries and gaps on a BERT."""
    def identity(op: ir.Operation) -> bool:
        if op.name not in IDENTITY_CANDIDATES or len(op.operands) != 1 or op.operands[0].type != op.results[0].type:
            return False
        order = list(range(len(ir.RankedTensorType(op.results[0].type).shape))) \
            if isinstance(op.results[0].type, ir.RankedTensorType) else None
        if op.name == "stablehlo.broadcast_in_dim":
            return broadcast_dims(op) == order
        if op.name == "stablehlo.transpose":
            return permutation(op) == order
        return True

    found = matching_ops(module, identity)
    for op in found:
        op.results[0].replace_all_uses_with(op.operands[0])
        op.erase()
    return len(found)


#: Contractions whose 16-bit float accumulation ``widen_half_contractions`` makes f32.
CONTRACTIONS = ("stablehlo.convolution", "stablehlo.dot_general")


def half_contractions(module: ir.Module | ir.Operation) -> list[ir.Operation]:
    """The convolutions and dot products of ``module`` whose operands and result are all f16 (or all bf16)."""
    def half(op: ir.Operation) -> bool:
        if op.name not in CONTRACTIONS or len(op.results) != 1:
            return False
        tt = tensor_type(op.results[0])
        return tt is not None and tt[1] in ("f16", "bf16") and all(
            tensor_type(v) is not None and tensor_type(v)[1] == tt[1] for v in op.operands)

    return matching_ops(module, half)


def stated_format(module: ir.Module | ir.Operation) -> NumberFormat:
    """The format the model states for its products: bf16 where it has convolutions or dot products and each
    multiplies bf16 values: bf16 operands (a JAX model cast to bf16; its sums may be f32), or bf16 ones
    converted to f32 first (torch-mlir's form of a bf16 model's batched matmuls); else f32."""
    def bf16(v: ir.Value) -> bool:
        tt = tensor_type(v)
        if tt is not None and tt[1] == "bf16":
            return True
        owner = v.owner  # a block (an argument) or an op view
        if isinstance(owner, ir.Block):
            return False
        return owner.operation.name == "stablehlo.convert" and bf16(owner.operation.operands[0])

    contractions = matching_ops(module, lambda op: op.name in CONTRACTIONS)
    return NumberFormat.BF16 if contractions and all(bf16(v) for op in contractions for v in op.operands) \
        else NumberFormat.F32


def _int_attr(op: ir.Operation, name: str) -> int:
    """An integer attribute of ``op`` (0 where absent)."""
    return ir.IntegerAttr(op.attributes[name]).value if name in op.attributes else 0


def widen_half_contractions(module: ir.Module | ir.Operation) -> int:
    """Makes each of ``half_contractions`` compute in f32 (its operands converted, exactly) and round its
    result once (``convert``), as ONNX Runtime and PyTorch accumulate on the CPU; returns how many. (IREE 3.13's llvm-cpu accumulates such a
    convolution in f16: ONNX's f16 causal-conv test came out 1.5 ulp off in 9 of 64 elements.)"""
    found = half_contractions(module)
    for op in found:
        narrow = op.results[0].type
        with op.context, op.location, ir.InsertionPoint(op):
            f32 = ir.F32Type.get()
            # f32 operands, not only an f32 result: IREE's grouped-convolution lowering refuses mixed types,
            # and folds converted operands back into one (behind a barrier it cannot).
            operands = [ir.Operation.create("stablehlo.convert", operands=[v], results=[
                ir.RankedTensorType.get(ir.RankedTensorType(v.type).shape, f32)]).results[0] for v in op.operands]
            if any(_int_attr(op, name) > 1 for name in ("feature_group_count", "batch_group_count")):
                operands = list(ir.Operation.create("stablehlo.optimization_barrier", operands=operands,
                                                    results=[v.type for v in operands]).results)
            widened = ir.Operation.create(op.name, results=[ir.RankedTensorType.get(
                ir.RankedTensorType(narrow).shape, f32)], operands=operands,
                attributes={name: op.attributes[name] for name in op.attributes})
            rounded = ir.Operation.create("stablehlo.convert", results=[narrow], operands=[widened.results[0]])
        op.results[0].replace_all_uses_with(rounded.results[0])
        op.erase()
    return len(found)


def element_bits(element: ir.Type) -> int:
    """The bits one element of type ``element`` takes: a quantized type's storage bits; 0 where unknown."""
    width = getattr(element, "width", None)
    if width is not None:
        return width
    q = quant_type(str(element))
    return int(q.storage[1:]) if q is not None else 0


def quant_type(element: str) -> QuantType | None:
    """The ``!quant.uniform`` type an element type string spells (``sh.tensor_type``'s), else None."""
    m = _QUANT.match(element.strip())
    if m is None:
        return None
    storage, lo, hi, expressed, axis, params = m.groups()
    items = [p.strip() for p in params.strip().strip("{}").split(",") if p.strip()]
    scales, zero_points = [], []
    for item in items:
        scale, _, zp = item.partition(":")
        scales.append(float(scale))
        zero_points.append(int(zp) if zp else 0)
    return QuantType(storage, expressed, tuple(scales), tuple(zero_points), None if axis is None else int(axis),
                     None if lo is None else (int(lo), int(hi)))


def ranked_type(value: ir.Value) -> tuple[tuple[int | None, ...], str] | None:
    """(shape, element type) of a ranked tensor value, None for each dynamic dim; None for anything else."""
    t = value.type
    if not isinstance(t, ir.RankedTensorType):
        return None
    return tuple(None if t.is_dynamic_dim(a) else t.get_dim_size(a) for a in range(t.rank)), str(t.element_type)


def tensor_type(value: ir.Value) -> tuple[tuple[int, ...], str] | None:
    """(shape, element type) of a statically shaped tensor value, else None."""
    t = value.type
    if not isinstance(t, ir.RankedTensorType):
        return None
    if not t.has_static_shape:
        return None
    return tuple(t.shape), str(t.element_type)


def _int_list(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", text)]


def _array_attr(op: ir.Operation, name: str, default: list[int]) -> list[int]:
    if name not in op.attributes:
        return default
    text = str(op.attributes[name])
    if text.startswith("array<"):  # array<i64: 1, 2>, or array<i64> when empty
        return _int_list(text.split(":", 1)[1]) if ":" in text else []
    return _int_list(text)


def dense_values(attr: ir.Attribute, shape: tuple[int, ...], element: str | None = None) -> np.ndarray | None:
    """A `dense<...>` attribute as a numpy array (None for dense_resource or unsupported types); a splat
    takes the numpy dtype of ``element`` (the tensor's element type) where given."""
    if not isinstance(attr, ir.DenseElementsAttr):
        return None
    dense = attr
    if dense.is_splat:
        splat = dense.get_splat_value()
        if isinstance(splat, (ir.FloatAttr, ir.IntegerAttr)):
            return np.full(shape, splat.value, dtype=numpy_dtype(element) if element else None)
        return None
    try:
        return np.array(attr)
    except (TypeError, ValueError, RuntimeError):  # e.g. bf16, which the bindings' buffer cannot carry
        return _printed_values(attr, shape, element)


_HEX_BLOB = re.compile(r'dense<"0x([0-9A-Fa-f]*)">')
_ELEMENT = re.compile(r"0x[0-9A-Fa-f]+|[-+]?(?:inf|nan|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")


def _printed_values(attr: ir.Attribute, shape: tuple[int, ...], element: str | None) -> np.ndarray | None:
    """A dense attribute of a float type numpy has no buffer for (bf16) read from its printed form: a hex
    blob of the elements' bytes, or a list whose elements are decimals or their raw bits (``0x7F80``)."""
    dtype = byte_dtype(element) if element else None
    if dtype is None or dtype.kind not in "fV":
        return None
    text = str(attr)
    count = int(np.prod(shape, dtype=np.int64))
    if (m := _HEX_BLOB.match(text)) is not None:
        raw = bytes.fromhex(m.group(1))
        return np.frombuffer(raw, dtype).reshape(shape).copy() if len(raw) == count * dtype.itemsize else None
    body = text[text.index("<") + 1:text.rindex(">", 0, text.rindex(":"))]
    tokens = _ELEMENT.findall(body)
    if len(tokens) != count:
        return None
    bits = np.dtype(f"u{dtype.itemsize}")
    out = np.empty(count, dtype)
    for k, t in enumerate(tokens):
        out[k] = np.array(int(t, 16), bits).view(dtype) if t.startswith("0x") else float(t)
    return out.reshape(shape)


def constant_value(op: ir.Operation) -> np.ndarray | None:
    """The value of a `stablehlo.constant`/`arith.constant` with a dense attribute, else None."""
    op = op.operation
    if op.name not in ("stablehlo.constant", "arith.constant") or "value" not in op.attributes:
        return None
    tt = tensor_type(op.results[0])
    if tt is None:
        return None
    return dense_values(op.attributes["value"], tt[0], tt[1])


_COMPLEX_PAIR = re.compile(r"\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)")
_COMPLEX_PARTS = {"complex<f32>": ("f32", np.complex64), "complex<f64>": ("f64", np.complex128)}


def split_complex_constants(module: ir.Module | ir.Operation) -> int:
    """Rewrites every dense constant of complex type as ``stablehlo.complex(real, imag)`` of two real
    constants; returns how many. The Python bindings cannot read a complex DenseElementsAttr (reading
    one raises, printing its attribute aborts the process), so no collage code must ever meet one; the
    values are taken from the op's printed form, which the C++ printer writes losslessly."""
    def complex_constant(op: ir.Operation) -> bool:
        t = op.results[0].type if op.name in ("stablehlo.constant", "arith.constant") and len(op.results) == 1 else None
        return isinstance(t, ir.RankedTensorType) and str(t.element_type) in _COMPLEX_PARTS

    found = matching_ops(module, complex_constant)
    for op in found:
        tt = ir.RankedTensorType(op.results[0].type)
        part, np_complex = _COMPLEX_PARTS[str(tt.element_type)]
        text = op.get_asm(large_elements_limit=None)
        literal = text[text.index("dense<") + len("dense<"):text.rindex("> :")]
        part_type = "tensor<" + "".join(f"{d}x" for d in tt.shape) + part + ">"
        if literal.startswith('"0x'):  # hex: interleaved (real, imag) pairs
            values = np.frombuffer(bytes.fromhex(literal[3:-1]), np_complex)
            pieces = [f'"0x{np.ascontiguousarray(getattr(values, a)).tobytes().hex().upper()}"' for a in ("real", "imag")]
        else:
            pieces = [_COMPLEX_PAIR.sub(rf"\{k}", literal) for k in (1, 2)]
        with op.location, ir.InsertionPoint(op):
            real, imag = (ir.Operation.create("stablehlo.constant", results=[ir.Type.parse(part_type)], attributes={
                "value": ir.Attribute.parse(f"dense<{piece}> : {part_type}")}).results[0] for piece in pieces)
            joined = ir.Operation.create("stablehlo.complex", results=[tt], operands=[real, imag])
        op.results[0].replace_all_uses_with(joined.results[0])
        op.erase()
    return len(found)


@dataclass(frozen=True)
class ConvInfo:
    """`stablehlo.convolution` attributes in plain Python."""

    lhs_layout: str  # e.g. "bf01"
    rhs_layout: str  # e.g. "oi01"
    out_layout: str
    strides: list[int]
    padding: list[tuple[int, int]]
    lhs_dilation: list[int]
    rhs_dilation: list[int]
    feature_groups: int
    batch_groups: int

    @property
    def spatial_rank(self) -> int:
        return len(self.strides)


def conv_info(op: ir.Operation) -> ConvInfo:
    op = op.operation
    dims = str(op.attributes["dimension_numbers"])
    m = re.search(r"\[([^\]]*)\]x\[([^\]]*)\]->\[([^\]]*)\]", dims)
    if m is None:
        raise ValueError(f"unrecognised convolution dimension numbers {dims}")
    lhs, rhs, out = ("".join(p.strip() for p in g.split(",")) for g in m.groups())
    nsp = sum(c.isdigit() for c in lhs)
    pad = _int_list(str(op.attributes["padding"]).split(":")[0]) if "padding" in op.attributes else []
    if len(pad) == 1:  # splat dense<k>
        pad = pad * (2 * nsp)
    pad = pad or [0] * (2 * nsp)
    ones = [1] * nsp
    return ConvInfo(
        lhs_layout=lhs,
        rhs_layout=rhs,
        out_layout=out,
        strides=_array_attr(op, "window_strides", ones),
        padding=[(pad[2 * i], pad[2 * i + 1]) for i in range(nsp)],
        lhs_dilation=_array_attr(op, "lhs_dilation", ones),
        rhs_dilation=_array_attr(op, "rhs_dilation", ones),
        feature_groups=ir.IntegerAttr(op.attributes["feature_group_count"]).value,
        batch_groups=ir.IntegerAttr(op.attributes["batch_group_count"]).value,
    )


@dataclass(frozen=True)
class DotInfo:
    """`stablehlo.dot_general` dimension numbers."""

    lhs_batch: list[int]
    rhs_batch: list[int]
    lhs_contract: list[int]
    rhs_contract: list[int]


def dot_info(op: ir.Operation) -> DotInfo:
    op = op.operation
    text = str(op.attributes["dot_dimension_numbers"])

    def dims(key: str) -> list[int]:
        m = re.search(key + r"\s*=\s*\[([^\]]*)\]", text)
        return _int_list(m.group(1)) if m else []

    return DotInfo(
        dims("lhs_batching_dimensions"),
        dims("rhs_batching_dimensions"),
        dims("lhs_contracting_dimensions"),
        dims("rhs_contracting_dimensions"),
    )


def block_ops(block: ir.Block) -> list[ir.Operation]:
    """The ops of a region's block (a ``while``'s cond or body, a ``sort``'s comparator), terminator aside."""
    return [o.operation for o in block.operations][:-1]


def returned(block: ir.Block) -> list[ir.Value]:
    """The values a region's block returns (its terminator's operands)."""
    return list(list(block.operations)[-1].operands)


def block_argument(value: ir.Value, block: ir.Block) -> int | None:
    """The position of ``value`` among ``block``'s arguments, else None."""
    return next((k for k, a in enumerate(block.arguments) if a == value), None)


def comparison(op: ir.Operation) -> tuple[str, str]:
    """A ``stablehlo.compare``'s direction and comparison type (``LT``, ``FLOAT``...; the type "" when unstated)."""
    op = op.operation
    direction = re.search(r"comparison_direction\s+(\w+)", str(op.attributes["comparison_direction"]))
    kind = re.search(r"comparison_type\s+(\w+)", str(op.attributes["compare_type"])) \
        if "compare_type" in op.attributes else None
    return (direction.group(1) if direction else ""), (kind.group(1) if kind else "")


def broadcast_dims(op: ir.Operation) -> list[int]:
    return _array_attr(op.operation, "broadcast_dimensions", [])


def permutation(op: ir.Operation) -> list[int]:
    return _array_attr(op.operation, "permutation", [])


#: Ops that only reshape or convert their operand: a tree of them over constants is a constant.
CONST_EXPR_OPS = ("stablehlo.convert", "stablehlo.reshape", "stablehlo.broadcast_in_dim")


def const_expr_ops(value: ir.Value, max_ops: int = 8, readable: bool = True) -> list[ir.Operation] | None:
    """The ops (producers first) of a constant expression ending at ``value``: dense constants under
    converts, reshapes and broadcasts, as torch-mlir emits for scalars. None when ``value`` is not one.
    With ``readable`` the constant's value must be readable here (a ``dense_resource`` weight is not)."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    op = owner.operation
    if op.name in ("stablehlo.constant", "arith.constant"):
        return [op] if not readable or constant_value(op) is not None else None
    if op.name not in CONST_EXPR_OPS or len(op.operands) != 1 or max_ops <= 1:
        return None
    inner = const_expr_ops(op.operands[0], max_ops - 1, readable)
    return None if inner is None else inner + [op]


#: Constants up to this many elements (or any splat) are cloned into every region that reads them.
SINK_MAX_ELEMENTS = 64


def sunk_chain(value: ir.Value, readers: set[ir.Operation] | None = None) -> list[ir.Operation] | None:
    """The constant-expression ops a region gets its own copy of for its input ``value``, else None (the
    value is passed in as an argument). Outlining and every backend's region checks decide by this one
    rule: a splat or small readable constant expression (a relu's zero, a GELU's coefficient) is cloned
    into any region; for a backend that embeds constants, whose region's ops (nested ones included) are
    ``readers``, so is every constant expression only the region reads (its weights)."""
    ops = const_expr_ops(value, readable=readers is None)
    if ops is None:
        return None
    if readers is not None and all(u.owner.operation in readers for u in value.uses):
        return ops
    data = const_expr_value(value)
    if data is None:
        return None
    if data.size <= SINK_MAX_ELEMENTS or (data.size and bool(np.all(data == data.flat[0]))):
        return ops
    return None


def clone_const_expr(chain: list[ir.Operation], ip: ir.InsertionPoint) -> list[ir.Operation]:
    """Clones a constant expression (``const_expr_ops``' chain, producers first) at ``ip``, each clone
    reading the previous one; the last clone's result is the expression's value."""
    clones: list[ir.Operation] = []
    for op in chain:
        clone = op.clone(ip=ip)
        if clones:
            clone.operands[0] = clones[-1].results[0]
        clones.append(clone)
    return clones


def const_expr_value(value: ir.Value) -> np.ndarray | None:
    """The value of a constant expression (see ``const_expr_ops``), else None."""
    ops = const_expr_ops(value)
    if ops is None:
        return None
    result = constant_value(ops[0])
    for op in ops[1:]:
        tt = tensor_type(op.results[0])
        if tt is None or byte_dtype(tt[1]) is None:
            return None
        shape, dtype = tt
        if op.name == "stablehlo.convert":
            result = result.astype(byte_dtype(dtype))
        elif op.name == "stablehlo.reshape":
            result = result.reshape(shape)
        else:
            view = [1] * len(shape)
            for src, dst in enumerate(broadcast_dims(op)):
                view[dst] = result.shape[src]
            result = np.broadcast_to(result.reshape(view), shape)
    return result


_RESOURCE_KEY = re.compile(r'dense_resource<"?([^">]+)"?>')
_RESOURCE_ENTRY = re.compile(r'^\s*"?([^":\s]+)"?\s*:\s*"0x([0-9A-Fa-f]*)"', re.M)


def resource_arrays(ops: list[ir.Operation]) -> list[np.ndarray | None]:
    """The values of ``dense_resource`` constants (torch-mlir's weights), one per op (None where the op
    is not one, or its type has no numpy equivalent). The bindings cannot read a blob directly, so the
    constants are printed in a scratch module and the hex blobs read back from its resource section."""
    keys = []
    for op in ops:
        attr = op.attributes["value"] if "value" in op.attributes else None
        m = _RESOURCE_KEY.match(str(attr)) if attr is not None and not isinstance(attr, ir.DenseElementsAttr) else None
        keys.append(m.group(1) if m else None)
    if not any(keys):
        return [None] * len(ops)
    with ops[0].context, ir.Location.unknown():
        scratch = ir.Module.create()
        for op, key in zip(ops, keys):
            if key:
                op.clone(ip=ir.InsertionPoint(scratch.body))
        text = scratch.operation.get_asm()
    blobs = {k: v for k, v in _RESOURCE_ENTRY.findall(text.split("{-#", 1)[-1])}
    out: list[np.ndarray | None] = []
    for op, key in zip(ops, keys):
        tt = tensor_type(op.results[0])
        if not key or key not in blobs or tt is None or byte_dtype(tt[1]) is None:
            out.append(None)
            continue
        shape, dtype = tt
        raw = bytes.fromhex(blobs[key])[4:]  # the first 4 bytes are the blob's alignment
        np_dtype = byte_dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if len(raw) == count * np_dtype.itemsize:
            out.append(np.frombuffer(raw, dtype=np_dtype).reshape(shape).copy())
        elif len(raw) == np_dtype.itemsize:  # a splat blob
            out.append(np.full(shape, np.frombuffer(raw, dtype=np_dtype)[0]))
        else:
            out.append(None)
    return out


def inline_bf16_resources(module: ir.Module) -> int:
    """Makes each ``dense_resource`` bf16 constant of ``module`` (torch-mlir's weights of a bf16 model) a
    ``dense`` hex attribute of the same bytes; returns how many. IREE 3.13's CPU path retypes bf16 constants
    to f32 and cannot retype a resource blob ("'arith.constant' op failed to verify that all of {value,
    result} have same type"), while JAX's hex constants compile."""
    ops = matching_ops(module, lambda op: op.name == "stablehlo.constant" and "value" in op.attributes
                       and not isinstance(op.attributes["value"], ir.DenseElementsAttr)
                       and (tt := tensor_type(op.results[0])) is not None and tt[1] == "bf16")
    values = resource_arrays(ops)
    count = 0
    with module.context:
        for op, value in zip(ops, values):
            if value is not None:
                op.attributes["value"] = ir.Attribute.parse(
                    f'dense<"0x{value.tobytes().hex().upper()}"> : {op.results[0].type}')
                count += 1
    return count
