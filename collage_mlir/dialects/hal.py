"""IREE's ``hal.dispatch.extern``, built from Python: a kernel compiled outside IREE (PTX/cubin, SPIR-V)
dispatched in the program's own stream, as an ordinary dispatch of IREE's scheduler.

The op is built in generic form: IREE 3.13 parses its workgroup size and shared memory only as properties.
Operands are bound in order, one storage buffer each; a result tied to an operand reuses its binding, so a
kernel whose output is one of its parameters (Triton's, followed by its hidden scratch pointers) gets every
pointer where it expects it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import ir


@dataclass(frozen=True)
class Launch:
    """How a kernel is launched: the grid (workgroups), the block (threads per workgroup) and the dynamic
    shared memory in bytes."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0


def executable_target(kernel_arch: str) -> str:
    """The ``#hal.executable.target`` an object for ``kernel_arch`` is declared under (``sm_90``: CUDA;
    ``spirv``: Vulkan)."""
    if kernel_arch.startswith("sm_"):
        return f'#hal.executable.target<"cuda", "cuda-nvptx-fb", {{target_arch = "{kernel_arch}"}}>'
    if kernel_arch == "spirv":
        return ('#hal.executable.target<"vulkan-spirv", "vulkan-spirv-fb", {iree_codegen.target_info = '
                '#iree_gpu.target<arch = "", features = "spirv:v1.3,cap:Shader", wgp = <compute = fp32|int32, '
                'storage = b32, subgroup = none, subgroup_size_choices = [64, 64], '
                'max_workgroup_sizes = [128, 128, 64], max_thread_count_per_workgroup = 128, '
                'max_workgroup_memory_bytes = 16384, max_workgroup_counts = [65535, 65535, 65535]>>}>')
    raise ValueError(f"no executable target for kernels of {kernel_arch!r}")


def dispatch_extern(export: str, args: list[ir.Value], tied: int, object_path: str, kernel_arch: str,
                    launch: Launch, read_only: list[bool]) -> ir.Operation:
    """Inserts (at the current insertion point) ``hal.dispatch.extern`` of ``export`` in ``object_path`` on
    ``args``, its one result tied to ``args[tied]``; ``read_only`` per argument for its binding."""
    index = ir.IndexType.get()
    bindings = ", ".join("#hal.pipeline.binding<storage_buffer, ReadOnly>" if ro
                         else "#hal.pipeline.binding<storage_buffer>" for ro in read_only)
    attrs = {
        "export_name": ir.StringAttr.get(export),
        "layout": ir.Attribute.parse(f"#hal.pipeline.layout<bindings = [{bindings}]>"),
        "operandSegmentSizes": ir.DenseI32ArrayAttr.get([0, len(args), 0, 0]),
        "targets": ir.ArrayAttr.get([ir.Attribute.parse(executable_target(kernel_arch))]),
        "target_ordinals": ir.ArrayAttr.get([ir.IntegerAttr.get(index, 0)]),
        "target_objects": ir.ArrayAttr.get([ir.ArrayAttr.get([
            ir.Attribute.parse(f'#hal.executable.object<{{path = "{object_path}"}}>')])]),
        "tied_operands": ir.ArrayAttr.get([ir.IntegerAttr.get(index, tied)]),
        "workgroup_size": ir.ArrayAttr.get([ir.IntegerAttr.get(index, n) for n in launch.block]),
    }
    if launch.shared_bytes:
        attrs["workgroup_local_memory"] = ir.IntegerAttr.get(index, launch.shared_bytes)
    op = ir.Operation.create("hal.dispatch.extern", results=[args[tied].type], operands=args,
                             attributes=attrs, regions=2)
    block = op.regions[0].blocks.append(ir.Type.parse("!hal.device"))
    with ir.InsertionPoint(block):
        counts = [ir.Operation.create("arith.constant", results=[index],
                                      attributes={"value": ir.IntegerAttr.get(index, n)}).results[0]
                  for n in launch.grid]
        ir.Operation.create("hal.return", operands=counts)
    return op
