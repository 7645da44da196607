"""Partitioned programs equal IREE alone: a small CNN and an MLP, 5 random plans (the default plan is the
reference, itself checked against PyTorch eager).

Tolerance: fp32, rtol 1e-5 / atol 1e-6 unless a backend in the plan documents a looser one
(onednn: rtol 1e-4, atol 1e-5, from reordered reductions).
"""

from __future__ import annotations

import numpy as np
import pytest

import collage_runtime
from collage_mlir.iree import compile_module
from collage_mlir.backends import get_backend
from collage_mlir.frontends.torch import import_torch
from collage_mlir.ir import new_context

from models import mlp, small_cnn

MODELS = {"cnn": (small_cnn, (2, 3, 16, 16)), "mlp": (mlp, (4, 32))}
#: The default plan's case is ``-m bench``: the ``reference`` fixture compiles and runs that same plan (the
#: values every case is compared with) and checks it against PyTorch eager, so by default it compiled twice.
PLANS = [pytest.param("default", marks=pytest.mark.bench)] + [f"random:{seed}" for seed in range(5)]


@pytest.fixture(scope="module")
def reference(torch, tmp_path_factory):
    """Per model: (example input, IREE-alone output)."""
    refs = {}
    for name, (build, shape) in MODELS.items():
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(7))
        out = tmp_path_factory.mktemp(f"{name}-ref")
        compile_module(import_torch(build(), [x], new_context()), "default", out)
        with collage_runtime.load(out) as prog:
            (y,) = prog.invoke("main", x.numpy())
        with torch.no_grad():
            np.testing.assert_allclose(y, build()(x).numpy(), rtol=1e-4, atol=1e-5)  # sanity: IREE == torch
        refs[name] = (x, y)
    return refs


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_plan_matches_iree_alone(model, plan, reference, tmp_path):
    build, _ = MODELS[model]
    x, y_ref = reference[model]
    result = compile_module(import_torch(build(), [x], new_context()), plan, tmp_path)
    backends = {r.backend for r in result.plan.regions} | {"iree-cpu"}
    rtol = max(get_backend(b).tolerance.rtol for b in backends)
    atol = max(get_backend(b).tolerance.atol for b in backends)
    with collage_runtime.load(tmp_path) as prog:
        (y,) = prog.invoke("main", x.numpy())
    np.testing.assert_allclose(y, y_ref, rtol=rtol, atol=atol)
    if plan != "default":
        assert result.plan.regions, "a random plan places at least one region"


def test_random_plans_mix_backends(reference):
    """Random plans are a fuzzer for every backend: each available one gets regions under some seed."""
    from collage_mlir.graph import Graph
    from collage_mlir.passes.number_ops import NumberOpsPass
    from collage_mlir.search import available_backends, resolve_plan

    x, _ = reference["cnn"]
    module = import_torch(small_cnn(), [x], new_context())
    NumberOpsPass().run(module)
    graph = Graph(module)
    used = {r.backend for seed in range(20) for r in resolve_plan(f"random:{seed}", graph).regions}
    assert used == {b.name for b in available_backends()}
    assert resolve_plan("random:3", graph).to_json() == resolve_plan("random:3", graph).to_json()


def test_non_persistent_buffers_import(torch, tmp_path):
    """A module with a non-persistent buffer (as Hugging Face BERT keeps ``position_ids``) imports and
    computes as torch does; the torch-mlir importer asserted on it ("Could not find state mapping for
    buffer"). The buffer stays non-persistent in the user's model."""
    from torch import nn

    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.register_buffer("position_ids", torch.arange(16).unsqueeze(0), persistent=False)

        def forward(self, x):
            return x + self.embed(self.position_ids[:, : x.shape[1]])

    model, x = Positions().eval(), torch.randn(1, 6, 8)
    compile_module(import_torch(model, [x], new_context(), cache=False), "default", tmp_path)
    with collage_runtime.load(tmp_path) as prog:
        (y,) = prog.invoke("main", x.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(y, model(x).numpy(), rtol=1e-6, atol=1e-6)
    assert "position_ids" not in model.state_dict()
