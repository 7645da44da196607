"""PyTorch PT2E models in: a CNN trained on scikit-learn's digits, quantized as torchao's X86 quantizer
does it (``prepare_pt2e``/``convert_pt2e``: per-channel int8 weights, per-tensor activations), compiled
by ``collage_mlir.torch.compile``. torch-mlir's fx importer cannot take its ``dequantize_per_channel``,
so the frontend goes through torch's ONNX exporter and the quantized ONNX path; the import is checked
against eager within the model's spread (its outputs' movement when the inputs are nudged by 1e-4), and
the programs on IREE alone and ONNX Runtime agree with eager on the held-out digits' classes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchao")
pytest.importorskip("sklearn")
pytest.importorskip("onnxruntime")

from models import digits_cnn  # noqa: E402


def test_a_pt2e_quantized_cnn_compiles_and_agrees_with_eager():
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    import collage_mlir.torch as ct
    from collage_mlir.frontends.torch import pt2e_quantized

    model, images, labels = digits_cnn()
    x, y = torch.tensor(images), torch.tensor(labels)
    batch = x[1400:1464]
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(torch.export.export(model, (batch,)).module(), quantizer)
    for i in range(0, 256, 64):
        prepared(x[i:i + 64])
    quantized = convert_pt2e(prepared)
    assert pt2e_quantized(quantized) and not pt2e_quantized(model)
    held = [x[k:k + 64] for k in range(1400, 1784, 64)]
    with torch.no_grad():
        want = torch.cat([quantized(b) for b in held])
    assert (want.argmax(1) == y[1400:1784]).float().mean() > 0.9
    for plan in ("default", "whole:ort"):
        program = ct.compile(quantized, [batch], plan=plan)  # the import check runs here
        got = torch.cat([program(b) for b in held])
        assert float((got - want).abs().max()) <= 0.05 * float(want.abs().max()), plan
        assert (got.argmax(1) == want.argmax(1)).float().mean() >= 0.99, plan
