"""Framework entry points: collage_mlir.torch.compile and torch.compile(backend="collage") equal eager
PyTorch (rtol 1e-4, atol 1e-5); a graph collage cannot import falls back to eager with one warning. The
README's examples of both entry points run in test_readme_examples.py."""

from __future__ import annotations

import warnings

import pytest

from models import mlp


def test_plans_other_than_default(torch):
    import collage_mlir.torch

    model, x = mlp(), torch.randn(4, 32)
    compiled = collage_mlir.torch.compile(model, [x], plan="prefer:onednn")
    assert {r.backend for r in compiled.plan.regions} == {"onednn"}
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("plan", ["whole:ort", "whole:openvino"])
def test_a_bf16_model_runs_in_bf16(torch, plan):
    """A model cast to bf16 (`model.to(torch.bfloat16)`), bf16 tensors in and out, equal to eager within
    bf16's tolerance (5e-2 of scale). Both `collage_mlir.torch.compile` and `torch.compile` ran it eagerly
    before: the import check read eager's bf16 result as f32, and a bf16 tensor had no numpy array."""
    import collage_mlir.torch

    model, x = mlp().to(torch.bfloat16), torch.randn(4, 32).to(torch.bfloat16)
    compiled = collage_mlir.torch.compile(model, [x], plan=plan)
    assert {r.backend for r in compiled.plan.regions} == {plan.split(":")[1]}
    got, want = compiled(x), model(x)
    assert got.dtype == torch.bfloat16
    assert (got.float() - want.float()).abs().max() <= 5e-2 * want.float().abs().max()
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="collage: running this graph eagerly")
        again = torch.compile(model, backend="collage", options={"plan": plan})(x)
    assert again.dtype == torch.bfloat16 and torch.equal(again, got)


def test_a_graph_collage_cannot_take_runs_eagerly_with_one_warning(torch):
    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.fft.fft(x).real  # complex FFT: the StableHLO lowering refuses it

    x = torch.randn(4, 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = torch.compile(Spectrum(), backend="collage")(x)
    ours = [w for w in caught if "collage: running this graph eagerly" in str(w.message)]
    assert len(ours) == 1
    torch.testing.assert_close(y, torch.fft.fft(x).real)


def test_weightless_graphs_of_one_shape_are_told_apart(torch):
    """Two functions with no weights and the same input: dynamo's graphs differ only in their code, which the
    import cache's key must read (it once returned the first function's program for the second)."""
    x = torch.ones(2, 3)
    for scale in (2.0, 3.0, 2.0):
        torch._dynamo.reset()
        got = torch.compile(lambda t, s=scale: torch.tanh(t) * s, backend="collage")(x)
        torch.testing.assert_close(got, torch.tanh(x) * scale, rtol=1e-4, atol=1e-5)


def test_unknown_plan_is_a_collage_error(torch):
    import collage_mlir.torch
    from collage_mlir.errors import CollageError

    with pytest.raises(CollageError, match="no-such-backend"):
        collage_mlir.torch.compile(mlp(), [torch.randn(4, 32)], plan="prefer:no-such-backend")


def test_tensors_go_in_and_come_out_without_copies(torch):
    """An aligned CPU tensor is read in place and results are tensors over IREE's result buffers: the
    returned input is the input's own memory. Unaligned, strided and wrongly typed inputs still work, or
    are refused, as with copies."""
    import collage_mlir.torch
    from collage_runtime.program import InputError

    class PassAndCombine(torch.nn.Module):
        def forward(self, x, y):
            return x, x * y + 1.0

    model, x, y = PassAndCombine(), torch.randn(64, 16), torch.randn(64, 16)
    compiled = collage_mlir.torch.compile(model, [x, y])
    same, combined = compiled(x, y)
    assert same.data_ptr() == x.data_ptr()  # in through DLPack, out through DLPack: never copied
    torch.testing.assert_close(combined, x * y + 1.0, rtol=1e-4, atol=1e-5)
    (result,) = compiled.program.invoke_dlpack("main", x, y)[1:]
    assert torch.from_dlpack(result).data_ptr() == torch.from_dlpack(result).data_ptr()  # the buffer itself

    unaligned = torch.randn(64 * 16 + 1)[1:].view(64, 16)  # IREE imports only 64-byte aligned memory
    strided = torch.randn(16, 64).T
    for a, b in ((unaligned, y), (x, strided)):
        out = compiled(a, b)
        torch.testing.assert_close(out[0], a)
        torch.testing.assert_close(out[1], a * b + 1.0, rtol=1e-4, atol=1e-5)
    with pytest.raises(InputError, match="input 0: expected tensor<64x16xf32>, got .*FLOAT_64"):
        compiled(x.double(), y)
    frozen = x.numpy().copy()
    frozen.flags.writeable = False  # DLPack cannot say read-only: numpy refuses to export it, so it is copied
    _, out = compiled.program.invoke_dlpack("main", frozen, y.numpy())
    torch.testing.assert_close(torch.from_dlpack(out), x * y + 1.0, rtol=1e-4, atol=1e-5)


def test_torch_compile_finds_the_plan_tuned_for_the_model(torch, tmp_path, monkeypatch):
    """dynamo hands over the weights as graph inputs; frozen back in as constants, its graph imports to
    the model's own module, so a plan recorded for the model (as `collage tune pkg:factory` does) is
    found. Changed weights compile again rather than run stale constants."""
    import collage_mlir.torch
    from collage_mlir import entry
    from collage_mlir.backends import get_backend
    from collage_mlir.frontends.torch import import_torch
    from collage_mlir.graph import Graph
    from collage_mlir.ir import new_context
    from collage_mlir.search.record import TunedPlan
    from collage_mlir.search.simple_plans import preferred_plan

    model, x = mlp(), torch.randn(4, 32)
    module = import_torch(model, [x], new_context())
    key = entry.module_key(module)
    entry.record_tuned_plan(tmp_path / "c.sqlite", key, TunedPlan(preferred_plan(Graph(module), [get_backend("onednn")])))
    compiled = []
    real = collage_mlir.torch.compile
    monkeypatch.setattr(collage_mlir.torch, "compile", lambda *a, **k: compiled.append(real(*a, **k)) or compiled[-1])

    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to eager
        run = torch.compile(model, backend="collage", options={"db": str(tmp_path / "c.sqlite")})
        torch.testing.assert_close(run(x), model(x), rtol=1e-4, atol=1e-5)
    assert [c.plan_how for c in compiled] == ["tuned before"]
    assert {r.backend for r in compiled[0].plan.regions} == {"onednn"}
    with torch.no_grad():
        model[0].weight.mul_(2.0)
    torch.testing.assert_close(run(x), model(x), rtol=1e-4, atol=1e-5)
    run(x)
    assert len(compiled) == 2  # compiled again once, for the changed weights
    torch._dynamo.reset()


def test_a_second_module_called_on_a_view_compiles(torch):
    """Dynamo shares one frame between the modules ``torch.compile`` wraps: once one has run at a shape, the next
    is traced with dynamic sizes, and a view's (``images[k:k + 4]``) storage offset becomes a size argument the
    graph never uses. It ran eagerly ("size argument s63 is not the size or stride of any input's axis"); now it
    compiles, and equals eager."""
    import collage_mlir  # noqa: F401  registers the backend

    torch.manual_seed(0)
    first = torch.nn.Linear(8, 4).eval()
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 3))
    images = torch.randn(16, 1, 8, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no eager fallback
        torch.compile(first, backend="collage")(torch.randn(3, 8))
        got = torch.compile(model.eval(), backend="collage")(images[8:12])
        torch.testing.assert_close(got, model(images[8:12]), rtol=1e-4, atol=1e-5)
