"""``precision="int8"`` from Python: an f32 model quantized from calibration batches the user gives
(``entry.quantize``: its StableHLO translated to ONNX, ONNX Runtime's quantizer, imported back as any
quantized ONNX model), compiled, and checked on the held-out quarter of the batches.

The torch model is the CNN trained on scikit-learn's digits (``models.digits_cnn``); the JAX model an NHWC
CNN written with ``jax.nn`` and trained here on the same digits. Held-out accuracy is real accuracy: the
int8 program classifies the unseen digits as well as f32 (within 2 points) and its logits are within
``validate.QUANT_RTOL`` of the output's scale, and not equal (it is int8)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("sklearn")

from collage_mlir.errors import CollageError  # noqa: E402
from collage_mlir.measure.validate import QUANT_RTOL  # noqa: E402

from models import digits_cnn  # noqa: E402

HELD = slice(1408, 1792)  # 6 batches of 64 no calibration batch holds


def _close_but_int8(got: np.ndarray, want: np.ndarray) -> None:
    err = float(np.abs(got - want).max())
    assert 1e-4 * float(np.abs(want).max()) < err <= QUANT_RTOL * float(np.abs(want).max())


def _timed(f32_ms: float | Callable[[list], float], ort_ms: float = 2.0, openvino_ms: float = 1.0) -> Callable:
    """A stand-in for ``shaped._median_times``: each engine's seconds per call fixed (ONNX Runtime ``ort_ms``,
    OpenVINO ``openvino_ms``), and on the f32 model ``f32_ms`` (or ``f32_ms(arrays)``): a choice made by
    timing, made the same on every machine."""
    from collage_runtime.shapes import Fallback

    def times(runners: dict, arrays: list, repeats: int) -> dict:
        out = {}
        for key in runners:
            kind, f32 = key if isinstance(key, tuple) else (key, False)
            ms = (f32_ms(arrays) if callable(f32_ms) else f32_ms) if f32 else \
                ort_ms if kind is Fallback.ORT else openvino_ms
            out[key] = ms * 1e-3
        return out

    return times


def test_a_torch_model_compiles_in_int8_from_calibration_batches(torch):
    import collage_mlir.torch as ct

    model, x, y = digits_cnn()
    images = torch.tensor(x)
    calibrate = [images[i:i + 64] for i in range(0, 512, 64)]  # 6 to calibrate on, 2 held out
    program = ct.compile(model, [images[:64]], precision="int8", calibrate=calibrate, max_drop=0.02,
                         plan="whole:ort")
    assert program.agreement.samples == 128 and program.agreement.top1_changed <= 0.02
    held = [images[k:k + 64] for k in range(HELD.start, HELD.stop, 64)]
    with torch.no_grad():
        got = torch.cat([program(b) for b in held]).numpy()
        want = torch.cat([model(b) for b in held]).numpy()
    _close_but_int8(got, want)
    assert (got.argmax(1) == y[HELD]).mean() >= (want.argmax(1) == y[HELD]).mean() - 0.02

    # torch.compile takes the same keywords as options (dynamo's graph is quantized as the model is).
    compiled = torch.compile(model, backend="collage",
                             options={"precision": "int8", "calibrate": calibrate, "plan": "whole:ort"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no eager fallback
        with torch.no_grad():
            _close_but_int8(compiled(held[0]).numpy(), want[:64])


def test_int8_keywords_are_checked_in_one_line(torch):
    import collage_mlir.torch as ct

    model, x, _ = digits_cnn()
    images = torch.tensor(x)
    with pytest.raises(CollageError, match=r"precision='int8' needs calibrate="):
        ct.compile(model, [images[:64]], precision="int8")
    with pytest.raises(CollageError, match=r"calibrate batch 1: an input of shape \[32, 1, 8, 8\], the model "
                                           r"takes \[64, 1, 8, 8\]"):
        ct.compile(model, [images[:64]], precision="int8", calibrate=[images[:64], images[:32]], check_import=False)
    with pytest.raises(CollageError, match="calibrate and max_drop go with precision='int8'"):
        ct.compile(model, [images[:64]], calibrate=[images[:64]] * 2)
    with pytest.raises(CollageError, match="calibration_method must be one of minmax, percentile, entropy"):
        ct.compile(model, [images[:64]], precision="int8", calibrate=[images[:64]] * 2, calibration_method="mse")
    # A model torch.ao quantized in eager mode (its packed weights have no import): one line saying what works.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation
        dynamic = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    with pytest.raises(CollageError, match=r"torch.ao eager-mode quantized modules \(6: torch.ao.nn.quantized.dynamic"
                                           r".*compile the f32 model with precision='int8'"):
        ct.compile(dynamic, [images[:64]])


def test_a_jax_model_compiles_in_int8_from_calibration_batches(monkeypatch):
    """``compile`` at the batches' shape; ``jit`` at another (the batches cut to it); ``jit`` with a declared
    batch range: one artifact (the module exported with a symbolic batch, translated to ONNX and quantized
    once), nothing compiled per shape in range."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    optax = pytest.importorskip("optax")
    from sklearn.datasets import load_digits

    import collage_mlir.jax as cj
    from collage_mlir import shaped
    from collage_mlir.entry import Int8, quantize
    from collage_mlir.frontends.jax import import_jax
    from collage_mlir.ir import new_context

    monkeypatch.setattr(shaped, "_median_times", _timed(f32_ms=10.0))  # int8 faster, as on larger models
    digits = load_digits()
    x, y = (digits.images / 16.0).astype(np.float32)[..., None], digits.target
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"c1": jax.random.normal(keys[0], (3, 3, 1, 16)) * 0.3,
              "c2": jax.random.normal(keys[1], (3, 3, 16, 32)) * 0.1,
              "w": jax.random.normal(keys[2], (32, 10)) * 0.1, "b": jnp.zeros(10)}

    def net(p, images):
        conv = dict(window_strides=(1, 1), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        h = jax.nn.relu(jax.lax.conv_general_dilated(images, p["c1"], **conv))
        h = jax.nn.relu(jax.lax.conv_general_dilated(h, p["c2"], **{**conv, "window_strides": (2, 2)}))
        return h.mean((1, 2)) @ p["w"] + p["b"]

    def loss(p, images, labels):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(net(p, images)), labels[:, None], 1))

    optimizer = optax.adam(1e-2)
    state = optimizer.init(params)

    @jax.jit
    def step(p, s):
        updates, s = optimizer.update(jax.grad(loss)(p, x[:1400], y[:1400]), s)
        return optax.apply_updates(p, updates), s

    for _ in range(150):
        params, state = step(params, state)

    def classify(images):  # the weights closed over: constants, quantized per channel
        return net(params, images)

    calibrate = [(x[i:i + 64],) for i in range(0, 512, 64)]
    module, quantized = quantize(import_jax(classify, (x[:64],), new_context()), Int8(tuple(calibrate)), [x[:64]])
    assert "stablehlo.uniform_quantize" in str(module) and not quantized.kept
    # No plan: the whole function on the int8 engine that ran the int8 model fastest (IREE computes int8 in f32).
    program = cj.compile(classify, x[:64], precision="int8", calibrate=calibrate, max_drop=0.02)
    assert program.agreement.top1_changed <= 0.02
    assert program.plan_how == "fastest int8 engine"
    assert len(program.plan.regions) == 1 and program.plan.regions[0].backend == "openvino"
    got = np.concatenate([program(x[k:k + 64]) for k in range(HELD.start, HELD.stop, 64)])
    want = np.concatenate([np.asarray(classify(x[k:k + 64])) for k in range(HELD.start, HELD.stop, 64)])
    _close_but_int8(got, want)
    assert (got.argmax(1) == y[HELD]).mean() >= (want.argmax(1) == y[HELD]).mean() - 0.02 > 0.7


def test_a_torch_factory_compiles_in_int8_from_the_command_line(torch, tmp_path):
    """`collage compile pkg.mod:factory --precision int8 --calibrate DATA`: the model's ONNX form (translated from
    its StableHLO) is quantized and checked as an ONNX model's is; the data gives the inputs by position."""
    import collage_runtime
    from collage_runtime.manifest import load_manifest
    from collage_mlir.tools.cli import main as collage

    _, x, y = digits_cnn()
    np.save(tmp_path / "calib.npy", x[:512])
    # The imports' checks are the Python entry point's test's; this one is the command line's wiring.
    assert collage(["compile", "models:digits_factory", "--precision", "int8", "--calibrate",
                    str(tmp_path / "calib.npy"), "--max-drop", "0.02", "--plan", "whole:ort", "--no-import-check",
                    "-o", str(tmp_path / "int8")]) == 0
    assert load_manifest(tmp_path / "int8").provenance["held_out"]["samples"] == 128
    with collage_runtime.load(tmp_path / "int8") as program:
        got = np.concatenate([program.invoke("main", x[k:k + 64])[0] for k in range(HELD.start, HELD.stop, 64)])
    assert (got.argmax(1) == y[HELD]).mean() > 0.88
    # Data holding another number of inputs than the model takes: one line.
    from collage_mlir.frontends.onnx_calibrate import named_samples

    np.savez(tmp_path / "two.npz", x[:512], x[:512])
    with pytest.raises(CollageError, match=r"the model takes 1 inputs, the data holds 2 arrays \(by position"):
        named_samples(load_manifest(tmp_path / "int8").source, tmp_path / "two.npz")


def test_an_exported_program_with_a_dynamic_batch_compiles_in_int8(torch):
    """`torch.export` with a `Dim` and precision="int8": torch's ONNX export (its dim named `batch`, as the `Dim`,
    or `0.0` by argument and axis) quantized
    once, one program per bucket from that int8 model (4 and 8, padded up to), the program check run
    across the batch sizes it serves; out of range is one line."""
    import collage_mlir.torch as ct
    from collage_runtime.program import InputError

    model, x, y = digits_cnn()
    images = torch.tensor(x)
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(model, (images[:8],), dynamic_shapes=({0: batch},))
    compiled = ct.compile(program, precision="int8", calibrate=[images[i:i + 8] for i in range(0, 256, 8)],
                          max_drop=0.02, plan="whole:ort", buckets={"0.0": (4, 8)}, pad=["0.0"])
    assert compiled.agreement.samples == 64 and compiled.agreement.top1_changed <= 0.02
    for n in (3, 8):
        with torch.no_grad():
            got, want = compiled(images[HELD][:n]).numpy(), model(images[HELD][:n]).numpy()
        assert got.shape == (n, 10)
        _close_but_int8(got, want)
    with pytest.raises(InputError, match=r"dim 'batch'\) is 9, outside the declared range 1..8"):
        compiled(images[:9])


def test_an_int8_engine_that_disagrees_with_the_quantized_model_is_left_out(monkeypatch):
    """OpenVINO's int8 kernels compute a masked mean over a sequence (``(h * mask).sum(1) / mask.sum(1)``, how a
    transformer pools its output) far from ONNX Runtime, the quantizer's own engine: where no plan is given,
    the int8 engine is chosen among those that agree with it (``shaped._engine_times``), so the program is
    ONNX Runtime's and within ``QUANT_RTOL`` of f32, whichever engine is faster."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    import collage_mlir.jax as cj
    from collage_mlir import shaped
    from collage_mlir.entry import Int8, quantize
    from collage_mlir.frontends.jax import import_jax
    from collage_mlir.ir import new_context
    from collage_mlir.shaped import int8_plan

    rng = np.random.default_rng(0)
    w1, w2 = (jnp.asarray(rng.standard_normal(s).astype(np.float32) * 0.3) for s in ((16, 16), (16, 3)))

    def pool(x, mask):
        return ((x @ w1) * mask[..., None]).sum(1) / mask.sum(1, keepdims=True) @ w2

    def batch(seed):
        return np.random.default_rng(seed).standard_normal((2, 8, 16)).astype(np.float32), np.ones((2, 8), np.float32)

    monkeypatch.setattr(shaped, "_median_times", _timed(f32_ms=10.0))  # OpenVINO the fastest int8 engine
    calibrate = [batch(i) for i in range(8)]
    _, quantized = quantize(import_jax(pool, batch(100), new_context()), Int8(tuple(calibrate)), list(batch(100)))
    choice = int8_plan(quantized.int8, {})
    assert choice.plan == "whole:ort" and "openvino: disagrees with ort on the int8 model" in choice.int8_line()
    compiled = cj.compile(pool, *batch(100), precision="int8", calibrate=calibrate)
    assert compiled.plan_how == "fastest int8 engine" and compiled.plan.regions[0].backend == "ort"
    got, want = compiled(*batch(7)), np.asarray(pool(*batch(7)))
    assert np.abs(got - want).max() <= QUANT_RTOL * np.abs(want).max()


def test_an_int8_range_puts_its_buckets_on_an_engine_that_agrees_at_their_shapes(monkeypatch):
    """A one-layer transformer encoder (``jax.nn``: embedding, positions, attention under a mask, a masked mean)
    over lengths 8-32 in int8: OpenVINO computes the int8 model right with its dims kept and 68 % of the output's
    scale off at a static length, so each bucket's engine is chosen on the model at its shape
    (``shaped.int8_bucket_plan``); every length within ``QUANT_RTOL`` of f32 (whole on OpenVINO before: 1.0).
    OpenVINO is timed the faster engine here, and int8 faster than f32, as on larger models (on this one ONNX
    Runtime or f32 may be)."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import collage_mlir.jax as cj
    from collage_mlir import shaped

    monkeypatch.setattr(shaped, "_median_times", _timed(f32_ms=10.0))

    rng = np.random.default_rng(0)
    vocab, width = 100, 32
    p = {name: jnp.asarray(rng.standard_normal(shape).astype(np.float32) * 0.1)
         for name, shape in (("emb", (vocab, width)), ("pos", (32, width)), ("qkv", (width, 3 * width)),
                             ("o", (width, width)), ("f1", (width, 2 * width)), ("f2", (2 * width, width)),
                             ("cls", (width, 3)))}

    def norm(x):
        m = x.mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)

    def encoder(ids, mask):
        b, s = ids.shape
        x = p["emb"][ids] + p["pos"][:s]
        q, k, v = (t.reshape(b, s, 2, width // 2) for t in jnp.split(norm(x) @ p["qkv"], 3, -1))
        x = x + jax.nn.dot_product_attention(q, k, v, mask=mask[:, None, None, :].astype(bool)).reshape(b, s, width) @ p["o"]
        x = x + jax.nn.gelu(norm(x) @ p["f1"]) @ p["f2"]
        return ((x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)) @ p["cls"]

    def tokens(s, seed):
        return np.random.default_rng(seed).integers(0, vocab, (2, s)).astype(np.int32), np.ones((2, s), np.int32)

    ranged = cj.jit(encoder, precision="int8", calibrate=[tokens(16, i) for i in range(8)],
                    dims={("0.1", "1.1"): (8, 8, 32)})
    for s in (16, 32, 8, 20):
        got, want = np.asarray(ranged(*tokens(s, 100 + s))), np.asarray(encoder(*tokens(s, 100 + s)))
        assert got.shape == (2, 3) and np.abs(got - want).max() <= QUANT_RTOL * np.abs(want).max()


def test_int8_runs_in_f32_where_an_engine_runs_the_f32_model_faster(monkeypatch):
    """Precision is placed as engines are: where an engine runs the f32 model faster than every int8 engine
    runs the int8 one (ONNX Runtime's int8 on a transformer is 2x its f32; OpenVINO, faster, disagrees on this
    masked mean), the program computes in f32, within any accuracy bound; per bucket of a declared range, as
    each bucket's shape is timed. Here f32 is timed faster from length 16 up: the program at length 16 equals
    f32, at 8 it is int8 (ONNX Runtime's), and between them the fallback runs f32 on the f32 model."""
    pytest.importorskip("jax")
    import jax.numpy as jnp

    import collage_mlir.jax as cj
    from collage_mlir import shaped

    monkeypatch.setattr(shaped, "_median_times", _timed(f32_ms=lambda arrays: 0.5 if arrays[0].shape[1] >= 12 else 9))
    rng = np.random.default_rng(0)
    w1, w2 = (jnp.asarray(rng.standard_normal(s).astype(np.float32) * 0.3) for s in ((16, 16), (16, 3)))

    def pool(x, mask):
        return ((x @ w1) * mask[..., None]).sum(1) / mask.sum(1, keepdims=True) @ w2

    def batch(s, seed):
        rows = np.random.default_rng(seed)
        return rows.standard_normal((2, s, 16)).astype(np.float32), np.ones((2, s), np.float32)

    calibrate = [batch(8, i) for i in range(8)]
    f32 = cj.compile(pool, *batch(16, 100), precision="int8", calibrate=[batch(16, i) for i in range(8)])
    assert f32.plan_how == "faster in f32" and f32.plan.regions[0].backend == "ort" and f32.agreement.top1_changed == 0
    got, want = f32(*batch(16, 7)), np.asarray(pool(*batch(16, 7)))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert cj.compile(pool, *batch(8, 100), precision="int8", calibrate=calibrate).plan_how == "fastest int8 engine"

    ranged = cj.jit(pool, precision="int8", calibrate=calibrate, dims={("0.1", "1.1"): (8, 8, 16)})
    for s, exact in ((16, True), (8, False), (12, True)):
        got, want = np.asarray(ranged(*batch(s, 200 + s))), np.asarray(pool(*batch(s, 200 + s)))
        if exact:
            assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), s
        else:
            _close_but_int8(got, want)
