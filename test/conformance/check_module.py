"""Python implementation of IREE's ``check`` VM module for the pip runtime.

The pip ``iree-base-runtime`` wheel has no ``iree-check-module``; programs
using the ``check`` dialect compile to a VM module that *imports* the functions
below. IREE 3.13 declares them (``--compile-to=vm``) as::

    vm.import private optional @check.expect_true(%operand : i32)
    vm.import private optional @check.expect_false(%operand : i32)
    vm.import private optional @check.expect_all_true(%device : !vm.ref<!hal.device>,
        %operand : !vm.ref<!hal.buffer_view>)
    vm.import private optional @check.expect_eq(%device : !vm.ref<!hal.device>,
        %lhs : !vm.ref<!hal.buffer_view>, %rhs : !vm.ref<!hal.buffer_view>)
    vm.import private optional @check.expect_almost_eq(%device : !vm.ref<!hal.device>,
        %lhs : !vm.ref<!hal.buffer_view>, %rhs : !vm.ref<!hal.buffer_view>,
        %atol : f32, %rtol : f32)

i.e. calling conventions ``0i_v``, ``0i_v``, ``0rr_v``, ``0rrr_v`` and
``0rrrff_v``. ``check.expect_eq_const`` / ``check.expect_almost_eq_const``
lower to the same imports with the constant materialised as a buffer view;
the compiler passes the default tolerance ``atol=1e-4, rtol=0`` when the op
gives none.

Semantics follow ``runtime/src/iree/modules/check/module.cc``:

* ``expect_eq``: element types, shapes and the raw bytes must all be equal
  (``memcmp``; so NaN == NaN with equal bits, ``-0.0 != 0.0``).
* ``expect_almost_eq``: element types and shapes equal, and for every element
  ``lhs == rhs || (isfinite(rhs) && |lhs - rhs| <= atol + rtol*|rhs|) ||
  (isnan(lhs) && isnan(rhs))``, computed in f32 (f64 for f64 data). Only
  floating-point element types are supported (others raise, as in IREE).
* ``expect_all_true``: every element nonzero (integer, f32 and f64 types; this
  implementation additionally accepts i1/bool storage).

Unlike the C++ module (which records a gtest failure and carries on), a failed
check is recorded in :class:`CheckLog` *and* raised, so the invocation fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import iree.runtime as rt
import ml_dtypes
import numpy as np

__all__ = ["CheckLog", "CheckFailure", "create_check_module", "element_dtype"]

_ET = rt.HalElementType
_DTYPES: dict[int, np.dtype] = {
    int(k): np.dtype(v)
    for k, v in [
        (_ET.BOOL_8, np.bool_),
        (_ET.INT_8, np.int8), (_ET.SINT_8, np.int8), (_ET.UINT_8, np.uint8),
        (_ET.INT_16, np.int16), (_ET.SINT_16, np.int16), (_ET.UINT_16, np.uint16),
        (_ET.INT_32, np.int32), (_ET.SINT_32, np.int32), (_ET.UINT_32, np.uint32),
        (_ET.INT_64, np.int64), (_ET.SINT_64, np.int64), (_ET.UINT_64, np.uint64),
        (_ET.FLOAT_16, np.float16), (_ET.FLOAT_32, np.float32), (_ET.FLOAT_64, np.float64),
        (_ET.BFLOAT_16, ml_dtypes.bfloat16),
        (_ET.COMPLEX_64, np.complex64), (_ET.COMPLEX_128, np.complex128),
        (_ET.FLOAT_8_E4M3_FN, ml_dtypes.float8_e4m3fn),
        (_ET.FLOAT_8_E4M3_FNUZ, ml_dtypes.float8_e4m3fnuz),
        (_ET.FLOAT_8_E5M2, ml_dtypes.float8_e5m2),
        (_ET.FLOAT_8_E5M2_FNUZ, ml_dtypes.float8_e5m2fnuz),
        (_ET.FLOAT_8_E8M0_FNU, ml_dtypes.float8_e8m0fnu),
    ]
}
_FLOAT_TYPES = {int(t) for t in (
    _ET.FLOAT_16, _ET.FLOAT_32, _ET.FLOAT_64, _ET.BFLOAT_16, _ET.FLOAT_8_E4M3_FN,
    _ET.FLOAT_8_E4M3_FNUZ, _ET.FLOAT_8_E5M2, _ET.FLOAT_8_E5M2_FNUZ, _ET.FLOAT_8_E8M0_FNU)}
# expect_all_true in module.cc supports ints and f32/f64; bool is our addition.
_ALL_TRUE_TYPES = {int(t) for t in (
    _ET.BOOL_8, _ET.INT_8, _ET.SINT_8, _ET.UINT_8, _ET.INT_16, _ET.SINT_16, _ET.UINT_16,
    _ET.INT_32, _ET.SINT_32, _ET.UINT_32, _ET.INT_64, _ET.SINT_64, _ET.UINT_64,
    _ET.FLOAT_32, _ET.FLOAT_64)}
_ET_NAMES = {int(v): k.lower() for k, v in _ET.__members__.items()}


def element_dtype(element_type: int) -> np.dtype | None:
    """numpy dtype for an IREE HAL element type, or None (e.g. packed i4)."""
    return _DTYPES.get(int(element_type))


class CheckFailure(AssertionError):
    """Raised from a check function when the expectation does not hold."""


@dataclass
class CheckLog:
    """Record of check calls made through one check module.

    ``checks`` counts every check call; ``failures`` holds one message per
    failed check (or per check that errored, e.g. unsupported element type).
    """

    checks: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        """Number of failed checks."""
        return len(self.failures)

    def mark(self) -> tuple[int, int]:
        """Snapshot ``(checks, failures)`` to compute per-invocation deltas."""
        return self.checks, len(self.failures)

    def since(self, mark: tuple[int, int]) -> tuple[int, list[str]]:
        """Checks run and failure messages recorded since ``mark``."""
        return self.checks - mark[0], self.failures[mark[1]:]


@dataclass
class _View:
    """Host copy of a buffer view: shape, HAL element type, raw bytes."""

    shape: tuple[int, ...]
    element_type: int
    raw: np.ndarray  # uint8, C-contiguous

    @property
    def type_name(self) -> str:
        return _ET_NAMES.get(self.element_type, hex(self.element_type))

    def typed(self) -> np.ndarray | None:
        """Flat typed array, or None when the element type has no numpy dtype."""
        dt = element_dtype(self.element_type)
        if dt is None or self.raw.size % dt.itemsize:
            return None
        return self.raw.view(dt)

    def describe(self, limit: int = 16) -> str:
        """``<shape>x<type>=[values...]`` truncated to ``limit`` elements."""
        shape = "".join(f"{d}x" for d in self.shape)
        vals = self.typed()
        vals = self.raw if vals is None else vals
        body = np.array2string(vals[:limit], separator=",", threshold=limit + 1,
                               max_line_width=10**6)
        more = f"...(+{vals.size - limit})" if vals.size > limit else ""
        return f"{shape}{self.type_name}={body}{more}"


def _host_bytes(device: rt.HalDevice, bv: rt.HalBufferView) -> np.ndarray:
    """Raw bytes of ``bv``; copies through a host-local staging buffer when the
    buffer is not host-mappable (mirrors TransferBuffersToHost in module.cc)."""
    n = bv.byte_length
    if n == 0:
        return np.zeros(0, np.uint8)
    buf = bv.get_buffer()
    mappable = (int(buf.memory_type()) & int(rt.MemoryType.HOST_VISIBLE)
                and int(buf.allowed_usage()) & int(rt.BufferUsage.MAPPING_SCOPED))
    if mappable:
        return np.array(bv.map().asarray([n], np.dtype(np.uint8)), copy=True)
    staging = device.allocator.allocate_buffer(
        memory_type=int(rt.MemoryType.HOST_LOCAL) | int(rt.MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(rt.BufferUsage.TRANSFER) | int(rt.BufferUsage.MAPPING),
        allocation_size=buf.byte_length())
    sem = device.create_semaphore(0)
    device.queue_copy(buf, staging, [], [(sem, 1)])
    sem.wait(1)
    data = np.array(staging.map().asarray([staging.byte_length()], np.dtype(np.uint8)))
    return data[:n]


def _first_mismatch(mask: np.ndarray) -> int:
    """Index of the first True in a flat boolean mask."""
    return int(np.argmax(mask))


def _where(i: int, shape: tuple[int, ...]) -> str:
    """``flat index i [= (a, b, ...)]`` for messages."""
    nd = tuple(int(x) for x in np.unravel_index(i, shape)) if len(shape) > 1 else None
    return f"flat index {i}" + (f" = {nd}" if nd else "")


def _val(x: np.generic) -> str:
    """Plain Python rendering of a numpy scalar."""
    return str(x)


class _CheckState:
    """Per-context state object; exported functions are its unbound methods."""

    def __init__(self, iface: rt.PyModuleInterface, device: rt.HalDevice, log: CheckLog):
        self.device, self.log = device, log

    def _read(self, ref: rt.VmRef) -> _View:
        bv = ref.deref(rt.HalBufferView)
        return _View(tuple(bv.shape), int(bv.element_type), _host_bytes(self.device, bv))

    def _fail(self, msg: str) -> None:
        self.log.failures.append(msg)
        raise CheckFailure(msg)

    def _read_pair(self, lhs_ref: rt.VmRef, rhs_ref: rt.VmRef) -> tuple[_View, _View, list[str]]:
        """Counts a two-operand check and reads its operands: both views, and how their element types and
        shapes differ."""
        self.log.checks += 1
        lhs, rhs = self._read(lhs_ref), self._read(rhs_ref)
        problems = []
        if lhs.element_type != rhs.element_type:
            problems.append(f"element types differ ({lhs.type_name} vs {rhs.type_name})")
        if lhs.shape != rhs.shape:
            problems.append(f"shapes differ ({lhs.shape} vs {rhs.shape})")
        return lhs, rhs, problems

    def _fail_pair(self, check: str, problems: list[str], lhs: _View, rhs: _View) -> None:
        """Fails ``check`` where ``problems`` has any, naming both operands."""
        if problems:
            self._fail(f"{check}: {'; '.join(problems)}\n  lhs: {lhs.describe()}\n  rhs: {rhs.describe()}")

    def expect_true(self, operand: int) -> None:
        """check.expect_true: scalar i32 must be nonzero."""
        self.log.checks += 1
        if not operand:
            self._fail(f"expect_true: expected {operand} to be nonzero")

    def expect_false(self, operand: int) -> None:
        """check.expect_false: scalar i32 must be zero."""
        self.log.checks += 1
        if operand:
            self._fail(f"expect_false: expected {operand} to be zero")

    def expect_all_true(self, _device: rt.VmRef, operand: rt.VmRef) -> None:
        """check.expect_all_true: every element of the buffer view is nonzero."""
        self.log.checks += 1
        v = self._read(operand)
        if v.element_type not in _ALL_TRUE_TYPES:
            self._fail(f"expect_all_true: unsupported element type {v.type_name}")
        vals = v.typed()
        bad = vals == 0
        if bad.any():
            i = _first_mismatch(bad)
            self._fail(f"expect_all_true: element at {_where(i, v.shape)} is "
                       f"{_val(vals[i])}; operand {v.describe()}")

    def expect_eq(self, _device: rt.VmRef, lhs_ref: rt.VmRef, rhs_ref: rt.VmRef) -> None:
        """check.expect_eq: same element type, shape and bytes."""
        lhs, rhs, problems = self._read_pair(lhs_ref, rhs_ref)
        if lhs.raw.size != rhs.raw.size or not np.array_equal(lhs.raw, rhs.raw):
            detail = "contents differ"
            lt, rt_ = lhs.typed(), rhs.typed()
            if lhs.raw.size == rhs.raw.size and lhs.raw.size:
                item = lt.itemsize if lt is not None else 1
                bad = (lhs.raw.reshape(-1, item) != rhs.raw.reshape(-1, item)).any(axis=1)
                i = _first_mismatch(bad)
                lv, rv = (lt[i], rt_[i]) if lt is not None else (lhs.raw[i], rhs.raw[i])
                where = _where(i, lhs.shape) if lt is not None else f"byte {i}"
                detail += f"; first mismatch at {where}: lhs={_val(lv)} rhs={_val(rv)}"
            problems.append(detail)
        self._fail_pair("expect_eq", problems, lhs, rhs)

    def expect_almost_eq(self, _device: rt.VmRef, lhs_ref: rt.VmRef, rhs_ref: rt.VmRef,
                         atol: float, rtol: float) -> None:
        """check.expect_almost_eq: numpy-isclose style compare of float views."""
        lhs, rhs, problems = self._read_pair(lhs_ref, rhs_ref)
        if not problems:
            if lhs.element_type not in _FLOAT_TYPES:
                self._fail(f"expect_almost_eq: unsupported element type {lhs.type_name}")
            ct = np.float64 if lhs.element_type == int(_ET.FLOAT_64) else np.float32
            a, b = lhs.typed().astype(ct), rhs.typed().astype(ct)
            atol_c, rtol_c = ct(np.float32(atol)), ct(np.float32(rtol))
            with np.errstate(invalid="ignore", over="ignore"):
                ok = ((a == b) | (np.isfinite(b) & (np.abs(a - b) <= atol_c + rtol_c * np.abs(b)))
                      | (np.isnan(a) & np.isnan(b)))
            if not ok.all():
                i = _first_mismatch(~ok)
                problems.append(
                    f"contents differ beyond atol={float(atol):g}, rtol={float(rtol):g}; "
                    f"first mismatch at {_where(i, lhs.shape)}: lhs={_val(a[i])} rhs={_val(b[i])} "
                    f"(diff {float(b[i]) - float(a[i]):.3e}, {int((~ok).sum())} of {ok.size} differ)")
        self._fail_pair("expect_almost_eq", problems, lhs, rhs)


_EXPORTS = {
    "expect_true": "0i_v",
    "expect_false": "0i_v",
    "expect_all_true": "0rr_v",
    "expect_eq": "0rrr_v",
    "expect_almost_eq": "0rrrff_v",
}


def create_check_module(device: rt.HalDevice, log: CheckLog) -> rt.VmModule:
    """Build a ``check`` VmModule whose results go to ``log``.

    ``device`` is used to stage non-host-mappable buffers (the device ref the
    VM passes cannot be dereferenced from Python). Keep the returned module
    alive for as long as any context using it.
    """
    iface = rt.PyModuleInterface("check", lambda i: _CheckState(i, device, log))
    for name, cconv in _EXPORTS.items():
        iface.export(name, cconv, getattr(_CheckState, name))
    return iface.create()
