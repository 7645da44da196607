"""onednn backend: every pattern against IREE alone, within its documented tolerance (rtol 1e-4, atol 1e-5)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import collage_runtime
from collage_mlir.iree import compile_module
from collage_mlir.backends import get_backend
from collage_mlir.frontends.torch import import_torch
from collage_mlir.ir import new_context, parse_module

TOL = get_backend("onednn").tolerance

MATMULS = """
func.func @mm(%a: tensor<8x32xf32>, %b: tensor<32x16xf32>) -> tensor<8x16xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
func.func @mm_bt(%a: tensor<8x32xf32>, %b: tensor<16x32xf32>) -> tensor<8x16xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [1] : (tensor<8x32xf32>, tensor<16x32xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
func.func @bmm(%a: tensor<4x8x32xf32>, %b: tensor<4x32x16xf32>) -> tensor<4x8x16xf32> {
  %0 = stablehlo.dot_general %a, %b, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x8x32xf32>, tensor<4x32x16xf32>) -> tensor<4x8x16xf32>
  return %0 : tensor<4x8x16xf32>
}
"""


CONV_KINDS = ["3x3", "strided-1x1", "grouped", "depthwise", "dilated", "no-bias"]


def _conv_model(kind: str):
    import torch
    from torch import nn

    torch.manual_seed(0)
    conv = {
        "3x3": nn.Conv2d(8, 16, 3, padding=1),
        "strided-1x1": nn.Conv2d(8, 16, 1, stride=2),
        "grouped": nn.Conv2d(8, 16, 3, padding=1, groups=4),
        "depthwise": nn.Conv2d(8, 8, 3, padding=1, groups=8),
        "dilated": nn.Conv2d(8, 8, 3, padding=2, dilation=2),
        "no-bias": nn.Conv2d(8, 8, 3, bias=False),
    }[kind]
    return nn.Sequential(conv, nn.ReLU()).eval()


@pytest.fixture(scope="module")
def conv_programs(torch, tmp_path_factory):
    """Every conv kind as one branch of one model (output k: CONV_KINDS[k], each conv reading the input),
    compiled once under ``prefer:onednn`` and once alone (six models took six times the compiles);
    per kind: its region's steps, and the mixed and the alone outputs."""
    from torch import nn

    class Branches(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList(_conv_model(kind) for kind in CONV_KINDS)

        def forward(self, x):
            return tuple(conv(x) for conv in self.convs)

    x = torch.randn(1, 8, 14, 14, generator=torch.Generator().manual_seed(3))
    root = tmp_path_factory.mktemp("convs")
    mixed = compile_module(import_torch(Branches().eval(), [x], new_context()), "prefer:onednn", root / "mixed")
    alone = compile_module(import_torch(Branches().eval(), [x], new_context()), "default", root / "alone")
    outs = []
    for art in (mixed, alone):
        with collage_runtime.load(art.out_dir) as prog:
            outs.append(prog.invoke("main", x.numpy()))
    # Regions in op order, as the branches run: region k is kind k's conv (its output shape says so too).
    regions = mixed.manifest.regions
    assert len(regions) == len(CONV_KINDS)
    assert [r.outputs[0].shape for r in regions] == [tuple(o.shape) for o in outs[1]]
    steps = _steps(mixed)
    return {kind: (steps[k], outs[0][k], outs[1][k]) for k, kind in enumerate(CONV_KINDS)}


@pytest.mark.parametrize("kind", CONV_KINDS)
def test_conv_pattern_matches_iree(kind, conv_programs):
    steps, got, want = conv_programs[kind]
    assert [s["op"] for s in steps] == ["conv2d"] and steps[0]["act"] == "relu"  # bias and relu fused
    np.testing.assert_allclose(got, want, rtol=TOL.rtol, atol=TOL.atol)


@pytest.fixture(scope="module")
def matmul_programs(tmp_path_factory):
    """MATMULS compiled once under ``prefer:onednn`` and once alone (every case below reads both)."""
    root = tmp_path_factory.mktemp("matmuls")
    mixed = compile_module(parse_module(MATMULS, new_context()), "prefer:onednn", root / "mixed")
    alone = compile_module(parse_module(MATMULS, new_context()), "default", root / "alone")
    return mixed, alone


@pytest.mark.parametrize("fn, shapes", [("mm", [(8, 32), (32, 16)]), ("mm_bt", [(8, 32), (16, 32)]),
                                        ("bmm", [(4, 8, 32), (4, 32, 16)])])
def test_matmul_pattern_matches_iree(fn, shapes, matmul_programs):
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    mixed, alone = matmul_programs
    assert len(mixed.manifest.regions) == 3
    outs = []
    for art in (mixed, alone):
        with collage_runtime.load(art.out_dir) as prog:
            outs.append(prog.invoke(fn, *args)[0])
    np.testing.assert_allclose(outs[0], outs[1], rtol=TOL.rtol, atol=TOL.atol)


def _compare(mixed, alone, fn: str, *args: np.ndarray) -> None:
    outs = []
    for art in (mixed, alone):
        with collage_runtime.load(art.out_dir) as prog:
            outs.append(prog.invoke(fn, *args))
    for got, want in zip(*outs):
        np.testing.assert_allclose(got, want, rtol=TOL.rtol, atol=TOL.atol)


def _steps(art) -> list[list[dict]]:
    return [json.loads((art.out_dir / r.artifact).read_text())["steps"] for r in art.manifest.regions]


ACTIVATIONS = {  # torch module -> (oneDNN post-op, algorithm)
    "gelu": ("GELU", {}, "gelu", "none"),
    "gelu-tanh": ("GELU", {"approximate": "tanh"}, "gelu", "tanh"),
    "silu": ("SiLU", {}, "swish", ""),
    "relu6": ("ReLU6", {}, "hardtanh", ""),
    "sigmoid": ("Sigmoid", {}, "sigmoid", ""),
    "hardswish": ("Hardswish", {}, "hardswish", ""),
    "leaky-relu": ("LeakyReLU", {"negative_slope": 0.1}, "leaky_relu", ""),
}


def test_conv_activations_fuse_as_post_ops(torch, tmp_path):
    """Each activation, however torch-mlir spells it (GELU is a 30-op erf expansion), becomes the
    convolution's oneDNN post-op; ResNeXt-50's grouped 3x3 shape (128 channels, 32 groups)."""
    from torch import nn

    class Branches(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.convs = nn.ModuleList(nn.Conv2d(128, 128, 3, padding=1, groups=32) for _ in ACTIVATIONS)
            self.acts = nn.ModuleList(getattr(nn, cls)(**kw) for cls, kw, _, _ in ACTIVATIONS.values())

        def forward(self, x):
            return tuple(act(conv(x)) for conv, act in zip(self.convs, self.acts))

    x = torch.randn(1, 128, 28, 28, generator=torch.Generator().manual_seed(1))
    mixed = compile_module(import_torch(Branches().eval(), [x], new_context()), "prefer:onednn", tmp_path / "m")
    alone = compile_module(import_torch(Branches().eval(), [x], new_context()), "default", tmp_path / "a")
    fused = sorted((s[0]["act"], s[0]["algorithm"]) for s in _steps(mixed) if len(s) == 1)
    assert fused == sorted((a, alg) for _, _, a, alg in ACTIVATIONS.values())
    assert all(s[0]["bias"] for s in _steps(mixed))
    _compare(mixed, alone, "main", x.numpy())


def test_residual_block_is_one_conv_call(torch, tmp_path):
    """ResNet-50's 3x3 stage-1 conv with its residual add and relu: one conv call, add and relu as post-ops."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = nn.Conv2d(64, 64, 3, padding=1)

        def forward(self, x):
            return torch.relu(self.conv(x) + x)

    x = torch.randn(1, 64, 56, 56, generator=torch.Generator().manual_seed(2))
    mixed = compile_module(import_torch(Block().eval(), [x], new_context()), "prefer:onednn", tmp_path / "m")
    alone = compile_module(import_torch(Block().eval(), [x], new_context()), "default", tmp_path / "a")
    (steps,) = _steps(mixed)
    assert [(s["op"], s["bias"], s["binary"], s["act"]) for s in steps] == [("conv2d", True, "add", "relu")]
    _compare(mixed, alone, "main", x.numpy())


def test_linear_bias_gelu_is_one_gemm(torch, tmp_path):
    """BERT-base's FFN-up linear (768 -> 3072, GELU) at seq 32: the x1 scale torch-mlir adds, the bias
    and the GELU all fold into the GEMM step."""
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(768, 3072), nn.GELU()).eval()
    x = torch.randn(32, 768, generator=torch.Generator().manual_seed(3))
    mixed = compile_module(import_torch(model, [x], new_context()), "prefer:onednn", tmp_path / "m")
    alone = compile_module(import_torch(model, [x], new_context()), "default", tmp_path / "a")
    (steps,) = _steps(mixed)
    assert [(s["op"], s["bias"], s["act"]) for s in steps] == [("matmul", True, "gelu")]
    _compare(mixed, alone, "main", x.numpy())


NHWC = """
func.func @nhwc(%x: tensor<1x16x16x8xf32>, %w: tensor<3x3x8x16xf32>, %b: tensor<16xf32>) -> tensor<1x16x16x16xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x16x16x8xf32>, tensor<3x3x8x16xf32>) -> tensor<1x16x16x16xf32>
  %1 = stablehlo.broadcast_in_dim %b, dims = [3] : (tensor<16xf32>) -> tensor<1x16x16x16xf32>
  %2 = stablehlo.add %0, %1 : tensor<1x16x16x16xf32>
  %3 = stablehlo.logistic %2 : tensor<1x16x16x16xf32>
  return %3 : tensor<1x16x16x16xf32>
}
"""


def test_nhwc_conv_runs_through_permuted_views(tmp_path):
    """A JAX-layout (NHWC/HWIO) conv: permuted inside the region, bias on the last dim, sigmoid post-op."""
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(1, 16, 16, 8), (3, 3, 8, 16), (16,)]]
    mixed = compile_module(parse_module(NHWC, new_context()), "prefer:onednn", tmp_path / "m")
    alone = compile_module(parse_module(NHWC, new_context()), "default", tmp_path / "a")
    (steps,) = _steps(mixed)
    assert [(s["op"], s["layouts"], s["bias"], s["act"]) for s in steps] == [
        ("conv2d", ["b01f", "01io", "b01f"], True, "sigmoid")]
    _compare(mixed, alone, "nhwc", *args)


SIZED = """
func.func @small(%a: tensor<8x32xf32>, %b: tensor<32x16xf32>) -> tensor<8x16xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x32xf32>, tensor<32x16xf32>) -> tensor<8x16xf32>
  return %0 : tensor<8x16xf32>
}
func.func @large(%a: tensor<256x256xf32>, %b: tensor<256x256xf32>) -> tensor<256x256xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
  return %0 : tensor<256x256xf32>
}
"""


def test_small_regions_run_on_one_thread(tmp_path, monkeypatch):
    """A region below SMALL_REGION_MACS (4k MACs here) runs with one torch thread from its second call on
    and gives the budget back after; a large one (16.8M) keeps the budget; both compute the same."""
    import torch

    from collage_runtime.engines import SMALL_REGION_MACS, Engines
    from collage_runtime.executors import torch_steps

    art = compile_module(parse_module(SIZED, new_context()), "prefer:onednn", tmp_path / "mixed")
    by_shape = {r.outputs[0].shape: art.out_dir / r.artifact for r in art.manifest.regions}
    assert set(by_shape) == {(8, 16), (256, 256)} and 8 * 32 * 16 < SMALL_REGION_MACS < 256 ** 3
    calls: list[int] = []
    original = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (calls.append(n), original(n)))
    rng = np.random.default_rng(0)
    for (m, k, n), expect in (((8, 32, 16), [1, 2]), ((256, 256, 256), [])):
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        run = torch_steps.load(by_shape[(m, n)], Engines(2))
        calls.clear()
        for _ in range(2):
            out = np.full((m, n), np.nan, np.float32)
            run([a, b], [out])
            np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-3)
        assert calls == expect and torch.get_num_threads() == 2


@pytest.mark.fast
def test_step_program_round_trips_and_rejects_bad_programs():
    """A translated region's StepProgram survives to_json -> JSON -> from_json unchanged (the written file
    is exactly its to_json); a malformed program is one ValueError line naming what is wrong."""
    from collage_runtime.steps import StepOp, StepProgram
    from collage_mlir.backends.steps import translate_region

    module = parse_module(NHWC, new_context())
    func = next(op for op in module.body.operations if op.operation.name == "func.func")
    program = translate_region(func.operation, get_backend("onednn").patterns)
    assert [(s.op, s.attrs.layouts, s.post.bias, s.post.act) for s in program.steps] == [
        (StepOp.CONV2D, ("b01f", "01io", "b01f"), True, "sigmoid")]
    data = json.loads(json.dumps(program.to_json()))
    assert StepProgram.from_json(data) == program and StepProgram.from_json(data).to_json() == data

    def bad(edit) -> str:
        broken = json.loads(json.dumps(data))
        edit(broken)
        with pytest.raises(ValueError) as err:
            StepProgram.from_json(broken)
        assert "\n" not in str(err.value)
        return str(err.value)

    assert "version" in bad(lambda d: d.update(version=3))
    assert "step 0: op" in bad(lambda d: d["steps"][0].update(op="fft"))
    assert "step 0: stride" in bad(lambda d: d["steps"][0].update(stride="2"))
    assert "step 0: act" in bad(lambda d: d["steps"][0].update(act="softmax"))
    assert "4 inputs, expected 3" in bad(lambda d: d["steps"][0].update(**{"in": [0, 1, 2, 2]}))
    assert "reads value 9 before it is defined" in bad(lambda d: d["steps"][0].update(**{"in": [0, 1, 9]}))
    assert "result" in bad(lambda d: d.update(results=[7]))
