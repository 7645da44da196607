"""PyTorch's fused inference fast paths (``aten._native_multi_head_attention``, ``aten._transformer_encoder_layer_fwd``:
``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` in eval mode with grad off) written with the ops
they compute (``frontends.torch_fastpath``), equal to ATen's own kernels; and a graph dynamo captures under
``torch.no_grad()`` holding them compiles (it ran eagerly: torch-mlir cannot lower them)."""

from __future__ import annotations

import warnings

import pytest

from collage_mlir.frontends import torch_fastpath


@pytest.mark.fast
@pytest.mark.parametrize("mask_type", [None, 0, 1, 2])
@pytest.mark.parametrize("need_weights", [False, True])
def test_multi_head_attention_equals_aten(torch, mask_type, need_weights):
    gen = torch.Generator().manual_seed(0)
    b, t, e, h = 2, 6, 16, 4
    x = torch.randn(b, t, e, generator=gen)
    w, bias = torch.randn(3 * e, e, generator=gen) * 0.3, torch.randn(3 * e, generator=gen)
    pw, pb = torch.randn(e, e, generator=gen) * 0.3, torch.randn(e, generator=gen)
    mask = {None: None, 0: torch.triu(torch.ones(t, t, dtype=torch.bool), 1),
            1: torch.tensor([[False] * t, [False] * 3 + [True] * 3]),
            2: torch.rand(b, h, t, t, generator=gen) > 0.7}[mask_type]
    if mask_type == 2:
        mask[0, 0, 1] = True  # a row attending to nothing: NaN, as ATen's
    args = (x, x, x, e, h, w, bias, pw, pb, mask, need_weights, True, mask_type)
    want = torch.ops.aten._native_multi_head_attention(*args)
    got = torch_fastpath.multi_head_attention(*args)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5, equal_nan=True)
    if need_weights:
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.fast
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_equals_aten(torch, norm_first, activation):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first,
                                             activation=activation).eval()
    x = torch.randn(2, 6, 16)
    a = layer.self_attn
    args = (x, 16, 4, a.in_proj_weight, a.in_proj_bias, a.out_proj.weight, a.out_proj.bias, activation == "gelu",
            norm_first, layer.norm1.eps, layer.norm1.weight, layer.norm1.bias, layer.norm2.weight, layer.norm2.bias,
            layer.linear1.weight, layer.linear1.bias, layer.linear2.weight, layer.linear2.bias)
    with torch.no_grad():
        want = torch.ops.aten._transformer_encoder_layer_fwd(*args)
        torch.testing.assert_close(layer(x), want)  # what eval with grad off runs
        torch.testing.assert_close(torch_fastpath.encoder_layer(*args), want, rtol=1e-5, atol=1e-5)


def test_torch_compile_takes_a_transformer_encoder_under_no_grad(torch):
    """``torch.compile(model, backend="collage")`` called under ``torch.no_grad()`` on an ``nn.TransformerEncoder``
    classifier (its layers on the fast path): compiled, no eager fallback, equal to eager within 1e-5 of the
    output's scale."""
    import collage_mlir  # noqa: F401  registers the backend

    torch.manual_seed(0)

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(100, 32)
            layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True,
                                                     activation="gelu")
            self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(32, 3)

        def forward(self, ids):
            return self.head(self.encoder(self.embed(ids)).mean(1))

    model = Classifier().eval()
    ids = torch.randint(0, 100, (2, 12))
    compiled = torch.compile(model, backend="collage")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "collage: running this graph eagerly" before
        want, got = model(ids), compiled(ids)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


def test_an_exported_program_holding_a_fast_path_exports_to_onnx(torch, tmp_path):
    """An exported program whose graph holds the encoder layer's fast path (as dynamo's graph of an
    ``nn.TransformerEncoder`` under ``torch.no_grad()`` does) written by torch's ONNX exporter, which has no
    function for it either: ``torch.compile(..., options={"precision": "int8", "dims": ...})`` quantizes that
    ONNX model for the range (it fell back to a compile per shape). ONNX Runtime runs it as eager does."""
    import onnxruntime as ort

    from collage_mlir.frontends.torch import export_onnx

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()
    a = layer.self_attn
    weights = (a.in_proj_weight, a.in_proj_bias, a.out_proj.weight, a.out_proj.bias, False, False, layer.norm1.eps,
               layer.norm1.weight, layer.norm1.bias, layer.norm2.weight, layer.norm2.bias, layer.linear1.weight,
               layer.linear1.bias, layer.linear2.weight, layer.linear2.bias)

    class FastPath(torch.nn.Module):
        def forward(self, x):
            return torch._transformer_encoder_layer_fwd(x, 16, 4, *weights)

    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        program = torch.export.export(FastPath(), (x,), dynamic_shapes=({1: torch.export.Dim("seq", max=64)},))
        want = layer(torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(1)))
    assert any("_transformer_encoder_layer_fwd" in str(n.target) for n in program.graph.nodes)
    path = export_onnx(program, (), tmp_path / "m.onnx", "the program")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name:
                                torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(1)).numpy()})
    assert abs(got - want.numpy()).max() <= 1e-5 * abs(want.numpy()).max()
