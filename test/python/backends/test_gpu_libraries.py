"""cublas and cudnn: each pattern found as one fused candidate (its epilogue included), built into a step
program, and run by the device executor (``collage_runtime.executors.torch_device``) on DLPack tensors
against a numpy float64 reference, within the backend's tolerance. The CPU tests run the executor on CPU
torch tensors (no iree-compile); the ``gpu`` test runs the same regions on CUDA tensors."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from collage_mlir.backends import get_backend
from collage_mlir.graph import Graph
from collage_mlir.iree import compile_module
from collage_mlir.ir import ir, new_context, parse_module
from collage_mlir.passes.assign import AssignPass
from collage_mlir.passes.number_ops import NumberOpsPass
from collage_mlir.passes.outline import OutlinePass
from collage_mlir.plan import Plan, Region
from collage_runtime.engines import Engines
from collage_runtime.steps import StepOp, StepProgram
from collage_runtime.types import Platform

torch = pytest.importorskip("torch")
from collage_runtime.executors import torch_device  # noqa: E402  (imports torch)

NUMPY = {"f32": np.float32, "f16": np.float16}


# -- the models: StableHLO text with {t} for the element type ------------------------------------------------

MATMUL = """
func.func @main(%a: tensor<8x32x{t}>, %b: tensor<32x16x{t}>) -> tensor<8x16x{t}> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x32x{t}>, tensor<32x16x{t}>) -> tensor<8x16x{t}>
  return %0 : tensor<8x16x{t}>
}"""

MATMUL_BIAS_RELU = """
func.func @main(%a: tensor<8x32x{t}>, %b: tensor<16x32x{t}>, %c: tensor<16x{t}>) -> tensor<8x16x{t}> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [1] : (tensor<8x32x{t}>, tensor<16x32x{t}>) -> tensor<8x16x{t}>
  %1 = stablehlo.broadcast_in_dim %c, dims = [1] : (tensor<16x{t}>) -> tensor<8x16x{t}>
  %2 = stablehlo.add %0, %1 : tensor<8x16x{t}>
  %z = stablehlo.constant dense<0.0> : tensor<8x16x{t}>
  %3 = stablehlo.maximum %2, %z : tensor<8x16x{t}>
  return %3 : tensor<8x16x{t}>
}"""

# GELU as torch writes it (erf) and as GPT-2 writes it (tanh), after a bias that is a constant (the program
# keeps it as a constant step).
MATMUL_BIAS_GELU = """
func.func @main(%a: tensor<8x32x{t}>, %b: tensor<32x16x{t}>) -> tensor<8x16x{t}> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x32x{t}>, tensor<32x16x{t}>) -> tensor<8x16x{t}>
  %c = stablehlo.constant dense<0.25> : tensor<16x{t}>
  %1 = stablehlo.broadcast_in_dim %c, dims = [1] : (tensor<16x{t}>) -> tensor<8x16x{t}>
  %2 = stablehlo.add %0, %1 : tensor<8x16x{t}>
  %half = stablehlo.constant dense<0.5> : tensor<8x16x{t}>
  %one = stablehlo.constant dense<1.0> : tensor<8x16x{t}>
  %rs2 = stablehlo.constant dense<0.707106769> : tensor<8x16x{t}>
  %3 = stablehlo.multiply %2, %rs2 : tensor<8x16x{t}>
  %4 = chlo.erf %3 : tensor<8x16x{t}> -> tensor<8x16x{t}>
  %5 = stablehlo.add %4, %one : tensor<8x16x{t}>
  %6 = stablehlo.multiply %2, %5 : tensor<8x16x{t}>
  %7 = stablehlo.multiply %6, %half : tensor<8x16x{t}>
  return %7 : tensor<8x16x{t}>
}"""

MATMUL_BIAS_GELU_TANH = """
func.func @main(%a: tensor<8x32x{t}>, %b: tensor<32x16x{t}>) -> tensor<8x16x{t}> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x32x{t}>, tensor<32x16x{t}>) -> tensor<8x16x{t}>
  %c = stablehlo.constant dense<0.25> : tensor<16x{t}>
  %1 = stablehlo.broadcast_in_dim %c, dims = [1] : (tensor<16x{t}>) -> tensor<8x16x{t}>
  %2 = stablehlo.add %0, %1 : tensor<8x16x{t}>
  %half = stablehlo.constant dense<0.5> : tensor<8x16x{t}>
  %one = stablehlo.constant dense<1.0> : tensor<8x16x{t}>
  %k = stablehlo.constant dense<0.0447149985> : tensor<8x16x{t}>
  %s = stablehlo.constant dense<0.797884583> : tensor<8x16x{t}>
  %3 = stablehlo.multiply %2, %2 : tensor<8x16x{t}>
  %4 = stablehlo.multiply %3, %2 : tensor<8x16x{t}>
  %5 = stablehlo.multiply %4, %k : tensor<8x16x{t}>
  %6 = stablehlo.add %2, %5 : tensor<8x16x{t}>
  %7 = stablehlo.multiply %6, %s : tensor<8x16x{t}>
  %8 = stablehlo.tanh %7 : tensor<8x16x{t}>
  %9 = stablehlo.add %8, %one : tensor<8x16x{t}>
  %10 = stablehlo.multiply %2, %9 : tensor<8x16x{t}>
  %11 = stablehlo.multiply %10, %half : tensor<8x16x{t}>
  return %11 : tensor<8x16x{t}>
}"""

BATCH_MATMUL_BIAS = """
func.func @main(%a: tensor<4x8x32x{t}>, %b: tensor<4x32x16x{t}>, %c: tensor<16x{t}>) -> tensor<4x8x16x{t}> {
  %0 = stablehlo.dot_general %a, %b, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<4x8x32x{t}>, tensor<4x32x16x{t}>) -> tensor<4x8x16x{t}>
  %1 = stablehlo.broadcast_in_dim %c, dims = [2] : (tensor<16x{t}>) -> tensor<4x8x16x{t}>
  %2 = stablehlo.add %0, %1 : tensor<4x8x16x{t}>
  return %2 : tensor<4x8x16x{t}>
}"""

CONV_NCHW_BIAS_RELU = """
func.func @main(%x: tensor<2x8x10x10x{t}>, %w: tensor<16x8x3x3x{t}>, %c: tensor<16x{t}>) -> tensor<2x16x5x5x{t}> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [2, 2], pad = [[1, 1], [1, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x8x10x10x{t}>, tensor<16x8x3x3x{t}>) -> tensor<2x16x5x5x{t}>
  %1 = stablehlo.broadcast_in_dim %c, dims = [1] : (tensor<16x{t}>) -> tensor<2x16x5x5x{t}>
  %2 = stablehlo.add %0, %1 : tensor<2x16x5x5x{t}>
  %z = stablehlo.constant dense<0.0> : tensor<2x16x5x5x{t}>
  %3 = stablehlo.maximum %2, %z : tensor<2x16x5x5x{t}>
  return %3 : tensor<2x16x5x5x{t}>
}"""

# JAX's layout: NHWC input, HWIO kernel; a ResNet block's residual add before the relu.
CONV_NHWC_BIAS_RESIDUAL_RELU = """
func.func @main(%x: tensor<1x9x9x8x{t}>, %w: tensor<3x3x8x8x{t}>, %c: tensor<8x{t}>) -> tensor<1x9x9x8x{t}> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], rhs_dilate = [1, 1]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x9x9x8x{t}>, tensor<3x3x8x8x{t}>) -> tensor<1x9x9x8x{t}>
  %1 = stablehlo.broadcast_in_dim %c, dims = [3] : (tensor<8x{t}>) -> tensor<1x9x9x8x{t}>
  %2 = stablehlo.add %0, %1 : tensor<1x9x9x8x{t}>
  %3 = stablehlo.add %2, %x : tensor<1x9x9x8x{t}>
  %z = stablehlo.constant dense<0.0> : tensor<1x9x9x8x{t}>
  %4 = stablehlo.maximum %3, %z : tensor<1x9x9x8x{t}>
  return %4 : tensor<1x9x9x8x{t}>
}"""

# ResNeXt's grouped 3x3 (4 groups here), dilated, with a bias and SiLU (x * logistic(x)).
CONV_GROUPED_BIAS_SILU = """
func.func @main(%x: tensor<1x8x9x9x{t}>, %w: tensor<16x2x3x3x{t}>, %c: tensor<16x{t}>) -> tensor<1x16x9x9x{t}> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {stride = [1, 1], pad = [[2, 2], [2, 2]], rhs_dilate = [2, 2]} {batch_group_count = 1 : i64, feature_group_count = 4 : i64} : (tensor<1x8x9x9x{t}>, tensor<16x2x3x3x{t}>) -> tensor<1x16x9x9x{t}>
  %1 = stablehlo.broadcast_in_dim %c, dims = [1] : (tensor<16x{t}>) -> tensor<1x16x9x9x{t}>
  %2 = stablehlo.add %0, %1 : tensor<1x16x9x9x{t}>
  %3 = stablehlo.logistic %2 : tensor<1x16x9x9x{t}>
  %4 = stablehlo.multiply %2, %3 : tensor<1x16x9x9x{t}>
  return %4 : tensor<1x16x9x9x{t}>
}"""


# -- numpy float64 references -------------------------------------------------------------------------------

def _relu(y: np.ndarray) -> np.ndarray:
    return np.maximum(y, 0.0)


def _gelu(y: np.ndarray) -> np.ndarray:
    return 0.5 * y * (1.0 + np.vectorize(math.erf)(y / math.sqrt(2.0)))


def _gelu_tanh(y: np.ndarray) -> np.ndarray:
    return 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y ** 3)))


def _conv_nchw(x: np.ndarray, w: np.ndarray, stride: int, pad: int, dilation: int, groups: int) -> np.ndarray:
    """NCHW input, OIHW kernel: the direct sum over each output's window, in float64."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    o, i, kh, kw = w.shape
    span = (kh - 1) * dilation + 1
    windows = np.lib.stride_tricks.sliding_window_view(x, (span, span), axis=(2, 3))[
        :, :, ::stride, ::stride, ::dilation, ::dilation]  # n, c, oh, ow, kh, kw
    outs = [np.einsum("nchwyx,ocyx->nohw", windows[:, g * i:(g + 1) * i], w[g * (o // groups):(g + 1) * (o // groups)])
            for g in range(groups)]
    return np.concatenate(outs, axis=1)


def _ref_matmul(a, b):
    return [a @ b]


def _ref_matmul_bias_relu(a, b, c):
    return [_relu(a @ b.T + c)]


def _ref_matmul_bias_gelu(a, b):
    return [_gelu(a @ b + 0.25)]


def _ref_matmul_bias_gelu_tanh(a, b):
    return [_gelu_tanh(a @ b + 0.25)]


def _ref_batch_matmul_bias(a, b, c):
    return [a @ b + c]


def _ref_conv_nchw_bias_relu(x, w, c):
    return [_relu(_conv_nchw(x, w, 2, 1, 1, 1) + c[None, :, None, None])]


def _ref_conv_nhwc_bias_residual_relu(x, w, c):
    y = _conv_nchw(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), 1, 1, 1, 1).transpose(0, 2, 3, 1)
    return [_relu(y + c + x)]


def _ref_conv_grouped_bias_silu(x, w, c):
    y = _conv_nchw(x, w, 1, 2, 2, 4) + c[None, :, None, None]
    return [y / (1.0 + np.exp(-y))]


@dataclass(frozen=True)
class Case:
    """A model of one anchor and its epilogue, its input shapes, the one fused step its region must become
    (op, bias, binary, act, algorithm) and the float64 reference."""

    name: str
    backend: str
    text: str
    shapes: tuple[tuple[int, ...], ...]
    fused: tuple[str, bool, str | None, str, str]
    reference: Callable[..., list[np.ndarray]]


CASES = {c.name: c for c in [
    Case("matmul", "cublas", MATMUL, ((8, 32), (32, 16)), ("matmul", False, None, "none", ""), _ref_matmul),
    Case("matmul-bias-relu", "cublas", MATMUL_BIAS_RELU, ((8, 32), (16, 32), (16,)),
         ("matmul", True, None, "relu", ""), _ref_matmul_bias_relu),
    Case("matmul-bias-gelu", "cublas", MATMUL_BIAS_GELU, ((8, 32), (32, 16)),
         ("matmul", True, None, "gelu", "none"), _ref_matmul_bias_gelu),
    Case("matmul-bias-gelu-tanh", "cublas", MATMUL_BIAS_GELU_TANH, ((8, 32), (32, 16)),
         ("matmul", True, None, "gelu", "tanh"), _ref_matmul_bias_gelu_tanh),
    Case("batch-matmul-bias", "cublas", BATCH_MATMUL_BIAS, ((4, 8, 32), (4, 32, 16), (16,)),
         ("matmul", True, None, "none", ""), _ref_batch_matmul_bias),
    Case("conv-nchw-bias-relu", "cudnn", CONV_NCHW_BIAS_RELU, ((2, 8, 10, 10), (16, 8, 3, 3), (16,)),
         ("conv2d", True, None, "relu", ""), _ref_conv_nchw_bias_relu),
    Case("conv-nhwc-bias-residual-relu", "cudnn", CONV_NHWC_BIAS_RESIDUAL_RELU, ((1, 9, 9, 8), (3, 3, 8, 8), (8,)),
         ("conv2d", True, "add", "relu", ""), _ref_conv_nhwc_bias_residual_relu),
    Case("conv-grouped-bias-silu", "cudnn", CONV_GROUPED_BIAS_SILU, ((1, 8, 9, 9), (16, 2, 3, 3), (16,)),
         ("conv2d", True, None, "swish", ""), _ref_conv_grouped_bias_silu),
]}
#: (case, element type) pairs the tests run: every case in f32, the relu epilogues in f16 too.
RUNS = [(name, "f32") for name in CASES] + [("matmul-bias-relu", "f16"), ("conv-nhwc-bias-residual-relu", "f16")]


# -- candidates, outlining and build -------------------------------------------------------------------------

@dataclass(frozen=True)
class Built:
    """A case's region built in a CUDA program: the step program, its file, and the module (kept alive: the
    outlined function belongs to it)."""

    path: Path
    program: StepProgram
    module: ir.Module


def _build(case: Case, element: str, out_dir: Path) -> Built:
    """The backend's largest candidate (the anchor with its whole epilogue) as the one region of a CUDA
    program, outlined and built."""
    backend = get_backend(case.backend)
    module = parse_module(case.text.replace("{t}", element), new_context())
    NumberOpsPass().run(module)
    found = [c.ops for c in backend.candidates(Graph(module))]
    ops = max(found, key=len)
    assert all(c <= ops for c in found)  # one anchor: the chain's prefixes
    AssignPass(plan=Plan([Region("r", case.backend, ops)], default_backend="iree-cuda")).run(module)
    OutlinePass().run(module)
    func = next(f.operation for f in module.body.operations
                if str(f.operation.attributes["sym_name"]).strip('"') == "r")
    artifact = backend.build(func, out_dir, "r")
    assert artifact.executor == "collage_runtime.executors.torch_device"
    path = out_dir / artifact.file
    return Built(path, StepProgram.from_json(json.loads(path.read_text())), module)


def _inputs(case: Case, element: str) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal(s).astype(NUMPY[element]) for s in case.shapes]


def _check(case: Case, element: str, built: Built, device: str) -> None:
    """Runs the built region through the device executor on ``device`` tensors; every output has the
    output's shape and dtype, is contiguous on ``device``, and matches the float64 reference."""
    tol = get_backend(case.backend).tolerance
    run = torch_device.load(built.path, Engines(threads=2))
    assert run.takes_dlpack is True
    args = _inputs(case, element)
    want = case.reference(*[a.astype(np.float64) for a in args])
    for _ in range(2):  # the second call reads the constants the first one made
        got = run([torch.from_numpy(a).to(device) for a in args])
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.device.type == device and g.is_contiguous()
            assert g.dtype == {"f32": torch.float32, "f16": torch.float16}[element] and tuple(g.shape) == w.shape
            np.testing.assert_allclose(g.cpu().double().numpy(), w, rtol=tol.rtol, atol=tol.atol)


def _fused(program: StepProgram) -> list[tuple]:
    return [(s.op.value, s.post.bias, s.post.binary, s.post.act, s.post.algorithm)
            for s in program.steps if s.post is not None]


# -- tests ---------------------------------------------------------------------------------------------------

@pytest.mark.fast
@pytest.mark.parametrize("name, element", RUNS, ids=[f"{n}-{e}" for n, e in RUNS])
def test_region_runs_on_cpu_tensors(name, element, tmp_path):
    """The backend's candidates take the anchor with its whole epilogue, the build fuses it into one step
    (nothing else left but constants), and the device executor's results on CPU tensors match numpy."""
    case = CASES[name]
    built = _build(case, element, tmp_path)
    assert _fused(built.program) == [case.fused]
    assert {s.op for s in built.program.steps} <= {StepOp.CONV2D, StepOp.MATMUL, StepOp.CONST}
    _check(case, element, built, "cpu")


@pytest.mark.fast
def test_backends_declare_cuda_only_and_refuse_other_types():
    """Both run only in CUDA programs, build with torch alone (no GPU) and take f32/f16 of one type only."""
    for name in ("cublas", "cudnn"):
        backend = get_backend(name)
        assert backend.platforms == frozenset({Platform.CUDA}) and backend.available() is None
        assert backend.version().startswith("torch-")
    text = """
func.func @main(%a: tensor<8x32xf64>, %b: tensor<32x16xf64>, %c: tensor<8x32xf16>, %d: tensor<32x16xf16>) -> (tensor<8x16xf64>, tensor<8x16xf32>) {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<8x32xf64>, tensor<32x16xf64>) -> tensor<8x16xf64>
  %1 = stablehlo.dot_general %c, %d, contracting_dims = [1] x [0] : (tensor<8x32xf16>, tensor<32x16xf16>) -> tensor<8x16xf32>
  return %0, %1 : tensor<8x16xf64>, tensor<8x16xf32>
}"""
    module = parse_module(text, new_context())
    NumberOpsPass().run(module)
    assert get_backend("cublas").candidates(Graph(module)) == []


def _spy(monkeypatch, names: tuple[str, ...]) -> list[str]:
    """The names of the torch functions among ``names`` called from now on, in order."""
    calls: list[str] = []
    for name in names:
        original = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _n=name, _f=original, **kw: (calls.append(_n), _f(*a, **kw))[1])
    return calls


#: The one fused library call a case's region makes on each device type (None: a plain GEMM or convolution
#: with the epilogue after it). On the CPU ``_addmm_activation``'s GELU is erf, on CUDA cuBLASLt's tanh one.
FUSED_CALL = {
    "cpu": {"matmul-bias-relu": "_addmm_activation", "matmul-bias-gelu": "_addmm_activation"},
    "cuda": {"matmul-bias-relu": "_addmm_activation", "matmul-bias-gelu-tanh": "_addmm_activation",
             "conv-nchw-bias-relu": "cudnn_convolution_relu",
             "conv-nhwc-bias-residual-relu": "cudnn_convolution_add_relu"},
}
LIBRARY_CALLS = ("_addmm_activation", "cudnn_convolution_relu", "cudnn_convolution_add_relu")


@pytest.mark.fast
def test_lt_epilogue_and_constants_once(tmp_path, monkeypatch):
    """Bias + relu and bias + the device's GELU (erf on the CPU) are one ``torch._addmm_activation`` call
    (cuBLASLt's epilogue on CUDA); a bias + tanh GELU on the CPU is not (its GELU is erf there). Constants
    (the GELU cases' bias) are made on the first call only."""
    calls = _spy(monkeypatch, ("_addmm_activation",))
    splits: list[int] = []
    split = torch_device.split_constants
    monkeypatch.setattr(torch_device, "split_constants", lambda *a: (splits.append(1), split(*a))[1])
    for name in ("matmul-bias-relu", "matmul-bias-gelu", "matmul-bias-gelu-tanh"):
        case = CASES[name]
        calls.clear()
        splits.clear()
        built = _build(case, "f32", tmp_path / name)
        assert (StepOp.CONST in {s.op for s in built.program.steps}) == ("gelu" in name)
        _check(case, "f32", built, "cpu")  # two calls
        expect = FUSED_CALL["cpu"].get(name)
        assert calls == ([expect] * 2 if expect else []) and splits == [1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("name, element", RUNS, ids=[f"{n}-{e}" for n, e in RUNS])
def test_region_runs_on_cuda_tensors(name, element, tmp_path, monkeypatch):
    """The same regions on CUDA tensors: cuDNN and cuBLAS(Lt) through torch, TF32 off, results on the GPU
    within the tolerance; bias + relu / tanh GELU GEMMs are one cuBLASLt epilogue call, bias [+ residual] +
    relu convolutions one fused cuDNN call."""
    calls = _spy(monkeypatch, LIBRARY_CALLS)
    case = CASES[name]
    _check(case, element, _build(case, element, tmp_path), "cuda")  # two calls
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    expect = FUSED_CALL["cuda"].get(name)
    assert calls == ([expect] * 2 if expect else [])


def test_cuda_program_compiles_with_both_backends(tmp_path):
    """``prefer:cudnn,cublas`` on a CUDA program (compiled here, no GPU needed): each anchor and its epilogue
    is one region served by ``torch_device``, recorded with its backend's tolerance."""
    text = CONV_NHWC_BIAS_RESIDUAL_RELU + MATMUL_BIAS_RELU.replace("@main", "@mm")
    module = parse_module(text.replace("{t}", "f32"), new_context())
    art = compile_module(module, "prefer:cudnn,cublas", tmp_path, platform=Platform.CUDA)
    regions = {r.backend: r for r in art.manifest.regions}
    assert sorted(regions) == ["cublas", "cudnn"]
    for name, case in (("cudnn", "conv-nhwc-bias-residual-relu"), ("cublas", "matmul-bias-relu")):
        region = regions[name]
        assert region.executor == "collage_runtime.executors.torch_device"
        assert region.tolerance == get_backend(name).tolerance
        program = StepProgram.from_json(json.loads((art.out_dir / region.artifact).read_text()))
        assert _fused(program) == [CASES[case].fused]
