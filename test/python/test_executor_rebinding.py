"""The ORT and OpenVINO executors bind a tensor only where its buffer's address changed since the last call
and keep the tensors of a slot's last two addresses: every call must still read its inputs' current data
and write its results where that call's outputs are, whether the addresses repeat, alternate or are new."""

from __future__ import annotations

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
