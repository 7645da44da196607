"""The ORT and OpenVINO executors bind a tensor only where its buffer's address changed since the last call
and keep the tensors of a slot's last two addresses: every call must still read its inputs' current data
and write its results where that call's outputs are, whether the addresses repeat, alternate or are new."""

from __future__ import annotations

import json

from pathlib import Path

import numpy as np
import pytest

from collage_runtime.engines import Engines
from collage_runtime.executors import executor

N = 16


def _matmul_tanh_onnx(path: Path) -> None:
    from onnx import TensorProto, helper, save

    x = helper.make_tensor_value_info("in0", TensorProto.FLOAT, [N, N])
    w = helper.make_tensor_value_info("in1", TensorProto.FLOAT, [N, N])
    y = helper.make_tensor_value_info("out0", TensorProto.FLOAT, [N, N])
    nodes = [helper.make_node("MatMul", ["in0", "in1"], ["t"]), helper.make_node("Tanh", ["t"], ["out0"])]
    graph = helper.make_graph(nodes, "mm", [x, w], [y])
    save(helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.mark.parametrize("name,module", [("ort", "onnxruntime"), ("openvino", "openvino")])
def test_rebinding_follows_addresses_and_data(name, module, tmp_path):
    pytest.importorskip(module)
    path = tmp_path / "m.onnx"
    _matmul_tanh_onnx(path)
    kind = {"ort": "collage_runtime.executors.onnxruntime_session",
            "openvino": "collage_runtime.executors.openvino_model"}[name]
    run = executor(kind)(path, Engines(2))
    rng = np.random.default_rng(0)
    pool_in = [np.empty((N, N), np.float32) for _ in range(3)]
    pool_out = [np.empty((N, N), np.float32) for _ in range(3)]
    w = rng.standard_normal((N, N)).astype(np.float32) / N
    # same address every call, alternating between two, a third address, back, and fresh arrays
    order = [0, 0, 1, 0, 1, 2, 0, 2, 1, None, None, 0]
    for call, k in enumerate(order):
        x = pool_in[k] if k is not None else np.empty((N, N), np.float32)
        out = pool_out[k] if k is not None else np.empty((N, N), np.float32)
        x[:] = rng.standard_normal((N, N))
        for o in pool_out + [out]:
            o[:] = np.nan
        if call == 6:  # the constant input changes data at the same address
            w[:] = rng.standard_normal((N, N)) / N
        run([x, w], [out])
        np.testing.assert_allclose(out, np.tanh(x @ w), rtol=1e-4, atol=1e-5, err_msg=f"call {call}")
        for j, other in enumerate(pool_out):  # nothing written where an earlier call's output was
            if other is not out:
                assert np.isnan(other).all(), (call, j)


def test_openvino_small_regions_run_on_one_thread(tmp_path):
    """A small OpenVINO region is compiled with one thread (no TBB worker left spinning after it), a large
    one with the program's budget."""
    ov = pytest.importorskip("openvino")
    from collage_runtime.engines import SMALL_REGION_MACS
    from collage_runtime.executors.openvino_model import work

    path = tmp_path / "m.onnx"
    _matmul_tanh_onnx(path)
    engines = Engines(2)
    core = engines.openvino_core()
    small = work(core.read_model(str(path)))
    assert small == N * N * N + N * N  # matmul MACs + one per tanh element
    assert engines.region_threads(small) == 1 and engines.region_threads(SMALL_REGION_MACS) == 2
    assert engines.region_threads(None) == 2 and Engines(1).region_threads(1e12) == 1
    compiled = core.compile_model(core.read_model(str(path)), "CPU", engines.openvino_config(small))
    assert compiled.get_property("INFERENCE_NUM_THREADS") == 1


def test_ort_spins_only_as_a_programs_sole_engine(tmp_path):
    """A program whose only region is an ORT session spins ORT's workers inside a run (nothing else shares
    the cores) and stops them when it ends; with a second region every ORT session blocks when idle. Both
    compute the same."""
    pytest.importorskip("onnxruntime")
    import collage_runtime
    from collage_mlir.iree import compile_module
    from collage_mlir.ir import new_context, parse_module

    text = """func.func @main(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %0 = stablehlo.tanh %x : tensor<8x8xf32>
  %1 = stablehlo.exponential %0 : tensor<8x8xf32>
  return %1 : tensor<8x8xf32>
}"""
    spin = "session.intra_op.allow_spinning"
    stop = "session.force_spinning_stop"
    sole_options, options = Engines(2, sole="ort").ort_session_options(), Engines(2).ort_session_options()
    assert [sole_options.get_session_config_entry(k) for k in (spin, stop)] == ["1", "1"]
    assert options.get_session_config_entry(spin) == "0"
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8)
    for plan, sole in (('{"format": "collage-plan", "version": 1, "regions": [{"name": "r", "backend": "ort", '
                        '"ops": [0, 1]}]}', "ort"),
                       ('{"format": "collage-plan", "version": 1, "regions": [{"name": "a", "backend": "ort", '
                        '"ops": [0]}, {"name": "b", "backend": "ort", "ops": [1]}]}', None)):
        (tmp_path / "plan.json").write_text(plan)
        art = compile_module(parse_module(text, new_context()), str(tmp_path / "plan.json"), tmp_path / str(sole))
        with collage_runtime.load(art.out_dir, threads=2) as prog:
            assert prog.engines.sole == sole
            np.testing.assert_allclose(prog.invoke("main", x)[0], np.exp(np.tanh(x)), rtol=1e-5, atol=1e-6)


def test_a_sole_ort_program_burns_no_core_between_calls(tmp_path):
    """ORT's default spinning went on for ~33 ms of CPU after each call of a whole-model ORT program
    (studies/threads: ort_spin.md); the workers now stop when the run ends: the process is idle between
    calls. Measured in a fresh process: the CPU of all its threads counts, and a test process holds other
    engines' pools."""
    pytest.importorskip("onnxruntime")
    import subprocess
    import sys

    from collage_mlir.iree import compile_module
    from collage_mlir.ir import new_context, parse_module

    text = """func.func @main(%x: tensor<256x256xf32>, %w: tensor<256x256xf32>) -> tensor<256x256xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
  %1 = stablehlo.tanh %0 : tensor<256x256xf32>
  %2 = stablehlo.dot_general %1, %w, contracting_dims = [1] x [0] : (tensor<256x256xf32>, tensor<256x256xf32>) -> tensor<256x256xf32>
  return %2 : tensor<256x256xf32>
}"""
    art = compile_module(parse_module(text, new_context()), "whole:ort", tmp_path / "art")
    script = f"""
import json, time
import numpy as np
import collage_runtime
rng = np.random.default_rng(0)
x, w = rng.standard_normal((256, 256), np.float32), rng.standard_normal((256, 256), np.float32) / 16
with collage_runtime.load({str(art.out_dir)!r}, threads=2) as prog:
    assert prog.engines.sole == "ort"
    idle = []
    for _ in range(3):
        (y,) = prog.invoke("main", x, w)
        before = time.process_time()
        time.sleep(0.05)
        idle.append(time.process_time() - before)
    np.testing.assert_allclose(y, np.tanh(x @ w) @ w, rtol=1e-4, atol=1e-4)
print(json.dumps(idle))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    idle = json.loads(run.stdout.strip().splitlines()[-1])
    assert min(idle) < 0.005, f"CPU burnt in the 50 ms after a call: {idle}"
