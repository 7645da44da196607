"""IREE CPU programs accumulate f16 convolutions (grouped too) and dot products in f32 and round once
(``dialects.stablehlo.widen_half_contractions`` in ``iree_codegen``'s input), as ONNX Runtime and PyTorch
do: within one f16 rounding of the f32 result, where IREE 3.13's own f16 accumulation is many roundings
off over 256 terms."""

from __future__ import annotations

import numpy as np

MODULE = """func.func @main(%x: tensor<1x4x271xf16>, %w: tensor<4x1x16xf16>, %a: tensor<8x256xf16>,
                 %b: tensor<256x8xf16>) -> (tensor<1x4x256xf16>, tensor<8x8xf16>) {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0]x[o, i, 0]->[b, f, 0], window = {stride = [1],
    pad = [[0, 0]], rhs_dilate = [1]} {batch_group_count = 1 : i64, feature_group_count = 4 : i64}
    : (tensor<1x4x271xf16>, tensor<4x1x16xf16>) -> tensor<1x4x256xf16>
  %1 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x256xf16>, tensor<256x8xf16>) -> tensor<8x8xf16>
  return %0, %1 : tensor<1x4x256xf16>, tensor<8x8xf16>
}
"""


def test_half_contractions_accumulate_in_f32_on_the_cpu():
    import iree.runtime as rt

    from collage_mlir.backends.iree_codegen import iree_compile
    from collage_mlir.dialects import stablehlo as sh
    from collage_mlir.ir import new_context, parse_module

    module = parse_module(MODULE, new_context())
    assert len(sh.half_contractions(module)) == 2
    ctx = rt.SystemContext(config=rt.Config("local-task"))
    vm = rt.VmModule.copy_buffer(ctx.instance, iree_compile(module))
    ctx.add_vm_module(vm)
    rng = np.random.default_rng(0)
    x, w = rng.uniform(0.5, 1, (1, 4, 271)).astype(np.float16), rng.uniform(0.5, 1, (4, 1, 16)).astype(np.float16)
    a, b = rng.uniform(0.5, 1, (8, 256)).astype(np.float16), rng.uniform(0.5, 1, (256, 8)).astype(np.float16)
    conv, dot = (o.to_host().astype(np.float64) for o in getattr(ctx.modules, vm.name)["main"](x, w, a, b))
    want_conv = np.stack([sum(x[0, :, i + k].astype(np.float64) * w[:, 0, k] for k in range(16))
                          for i in range(256)], axis=1)[None]
    want_dot = a.astype(np.float64) @ b.astype(np.float64)
    for got, want in ((conv, want_conv), (dot, want_dot)):
        # One f16 rounding of the exact sum: half an f16 ulp (2^-11 relative), with room for f32's own sums.
        np.testing.assert_allclose(got, want, rtol=2.0 ** -11 * 1.01)
    assert sh.half_contractions(module)  # the caller's module is left as it was (a copy is widened)
