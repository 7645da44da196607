"""Kernel backends without a GPU: every GEMM and convolution shape and epilogue is read off its region as the
spec a kernel is compiled for; the Triton templates compute each form right (Triton's interpreter, on the
CPU); their cubins build here for sm_80 and sm_90 and are embedded in the CUDA program; compiled kernels come from the
cache the second time; and the extern-dispatch path runs end to end on Vulkan (Mesa's llvmpipe) with the
GLSL template. The cubins' numbers are the GPU machine's to check (studies/gpu: tiny.gemms, each plan against
torch eager)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from collage_mlir.artifact import compile_module
from collage_mlir.backends import get_backend
from collage_mlir.backends.kernel import ConvSpec, GemmSpec, kernel_region
from collage_mlir.graph import Graph, number_ops
from collage_mlir.ir import new_context
from collage_mlir.passes import PassPipeline, partition_pipeline
from collage_mlir.passes.outline import region_functions
from collage_mlir.search import resolve_plan
from collage_runtime.types import Platform


def _gemms_module():
    from collage_mlir.frontends.torch import import_torch
    from collage_mlir.zoo import tiny

    model, x = tiny.gemms()
    return import_torch(model, [x], new_context()), model, x


def _specs(backend: str, platform: Platform, module=None) -> list:
    """The spec of each region of ``module`` (tiny.gemms) when ``backend`` takes every op it can."""
    module = module or _gemms_module()[0]
    number_ops(module)
    plan = resolve_plan(f"prefer:{backend}", Graph(module), platform)
    pipeline = PassPipeline(module.operation.context)
    for p in partition_pipeline(plan)[:4]:  # number, assign, float regions, outline: the region functions, not lowered
        pipeline.add(p)
    pipeline.run(module)
    patterns = get_backend(backend).patterns
    return [kernel_region(fn, patterns).spec for fn, b in region_functions(module.operation.regions[0].blocks[0])
            if b.name == backend]


def test_every_epilogue_and_layout_becomes_its_spec():
    specs = _specs("triton", Platform.CUDA)
    linear = [s for s in specs if s.batch == 1]
    assert sorted(s.act for s in linear if s.bias == 64 and not s.residual) == sorted(
        ["relu", "gelu", "gelu_tanh", "swish", "sigmoid", "tanh", "none"])
    assert GemmSpec(1, 32, 128, 64, False, "f32") in specs                          # no bias
    assert GemmSpec(1, 32, 64, 128, False, "f32", bias=64, residual=True) in specs  # + residual
    # q @ k^T and p @ v, the 4 heads the batch (torch-mlir transposes k^T before the matmul).
    assert {(s.batch, s.m, s.n, s.k, s.trans_b) for s in specs if s.batch > 1} == {(4, 32, 32, 16, False),
                                                                                   (4, 32, 16, 32, False)}


def test_rhs_as_n_by_k_is_read_in_place():
    """A right-hand side contracted on its last dim (JAX's ``x @ w.T``, ONNX Gemm transB) is read as it lies."""
    from collage_mlir.frontends import stablehlo

    module = stablehlo.parse("""
    func.func @main(%x: tensor<8x16xf32>, %w: tensor<4x16xf32>) -> tensor<8x4xf32> {
      %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [1] : (tensor<8x16xf32>, tensor<4x16xf32>) -> tensor<8x4xf32>
      %1 = stablehlo.tanh %0 : tensor<8x4xf32>
      return %1 : tensor<8x4xf32>
    }""", new_context())
    number_ops(module)
    plan = resolve_plan("prefer:triton", Graph(module), Platform.CUDA)
    pipeline = PassPipeline(module.operation.context)
    for p in partition_pipeline(plan)[:4]:
        pipeline.add(p)
    pipeline.run(module)
    (fn, _), = region_functions(module.operation.regions[0].blocks[0])
    assert kernel_region(fn, get_backend("triton").patterns).spec == GemmSpec(1, 8, 4, 16, True, "f32", act="tanh")


def test_every_convolution_form_becomes_its_spec():
    """torch's NCHW convolutions (stride, dilation, groups, with and without a bias) and JAX's NHWC one with
    HWIO weights: each tensor addressed by its own strides."""
    from collage_mlir.frontends import stablehlo
    from collage_mlir.frontends.torch import import_torch
    from collage_mlir.zoo import tiny

    import torch

    torch_module = import_torch(tiny.small_cnn(), [torch.randn(1, 3, 32, 32)], new_context())
    convs = [s for s in _specs("triton", Platform.CUDA, torch_module) if isinstance(s, ConvSpec)]
    assert [(s.c, s.k, s.stride, s.pad, s.dilation, s.groups, s.bias, s.act) for s in convs] == [
        (3, 8, (1, 1), (1, 1), (1, 1), 1, 8, "relu"), (8, 16, (2, 2), (1, 1), (1, 1), 1, 0, "relu"),
        (16, 16, (1, 1), (2, 2), (2, 2), 4, 16, "relu"), (16, 8, (1, 1), (0, 0), (1, 1), 1, 8, "none")]
    assert convs[0].x_strides == (3 * 32 * 32, 32 * 32, 32, 1) and convs[0].w_strides == (27, 9, 3, 1)
    nhwc = stablehlo.parse("""
    func.func @main(%x: tensor<2x9x9x6xf32>, %w: tensor<3x3x1x6xf32>) -> tensor<2x5x5x6xf32> {
      %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [2, 2], pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 6 : i64} : (tensor<2x9x9x6xf32>, tensor<3x3x1x6xf32>) -> tensor<2x5x5x6xf32>
      return %0 : tensor<2x5x5x6xf32>
    }""", new_context())
    (dw,) = _specs("triton", Platform.CUDA, nhwc)
    assert (dw.groups, dw.c, dw.k, dw.oh, dw.ow) == (6, 6, 6, 5, 5)
    assert dw.x_strides == (9 * 9 * 6, 1, 9 * 6, 6) and dw.w_strides == (1, 6, 3 * 6, 6)
    assert dw.y_strides == (5 * 5 * 6, 1, 5 * 6, 6)


_INTERPRETED = textwrap.dedent("""
    import json, sys, numpy as np, torch
    from math import erf
    from collage_mlir.backends.templates.triton_gemm import gemm
    cases = json.loads(sys.argv[1])
    worst = 0.0
    for c in cases:
        b, m, n, k = c["batch"], c["m"], c["n"], c["k"]
        g = torch.Generator().manual_seed(0)
        a = torch.randn(b, m, k, generator=g)
        w = torch.randn(b, n, k, generator=g) if c["trans_b"] else torch.randn(b, k, n, generator=g)
        bias = torch.randn(max(c["bias"], 1), generator=g) if c["bias"] else None
        res = torch.randn(b, m, n, generator=g) if c["residual"] else None
        ref = a.double() @ (w.double().transpose(1, 2) if c["trans_b"] else w.double())
        ref = ref + (bias.double() if bias is not None else 0) + (res.double() if res is not None else 0)
        acts = {"none": lambda x: x, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
                "swish": lambda x: x * torch.sigmoid(x), "gelu": torch.nn.functional.gelu,
                "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}
        ref = acts[c["act"]](ref)
        out = torch.empty(b, m, n)
        BM, BN = 16, 32
        grid = (-(-m // BM) * -(-n // BN), b)
        gemm[grid](a, w, bias, res, out, M=m, N=n, K=k, TRANS_B=c["trans_b"], BIAS=c["bias"],
                   RESIDUAL=c["residual"], ACT=c["act"], PRECISION="ieee", BM=BM, BN=BN, BK=16, GROUP=2)
        worst = max(worst, float((out.double() - ref).abs().max() / ref.abs().max()))
    print(worst)
""")


def test_triton_template_epilogues_in_the_interpreter():
    """The template on the CPU (TRITON_INTERPRET=1): ragged shapes (no dimension a multiple of its tile),
    batched, both layouts, each bias form and activation, against float64 torch."""
    pytest.importorskip("triton")
    acts = ["none", "relu", "gelu", "gelu_tanh", "sigmoid", "swish", "tanh"]
    cases = [GemmSpec(1 + i % 2, 19 + i, 37, 21 + 3 * i, bool(i % 2), "f32", (0, 1, 37)[i % 3], i % 3 == 2, act)
             for i, act in enumerate(acts)]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", _INTERPRETED, json.dumps([c.to_json() for c in cases])],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) < 1e-5


_CONV_INTERPRETED = textwrap.dedent("""
    import json, sys, torch
    import torch.nn.functional as F
    from collage_mlir.backends.templates.triton_conv import conv2d, depthwise_conv2d
    worst = 0.0
    for c in json.loads(sys.argv[1]):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(c["n"], c["c"], c["h"], c["w"], generator=g)
        w = torch.randn(c["k"], c["c"] // c["groups"], c["r"], c["s"], generator=g)
        bias = torch.randn(c["k"], generator=g) if c["bias"] else None
        ref = F.conv2d(x.double(), w.double(), None if bias is None else bias.double(), c["stride"], c["pad"],
                       c["dilation"], c["groups"])
        res = torch.randn(ref.shape, generator=g) if c["residual"] else None
        ref = ref + (res.double() if res is not None else 0)
        ref = torch.relu(ref) if c["act"] == "relu" else ref
        nhwc = c["nhwc"]
        xs = x.permute(0, 2, 3, 1).contiguous() if nhwc else x
        ws = w.permute(2, 3, 1, 0).contiguous() if nhwc else w   # HWIO
        y = torch.empty(ref.permute(0, 2, 3, 1).shape if nhwc else ref.shape)
        rs = None if res is None else (res.permute(0, 2, 3, 1).contiguous() if nhwc else res)
        st = lambda t, order: [t.stride(i) for i in order]
        x_str = st(xs, (0, 3, 1, 2)) if nhwc else st(xs, (0, 1, 2, 3))
        w_str = st(ws, (3, 2, 0, 1)) if nhwc else st(ws, (0, 1, 2, 3))
        y_str = st(y, (0, 3, 1, 2)) if nhwc else st(y, (0, 1, 2, 3))
        oh, ow = ref.shape[2], ref.shape[3]
        BM, BN = 32, 16
        grid = (-(-(c["n"] * oh * ow) // BM) * -(-(c["k"] // c["groups"]) // BN), c["groups"])
        if c["groups"] == c["c"] == c["k"]:  # depthwise: also the direct kernel, its own output
            y2 = torch.empty_like(y)
            depthwise_conv2d[(-(-(c["n"] * oh * ow) // BM) * -(-c["c"] // BN), 1)](
                xs, ws, bias, rs, y2, N=c["n"], C=c["c"], H=c["h"], W=c["w"], K=c["k"], R=c["r"], S=c["s"], OH=oh,
                OW=ow, SH=c["stride"][0], SW=c["stride"][1], PH=c["pad"][0], PW=c["pad"][1], DH=c["dilation"][0],
                DW=c["dilation"][1], GROUPS=c["groups"], XN=x_str[0], XC=x_str[1], XH=x_str[2], XW=x_str[3],
                WO=w_str[0], WI=w_str[1], WR=w_str[2], WS=w_str[3], YN=y_str[0], YC=y_str[1], YH=y_str[2],
                YW=y_str[3], BIAS=c["k"] if c["bias"] else 0, RESIDUAL=c["residual"], ACT=c["act"],
                PRECISION="ieee", BM=BM, BN=BN)
            got2 = y2.permute(0, 3, 1, 2) if nhwc else y2
            worst = max(worst, float((got2.double() - ref).abs().max() / ref.abs().max()))
        conv2d[grid](xs, ws, bias, rs, y, N=c["n"], C=c["c"], H=c["h"], W=c["w"], K=c["k"], R=c["r"],
                     S=c["s"], OH=oh, OW=ow, SH=c["stride"][0], SW=c["stride"][1], PH=c["pad"][0],
                     PW=c["pad"][1], DH=c["dilation"][0], DW=c["dilation"][1], GROUPS=c["groups"],
                     XN=x_str[0], XC=x_str[1], XH=x_str[2], XW=x_str[3], WO=w_str[0], WI=w_str[1], WR=w_str[2],
                     WS=w_str[3], YN=y_str[0], YC=y_str[1], YH=y_str[2], YW=y_str[3], BIAS=c["k"] if c["bias"] else 0,
                     RESIDUAL=c["residual"], ACT=c["act"], PRECISION="ieee", BM=BM, BN=BN, BK=16)
        got = y.permute(0, 3, 1, 2) if nhwc else y
        worst = max(worst, float((got.double() - ref).abs().max() / ref.abs().max()))
    print(worst)
""")


def test_triton_conv_template_in_the_interpreter():
    """NCHW/OIHW and NHWC/HWIO read in place; stride, asymmetric output sizes, dilation, groups, depthwise,
    bias, residual and relu; against float64 torch."""
    pytest.importorskip("triton")
    base = dict(n=2, c=4, h=7, w=6, k=6, r=3, s=3, stride=[1, 1], pad=[1, 1], dilation=[1, 1], groups=1,
                bias=True, residual=False, act="none", nhwc=False)
    cases = [base, {**base, "nhwc": True, "stride": [2, 1], "act": "relu"},
             {**base, "dilation": [2, 2], "pad": [2, 2], "residual": True},
             {**base, "groups": 2, "k": 4, "bias": False, "nhwc": True},
             {**base, "groups": 4, "k": 4, "c": 4, "act": "relu"},                      # depthwise
             {**base, "groups": 20, "k": 20, "c": 20, "nhwc": True, "stride": [2, 2], "residual": True},
             {**base, "r": 1, "s": 1, "pad": [0, 0], "c": 20, "k": 18}]               # pointwise
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", _CONV_INTERPRETED, json.dumps(cases)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) < 1e-5


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_triton_kernels_build_for_each_architecture(tmp_path, monkeypatch, arch):
    pytest.importorskip("triton")
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))
    backend = get_backend("triton")
    spec = GemmSpec(2, 40, 48, 24, True, "f16", bias=48, act="gelu")
    data, binary = backend.compile(spec, arch)
    assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == 190  # EM_CUDA
    assert binary.export == "gemm" and binary.trailing_pointers == 2
    assert binary.launch.grid == (1, 2, 1) and binary.launch.block[0] % 32 == 0
    depthwise = ConvSpec(1, 32, 14, 14, 32, 3, 3, 14, 14, (1, 1), (1, 1), (1, 1), 32, (6272, 196, 14, 1),
                         (9, 9, 3, 1), (6272, 196, 14, 1), "f16", bias=32, act="relu")
    data, binary = backend.compile(depthwise, arch)
    assert data[:4] == b"\x7fELF" and binary.export == "depthwise_conv2d"
    assert binary.launch.grid == (4, 1, 1)  # 196 pixels x 32 channels in 64 x 64 tiles


def test_cuda_program_embeds_its_kernels_and_reuses_the_cache(tmp_path, monkeypatch):
    """Compiled once into the cache, the second compile asks Triton for nothing; the cubins are inside
    the IREE module (no file of them is needed to run), beside it for inspection with their launch."""
    pytest.importorskip("triton")
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))
    module, _, _ = _gemms_module()
    number_ops(module)
    plan = resolve_plan("prefer:triton", Graph(module), Platform.CUDA)
    compile_module(module, plan, tmp_path / "a", iree_args=["--iree-cuda-target=sm_90"])
    cubins = sorted((tmp_path / "a" / "kernels").glob("*.cubin"))
    assert len(cubins) == len(plan.regions) == 11
    vmfb = (tmp_path / "a" / "main.vmfb").read_bytes()
    assert all(c.read_bytes() in vmfb for c in cubins)
    meta = json.loads(cubins[0].with_name(cubins[0].name + ".json").read_text())
    assert meta["export"] == "gemm" and meta["spec"]["element"] == "f32"

    def no_compile(*args):
        raise AssertionError("compiled again: the kernel cache missed")

    monkeypatch.setattr(type(get_backend("triton")), "compile", no_compile)
    module, _, _ = _gemms_module()
    number_ops(module)
    compile_module(module, plan, tmp_path / "b", iree_args=["--iree-cuda-target=sm_90"])


def test_tf32_is_its_own_kernel():
    pytest.importorskip("triton")
    spec = GemmSpec(1, 64, 64, 64, False, "f32")
    ieee, _ = get_backend("triton").compile(spec, "sm_90")
    tf32, _ = get_backend("triton-tf32").compile(spec, "sm_90")
    assert ieee != tf32


def _need_vulkan_and_glslc():
    import iree.runtime as rt

    from collage_mlir.backends import registry

    if registry()["glsl"].problem:
        pytest.skip(f"{registry()['glsl'].problem}: apt-get install glslc")
    if "vulkan" not in rt.query_available_drivers() or not rt.get_driver("vulkan").query_available_devices():
        pytest.skip("no Vulkan device: apt-get install mesa-vulkan-drivers libvulkan1")


def test_extern_dispatch_runs_end_to_end_on_vulkan(tmp_path, monkeypatch):
    """Every GEMM of tiny.gemms a GLSL kernel dispatched with hal.dispatch.extern in IREE's Vulkan program,
    the rest IREE's own SPIR-V: the outputs match torch within the backend's tolerance."""
    import collage_runtime
    import torch

    _need_vulkan_and_glslc()
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))
    module, model, x = _gemms_module()
    number_ops(module)
    plan = resolve_plan("prefer:glsl", Graph(module), Platform.VULKAN)
    assert {r.backend for r in plan.regions} == {"glsl"} and len(plan.regions) == 11
    result = compile_module(module, plan, tmp_path / "vk")
    assert result.manifest.platform is Platform.VULKAN
    with torch.no_grad():
        want = model(x).numpy()
    with collage_runtime.load(tmp_path / "vk") as program:
        (got,) = program.invoke("main", x.numpy())
    tol = get_backend("glsl").tolerance
    np.testing.assert_allclose(got, want, rtol=tol.rtol, atol=tol.atol)


@pytest.mark.fast
def test_tactics_are_backends_named_only_on_request():
    """Each tactic is a registered backend (the search prices it like any other); a tune's default set
    leaves them out and ``NAME@*`` names them all."""
    from collage_mlir.backends import expand_names, registry
    from collage_mlir.errors import CollageError
    from collage_mlir.search import available_backends
    from collage_mlir.tools.tune_cmd import parse_backends

    variants = [n for n in registry() if n.startswith("triton@")]
    assert len(variants) == 6 and "triton@32x64w4s4" in variants
    assert get_backend("triton@32x64w4s4").fixed.bm == 32
    default = {b.name for b in available_backends(Platform.CUDA)}
    assert {"triton", "triton-tf32x3"} <= default and not any("@" in n for n in default)
    assert "triton-tf32" not in default  # lower precision than the model's f32: only where named
    assert expand_names(["iree-cuda", "triton@*"]) == ["iree-cuda", *sorted(variants)]
    assert [b.name for b in parse_backends("triton@*", Platform.CUDA)] == sorted(variants)
    with pytest.raises(CollageError, match="has no variants"):
        expand_names(["glsl@*"])


@pytest.mark.parametrize("backend, element, tensor_cores", [
    ("triton", "f32", False),          # full f32: FMA, as the reference (TF32 off)
    ("triton-tf32x3", "f32", True),    # f32 as three TF32 products on Hopper's wgmma
    ("triton-tf32", "f32", True),
    ("triton", "f16", True),
])
def test_which_kernels_run_on_tensor_cores(backend, element, tensor_cores, tmp_path):
    """The sm_90 cubin's instructions (cuobjdump from Triton's wheel): wgmma (HGMMA) where the precision
    allows tensor cores, fused multiply-adds alone where it does not."""
    triton = pytest.importorskip("triton")
    from pathlib import Path

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.is_file():
        pytest.skip("Triton's wheel carries no cuobjdump")
    data, _ = get_backend(backend).compile(GemmSpec(1, 128, 256, 256, False, element, bias=256), "sm_90")
    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(data)
    sass = subprocess.run([str(tool), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert ("HGMMA" in sass) is tensor_cores


def test_a_kernel_that_cannot_build_is_one_error_line(tmp_path, monkeypatch):
    """Tiles that outgrow the architecture's shared memory are refused when compiled (they would fail when
    the program loads), and any failure of the kernel compiler is one CollageError naming the region."""
    pytest.importorskip("triton")
    from collage_mlir.errors import CollageError
    from collage_mlir.frontends import stablehlo

    from collage_mlir.backends import triton_cuda

    # Triton trims pipeline stages to fit the architecture (these tiles take 96 KiB on sm_86's 99): a smaller
    # limit stands for a kernel that would not fit.
    monkeypatch.setitem(triton_cuda.SHARED_LIMIT, 86, 64 * 1024)
    with pytest.raises(CollageError, match=r"need 98304 bytes of shared memory, more than sm_86's 65536"):
        get_backend("triton@128x256w8s3").compile(GemmSpec(1, 256, 512, 256, False, "f32"), "sm_86")
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(triton_cuda.TritonBackend, "compile",
                        lambda self, spec, arch: (_ for _ in ()).throw(RuntimeError("PassManager::run failed\nmore")))
    module = stablehlo.parse("""
    func.func @main(%x: tensor<8x16xf32>, %w: tensor<16x4xf32>) -> tensor<8x4xf32> {
      %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>
      return %0 : tensor<8x4xf32>
    }""", new_context())
    number_ops(module)
    plan = resolve_plan("prefer:triton", Graph(module), Platform.CUDA)
    with pytest.raises(CollageError, match=r"triton could not compile its GemmSpec kernel for sm_90: "
                                           r"PassManager::run failed$"):
        compile_module(module, plan, tmp_path / "out", iree_args=["--iree-cuda-target=sm_90"])


def test_convolutions_run_end_to_end_on_vulkan(tmp_path, monkeypatch):
    """Every convolution of a torch CNN (stride, dilation, groups, NCHW) and a JAX-style NHWC depthwise one
    (HWIO weights, asymmetric output) as GLSL kernels in IREE's Vulkan program: outputs against torch."""
    import collage_runtime
    import torch
    import torch.nn.functional as F

    from collage_mlir.frontends import stablehlo
    from collage_mlir.frontends.torch import import_torch
    from collage_mlir.zoo import tiny

    _need_vulkan_and_glslc()
    monkeypatch.setenv("COLLAGE_CACHE_DIR", str(tmp_path / "cache"))
    model, x = tiny.small_cnn(), torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    module = import_torch(model, [x], new_context())
    number_ops(module)
    plan = resolve_plan("prefer:glsl", Graph(module), Platform.VULKAN)
    assert sum(1 for r in plan.regions if r.backend == "glsl") == 5  # 4 convolutions + the linear head
    compile_module(module, plan, tmp_path / "cnn")
    with collage_runtime.load(tmp_path / "cnn") as program, torch.no_grad():
        (got,) = program.invoke("main", x.numpy())
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-5)

    nhwc = stablehlo.parse("""
    func.func @main(%x: tensor<2x9x9x6xf32>, %w: tensor<3x3x1x6xf32>) -> tensor<2x5x5x6xf32> {
      %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [2, 2], pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 6 : i64} : (tensor<2x9x9x6xf32>, tensor<3x3x1x6xf32>) -> tensor<2x5x5x6xf32>
      %1 = stablehlo.tanh %0 : tensor<2x5x5x6xf32>
      return %1 : tensor<2x5x5x6xf32>
    }""", new_context())
    number_ops(nhwc)
    compile_module(nhwc, resolve_plan("prefer:glsl", Graph(nhwc), Platform.VULKAN), tmp_path / "dw")
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal((2, 9, 9, 6), np.float32), rng.standard_normal((3, 3, 1, 6), np.float32)
    want = torch.tanh(F.conv2d(torch.from_numpy(xs).permute(0, 3, 1, 2), torch.from_numpy(ws).permute(3, 2, 0, 1),
                               stride=2, padding=1, groups=6)).permute(0, 2, 3, 1).numpy()
    with collage_runtime.load(tmp_path / "dw") as program:
        (got,) = program.invoke("main", xs, ws)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
