"""Whole zoo models (small variants) as one ort or openvino region — the plan ``collage bench --plan
whole:ort`` compiles: DCGAN (transposed convolutions → ConvTranspose), GPT-2 (i64 token ids, a cumulative
sum, reshaped ids) and BERT (i64 token ids). Each compiles, runs, and matches IREE alone within the
backend's tolerance (rtol 1e-4, atol 5e-4; measured max abs differences ~1e-6 on outputs up to ~4).
BERT's only new op over GPT-2's is the ids gather, so it runs on demand (``-m bench``). IREE alone, the
reference, is itself checked against PyTorch eager (the zoo's small variants under IREE alone: the other
models in test_bench.py with ``-m bench``)."""

from __future__ import annotations

import numpy as np
import pytest

import collage_runtime
from collage_mlir import zoo
from collage_mlir.backends import get_backend
from collage_mlir.iree import compile_module
from collage_mlir.ir import new_context
from collage_mlir.measure.validate import compare

ENGINES = {"ort": "onnxruntime", "openvino": "openvino"}
MODELS = ["dcgan", "gpt2_small", pytest.param("bert_base", marks=pytest.mark.bench)]


def _run(model: str, plan_for, out_dir) -> np.ndarray:
    module = zoo.import_stablehlo(model, new_context(), small=True)
    art = compile_module(module, plan_for(module), out_dir)
    _, inputs = zoo.build(model, small=True)
    with collage_runtime.load(art.out_dir, threads=1) as prog:
        (y,) = prog.invoke("main", *[np.require(x.numpy(), requirements="C") for x in inputs])
        return np.array(y), art


@pytest.fixture(scope="module")
def iree_alone(tmp_path_factory):
    refs = {}

    def get(model: str) -> np.ndarray:
        if model not in refs:
            refs[model] = _run(model, lambda m: "default", tmp_path_factory.mktemp(f"{model}_iree"))[0]
        return refs[model]
    return get


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("backend", sorted(ENGINES))
def test_whole_small_model_on_one_engine(model, backend, iree_alone, torch, tmp_path):
    pytest.importorskip(ENGINES[backend])
    got, art = _run(model, lambda m: f"whole:{backend}", tmp_path)
    assert [r.backend for r in art.manifest.regions] == [backend]  # its maximal region is the whole model
    tol = get_backend(backend).tolerance
    np.testing.assert_allclose(got, iree_alone(model), rtol=tol.rtol, atol=tol.atol)


@pytest.mark.parametrize("model", MODELS)
def test_small_model_under_iree_alone_equals_torch_eager(model, iree_alone, torch):
    """The zoo's small variant imported and compiled by IREE alone (the reference above) computes what
    PyTorch eager does (IREE's llvm-cpu codegen on the same fp32 weights: sums in another order only), and
    its output depends on its input, so a wrong engine cannot pass against it."""
    net, inputs = zoo.build(model, small=True)
    with torch.inference_mode():
        expected = net(*inputs)
        other = net(*[torch.randn_like(x) if x.is_floating_point() else torch.randint_like(x, 100) for x in inputs])
    check = compare([iree_alone(model)], [expected.numpy()], 1e-4, 0.0)
    assert check.ok, check.message
    assert compare([other.numpy()], [expected.numpy()], 1e-2, 0.0).max_rel > 0.1
