"""A region that is the whole model of an ONNX file runs that file on ONNX Runtime (``collage-lower``'s
``whole_model``, ``Backend.build_source``): its inputs and outputs in the region's order, specialised to a
bucket's dims, equal to ONNX Runtime on the file bit for bit. Any other region, a file changed since the
import, or a region of another engine gets the translation."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

import collage_runtime  # noqa: E402
from collage_mlir.dialects import collage  # noqa: E402
from collage_mlir.entry import module_key  # noqa: E402
from collage_mlir.frontends import load_model  # noqa: E402
from collage_mlir.graph import Graph, number_ops  # noqa: E402
from collage_mlir.ir import new_context  # noqa: E402
from collage_mlir.iree import compile_module  # noqa: E402
from collage_mlir.plan import Plan, Region  # noqa: E402
from collage_mlir.search import resolve_plan  # noqa: E402
from collage_mlir.shaped import load_bucket  # noqa: E402


class TwoInputs(torch.nn.Module):
    """Reads its second input first (outlining orders a region's inputs by first use) and returns two
    outputs."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x, scale):
        h = torch.relu(self.a(scale * x))
        return self.b(h), h.sum(-1)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("whole") / "m.onnx"
    torch.onnx.export(TwoInputs().eval(), (torch.randn(2, 8), torch.randn(2, 8)), str(path), dynamo=False,
                      input_names=["x", "scale"], output_names=["y", "s"], opset_version=17,
                      dynamic_axes={"x": {0: "batch"}, "scale": {0: "batch"}, "y": {0: "batch"}, "s": {0: "batch"}})
    return path


def _region(out, module, plan) -> onnx.ModelProto:
    (entry,) = compile_module(module, plan, out).manifest.regions
    return onnx.load(out / entry.artifact)


def _bucket(path, batch: int):
    return load_bucket(path, {"batch": batch}, new_context(), check_import=False)


def test_a_whole_model_region_runs_the_users_file(model, tmp_path):
    module = _bucket(model, 3)
    region = _region(tmp_path / "a", module, resolve_plan("whole:ort", Graph(module)))
    assert [i.name for i in region.graph.input] == ["scale", "x"]  # the user's names, in the region's order
    assert sorted(o.name for o in region.graph.output) == ["s", "y"]
    assert [d.dim_value for d in region.graph.input[1].type.tensor_type.shape.dim] == [3, 8]  # the bucket's
    rng = np.random.default_rng(0)
    x, scale = rng.standard_normal((2, 3, 8), dtype=np.float32)
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x, "scale": scale})
    with collage_runtime.load(tmp_path / "a") as program:
        got = program.invoke("main", x, scale)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), w)


def test_a_part_of_the_model_a_changed_file_or_another_engine_is_translated(model, tmp_path):
    copy = tmp_path / "copy.onnx"
    copy.write_bytes(model.read_bytes())
    module = _bucket(copy, 2)
    graph = Graph(module)
    (whole,) = resolve_plan("whole:ort", graph).regions
    last = max(whole.ops, key=lambda i: graph.topological_order().index(i))
    part = Plan([Region("region_0", "ort", whole.ops - {last})], "iree-cpu", "test")
    assert [i.name for i in _region(tmp_path / "part", module, part).graph.input][0] == "in0"

    module = _bucket(copy, 2)
    changed = onnx.load(copy)
    changed.doc_string = "edited after the import"
    onnx.save(changed, copy)
    assert not collage.OnnxSource.of(module).unchanged()
    assert _region(tmp_path / "changed", module, resolve_plan("whole:ort", Graph(module))).graph.input[0].name == "in0"

    module = _bucket(model, 2)
    assert _region(tmp_path / "ov", module, resolve_plan("whole:openvino", Graph(module))).graph.input[0].name == "in0"


@pytest.mark.fast
def test_the_same_model_at_another_path_has_the_same_key(model, tmp_path):
    copy = tmp_path / "elsewhere.onnx"
    copy.write_bytes(model.read_bytes())
    here, there = (load_model(p, new_context()) for p in (model, copy))
    assert collage.OnnxSource.of(here).path != collage.OnnxSource.of(there).path
    assert module_key(here) == module_key(there)
