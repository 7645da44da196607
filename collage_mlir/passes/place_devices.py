"""`collage-place-devices`: runs the regions of codegen backends that have an IREE device of their own
(``Backend.iree_device``, e.g. ``iree-cpu-dt``: llvm-cpu with data tiling and ukernels) on that device,
inside the same IREE program as the default llvm-cpu device.

When some region needs such a device, the pass

- declares the logical devices on the module: ``hal.device.targets`` (the default device at ordinal 0,
  then one per configuration, each a ``local`` device with the ``#hal.executable.target`` IREE resolves
  for its flags), ``hal.device.default``, and a ``stream.topology`` saying they share memory (so IREE
  elides the copies of cross-device transfers);
- pins each such region call: operands ``flow.tensor.transfer``-ed to its device, results transferred
  back to the default device; the call gets ``collage.device``;
- pins the operands of what runs on the default device (calls to its codegen regions, contractions
  left in the public functions) that it shares with another device — constants, and any value also
  transferred elsewhere (a weight argument read by both) — to the default device. Without this IREE
  3.13 may encode the shared value on the data-tiling device, and the default device reads a packed
  layout (measured: wrong results; with a shared argument the other order also failed to compile).
  Only shared values are pinned: a pin blocks fusion across it;
- inside each region function on another device, transfers the constants its contractions read to that
  device. A constant sunk into such a region (a splat, a small weight) has no device of its own, so
  IREE 3.13 hoists its data-tiling encoding into an initializer on the default device, whose
  resolver lays it out plainly, while the data-tiled kernel reads it as packed (measured: NaN under
  both drivers for one matmul with an 8×8 constant weight; the zero initial state of an LSTM gave
  wrong numbers that changed between calls).

Its result is IR: the module's ``collage.devices`` (the program's devices, for the manifest) and
``collage.iree_flags`` (what the whole program needs from iree-compile). Without such regions the module
is otherwise left as it is. Run after ``collage-lower``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from collage_runtime.manifest import DeviceEntry

from ..backends import DEFAULT_BACKEND, BackendKind, get_backend
from ..backends.iree_device import (DEFAULT_DEVICE_NAME, MULTI_DEVICE_FLAGS, IreeDevice, device_target,
                                    executable_target)
from ..dialects import collage
from ..errors import CollageError
from ..graph import body_ops, module_block, producer, public_funcs
from ..ir import ir, location_text
from .base import ModulePass
from .outline import region_functions

#: String attribute on a region call: the IREE device it was placed on.
DEVICE_ATTR = "collage.device"
#: Ops IREE may give data-tiling encodings: their constant operands get pinned on the default device.
CONTRACTIONS = ("stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution")
_CONSTANT_OPS = ("stablehlo.constant", "arith.constant", "stablehlo.iota")
#: llvm-cpu flags of the default device's executable target, unless the program says otherwise.
DEFAULT_FLAGS: tuple[str, ...] = ("--iree-llvmcpu-target-cpu=host",)


def _transfer(value: ir.Value, device: str, loc: ir.Location, ip: ir.InsertionPoint) -> ir.Value:
    t = value.type
    if isinstance(t, ir.RankedTensorType) and not t.has_static_shape:
        raise CollageError(f"cannot move a dynamically shaped tensor ({t}) to device @{device}; "
                           "regions on another IREE device need static shapes", where=location_text(loc),
                           location=loc)
    target = ir.Attribute.parse(f"#hal.device.affinity<@{device}>")
    op = ir.Operation.create("flow.tensor.transfer", results=[t], operands=[value],
                             attributes={"target": target}, loc=loc, ip=ip)
    return op.results[0]


def _is_tensor(value: ir.Value) -> bool:
    return isinstance(value.type, ir.RankedTensorType)


class _ConstantCheck:
    """Whether a value is computed from constants only (no function argument, no region op)."""

    def __init__(self) -> None:
        self._memo: dict[ir.Operation, bool] = {}

    def __call__(self, value: ir.Value) -> bool:
        op = producer(value)
        if op is None:
            return False
        stack, order = [op], []
        while stack:  # iterative post-order: constant chains can be long
            o = stack.pop()
            if o in self._memo:
                continue
            order.append(o)
            for v in o.operands:
                p = producer(v)
                if p is None:
                    self._memo[o] = False
                elif p not in self._memo:
                    stack.append(p)
        for o in reversed(order):
            if o in self._memo:
                continue
            if len(o.regions) or (not len(o.operands) and o.name not in _CONSTANT_OPS):
                self._memo[o] = False
            else:
                self._memo[o] = all(self._memo.get(producer(v), False) for v in o.operands)
        return self._memo[op]


@dataclass(frozen=True)
class PlaceDevicesPass(ModulePass):
    name = "collage-place-devices"
    summary = "Run regions of codegen backends with their own IREE device there (flow.tensor.transfer at boundaries)"
    #: llvm-cpu flags of the default device's executable target (option: comma-separated).
    default_flags: tuple[str, ...] = DEFAULT_FLAGS
    #: The program's default backend (the plan's): what runs on the default device.
    default_backend: str = DEFAULT_BACKEND

    def run(self, module: ir.Module | ir.Operation) -> None:
        block = module_block(module)
        mod_op = module.operation
        with mod_op.context:
            placed = self._region_devices(block)
            codegen_backends = {self.default_backend} | {b for _, b in placed.values()}
            extra: dict[str, IreeDevice] = {d.name: d for d, _ in placed.values() if d is not None}
            default = DeviceEntry(DEFAULT_DEVICE_NAME, 0, tuple(sorted(b for b in codegen_backends
                                                                        if get_backend(b).iree_device is None)))
            if not extra:
                collage.set_json_attr(mod_op, collage.DEVICES, [default.to_json()])
                collage.set_json_attr(mod_op, collage.IREE_FLAGS, [])
                return
            self._check_free(mod_op, block, extra)
            ordered = [extra[n] for n in sorted(extra)]
            default_target = executable_target(tuple(f for f in self.default_flags if f), False)
            devices = [replace(default, executable_target=default_target)]
            targets = [f"{DEFAULT_DEVICE_NAME} = {device_target(0, default_target)}"]
            for k, dev in enumerate(ordered, start=1):
                target = executable_target(dev.target_flags, dev.data_tiling)
                targets.append(f"{dev.name} = {device_target(k, target)}")
                devices.append(DeviceEntry(dev.name, k, tuple(sorted({b for d, b in placed.values() if d is dev})),
                                           target))
            names = [DEFAULT_DEVICE_NAME] + [d.name for d in ordered]
            links = ", ".join(f"(@{a} -> @{b} = {{unified_memory = true}})" for a in names for b in names if a != b)
            attrs = mod_op.attributes
            attrs["hal.device.targets"] = ir.Attribute.parse("{" + ", ".join(targets) + "}")
            attrs["hal.device.default"] = ir.StringAttr.get(DEFAULT_DEVICE_NAME)
            attrs["stream.topology"] = ir.Attribute.parse(f"#hal.device.topology<links = [{links}]>")
            self._pin(module, placed)
            flags = [f for d in ordered for f in d.program_flags] + list(MULTI_DEVICE_FLAGS)
            collage.set_json_attr(mod_op, collage.DEVICES, [d.to_json() for d in devices])
            collage.set_json_attr(mod_op, collage.IREE_FLAGS, list(dict.fromkeys(flags)))

    @staticmethod
    def _region_devices(block: ir.Block) -> dict[str, tuple[IreeDevice | None, str]]:
        """Region symbol → (its device, None for the default one; backend name), for codegen regions."""
        return {collage.symbol_name(fn): (backend.iree_device, backend.name)
                for fn, backend in region_functions(block) if backend.kind == BackendKind.CODEGEN}

    @staticmethod
    def _check_free(mod_op: ir.Operation, block: ir.Block, extra: dict[str, IreeDevice]) -> None:
        where = location_text(mod_op.location)
        if "hal.device.targets" in mod_op.attributes:
            raise CollageError("the module already declares IREE devices (hal.device.targets); regions of "
                               f"{', '.join(sorted(extra))} need devices of their own: drop the declaration or "
                               "keep those regions on the default backend", where=where)
        taken = {collage.symbol_name(op) for op in block.operations if "sym_name" in op.operation.attributes}
        for name in [DEFAULT_DEVICE_NAME, *extra]:
            if name in taken:
                raise CollageError(f"device name '{name}' clashes with a symbol of the module; rename the symbol",
                                   where=where)

    @staticmethod
    def _pin(module: ir.Module | ir.Operation, placed: dict[str, tuple[IreeDevice | None, str]]) -> None:
        is_constant = _ConstantCheck()
        for func in list(public_funcs(module)):
            on_default = []
            for op in list(body_ops(func)):
                callee = (ir.FlatSymbolRefAttr(op.attributes["callee"]).value
                          if op.name == "func.call" and "callee" in op.attributes else None)
                if callee in placed and DEVICE_ATTR not in op.attributes:
                    dev = placed[callee][0]
                    if dev is None:
                        on_default.append(op)
                        collage.set_str_attr(op, DEVICE_ATTR, DEFAULT_DEVICE_NAME)
                    else:
                        _pin_call(op, dev.name, lambda v: True, results_back=True)
                        collage.set_str_attr(op, DEVICE_ATTR, dev.name)
                elif op.name in CONTRACTIONS:
                    on_default.append(op)
            # Once every other device's operands are pinned: a value the default device shares with
            # another device (a constant, or anything also moved there) is pinned here too, or IREE may
            # hand the default device the other device's packed layout (measured: wrong numbers for a
            # weight argument shared by an iree-cpu-dt and an iree-cpu matmul).
            for op in on_default:
                _pin_call(op, DEFAULT_DEVICE_NAME, lambda v: is_constant(v) or _moved_elsewhere(v),
                          results_back=False)
        for fn, (dev, _) in ((fn, placed[collage.symbol_name(fn)]) for fn, _ in region_functions(module_block(module))
                             if collage.symbol_name(fn) in placed):
            if dev is not None:
                _own_constants(fn, dev.name, is_constant)


def _own_constants(fn: ir.Operation, device: str, is_constant: _ConstantCheck) -> None:
    """Transfers to ``device`` each constant operand of the contractions in region function ``fn``: the
    values IREE gives data-tiling encodings. Only those: a transferred constant is no longer folded, and
    transferring the scalar coefficients of a fused GELU epilogue overflowed the dispatch's stack
    (measured); constants read by epilogues were never seen to be mis-encoded."""
    for op in list(fn.regions[0].blocks[0].operations):
        op = op.operation
        if op.name not in CONTRACTIONS:
            continue
        for k, v in enumerate(list(op.operands)):
            if _is_tensor(v) and is_constant(v):
                op.operands[k] = _transfer(v, device, op.location, ir.InsertionPoint(op))


def _moved_elsewhere(value: ir.Value) -> bool:
    """Whether ``value`` is also transferred to a device other than the default one."""
    for use in value.uses:
        owner = use.owner.operation
        if owner.name == "flow.tensor.transfer" and f"@{DEFAULT_DEVICE_NAME}>" not in str(owner.attributes["target"]):
            return True
    return False


def _pin_call(op: ir.Operation, device: str, pin, *, results_back: bool) -> None:
    """Transfers ``op``'s tensor operands for which ``pin(value)`` holds to ``device``, and with
    ``results_back`` its tensor results back to the default device."""
    loc = op.location
    for k, v in enumerate(list(op.operands)):
        if _is_tensor(v) and pin(v):
            op.operands[k] = _transfer(v, device, loc, ir.InsertionPoint(op))
    if not results_back:
        return
    after = op
    for r in op.results:
        if not _is_tensor(r):
            continue
        back = _transfer(r, DEFAULT_DEVICE_NAME, loc, ir.InsertionPoint.after(after))
        r.replace_all_uses_except(back, back.owner.operation)
        after = back.owner.operation
