"""Framework-made models, written as their users write them, through collage under the project's own plan
strings: every plan collage makes must compile and run, and give IREE alone's numbers.

    python test/conformance/framework_models.py [--models bert,gpt2,...] [--plans default random:1 ...] [--md OUT]

Models (built in code, seeded random weights): Hugging Face BERT and GPT-2 (2 layers, hidden 64, imported
by torch-mlir), and JAX functions lowered with ``jax.jit(f).lower(...)``: an NHWC CNN with ``jax.nn``
activations and max pooling, an MLP with top-k / sort / cumsum post-processing, a transformer encoder
layer. ONNX files as users export them: Hugging Face BERT, GPT-2 and ViT from configs through
``torch.onnx.export`` (its dynamo exporter, opset 18); a pre-norm decoder (``nn.RMSNorm``, causal
``scaled_dot_product_attention``) exported at opset 23, which writes ``RMSNormalization`` and ``Attention``;
a CNN quantized by ONNX Runtime's ``quantize_static`` (QDQ); a detector's head ending in ``NonMaxSuppression``
(its output count the data's: an ONNX tail run after the program). Each (model, plan) is compiled and run through the ``collage`` command line (each run in its own
process), and its outputs compared with the ``default`` plan's as collage validates a plan
(``measure.validate.compare``): floats within the loosest tolerance of the backends the plan uses, relative
to each output's scale (a quantizing model at ``QUANT_RTOL``), integers exactly. A row is ``passed``, ``failed`` (one error line, non-zero
exit: a plan collage made that does not build or run), or ``wrong`` (exit 0, numbers off).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np

PLANS = ("default", *(f"random:{k}" for k in range(1, 7)), "prefer:ort", "prefer:openvino", "prefer:onednn,xla-cpu")


class Outcome(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    WRONG = "wrong"


@dataclass(frozen=True)
class Row:
    model: str
    plan: str
    outcome: Outcome
    detail: str = ""


def _hf(kind: str, folder: Path) -> list[np.ndarray]:
    import torch
    import transformers

    from collage_mlir.frontends.torch import import_torch
    from collage_mlir.ir import new_context

    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=128, max_position_embeddings=64)
        model = transformers.BertModel(config)
    else:
        config = transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=64)
        model = transformers.GPT2Model(config)

    class LastHidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids).last_hidden_state

    ids = torch.randint(0, 1000, (1, 16))
    module = import_torch(LastHidden(model).eval(), [ids], new_context(), cache=False)
    (folder / "model.mlir").write_text(str(module))
    return [ids.numpy()]


def _jax(kind: str, folder: Path) -> list[np.ndarray]:
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    w = lambda *shape: (rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1]))).astype(np.float32)  # noqa: E731
    if kind == "jax_cnn":
        k1, k2, d = w(3, 3, 3, 16), w(3, 3, 16, 32), w(32, 10)

        def f(x):  # NHWC, HWIO, as flax writes it
            dn = ("NHWC", "HWIO", "NHWC")
            h = jax.nn.relu(jax.lax.conv_general_dilated(x, k1, (1, 1), "SAME", dimension_numbers=dn))
            h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
            h = jax.nn.gelu(jax.lax.conv_general_dilated(h, k2, (1, 1), "SAME", dimension_numbers=dn))
            return jax.nn.log_softmax(h.mean(axis=(1, 2)) @ d)

        args = [rng.standard_normal((1, 16, 16, 3)).astype(np.float32)]
    elif kind == "jax_post":
        w1 = w(16, 32)

        def f(x):
            h = jax.nn.relu(x @ w1)
            s = jax.nn.softmax(h, axis=-1)
            values, indices = jax.lax.top_k(s, 3)
            return values, indices, jnp.cumsum(s, axis=-1), jnp.sort(h, axis=-1)

        args = [rng.standard_normal((4, 16)).astype(np.float32)]
    else:  # an encoder layer
        wq, wk, wv, wo, w1, w2 = w(32, 32), w(32, 32), w(32, 32), w(32, 32), w(32, 64), w(64, 32)

        def norm(x):
            m = x.mean(-1, keepdims=True)
            return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)

        def f(x):
            q, k, v = (jnp.reshape(x @ p, (8, 4, 8)).transpose(1, 0, 2) for p in (wq, wk, wv))
            a = jax.nn.softmax(q @ k.transpose(0, 2, 1) / jnp.sqrt(8.0), axis=-1) @ v
            h = norm(x + a.transpose(1, 0, 2).reshape(8, 32) @ wo)
            return norm(h + jax.nn.gelu(h @ w1) @ w2)

        args = [rng.standard_normal((8, 32)).astype(np.float32)]
    (folder / "model.mlir").write_text(jax.jit(f).lower(*args).as_text())
    return args


def detection_head(path: Path, seed: int = 0) -> list[np.ndarray]:
    """A detector's head as ONNX graph tools write it: a strided conv gives 16 anchors' boxes and scores
    (sigmoids), ``NonMaxSuppression`` keeps at most 5 of them, a ``Gather`` picks their boxes (how many:
    the data's business). Writes the model; returns its example input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    inits = [numpy_helper.from_array((rng.standard_normal((5, 3, 4, 4)) * 0.3).astype(np.float32), "w"),
             ints("shape", [1, 5, 16]), ints("s0", [0]), ints("s2", [2]), ints("s4", [4]), ints("s5", [5]),
             ints("one", [1]), ints("max_out", [5]), numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.3], np.float32), "min_score")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["f"], strides=[4, 4]),
             helper.make_node("Reshape", ["f", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Slice", ["t", "s0", "s4", "s2"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["boxes"]),
             helper.make_node("Slice", ["t", "s4", "s5", "s2"], ["s"]),
             helper.make_node("Transpose", ["s"], ["st"], perm=[0, 2, 1]),
             helper.make_node("Sigmoid", ["st"], ["scores"]),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "min_score"], ["selected"]),
             helper.make_node("Slice", ["selected", "s2", "s4", "one"], ["column"]),
             helper.make_node("Squeeze", ["column", "one"], ["index"]),
             helper.make_node("Squeeze", ["boxes", "s0"], ["all_boxes"]),
             helper.make_node("Gather", ["all_boxes", "index"], ["detections"])]
    graph = helper.make_graph(nodes, "detector", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("detections", TensorProto.FLOAT, ["n", 4]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, 16])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return [np.random.default_rng(seed + 1).standard_normal((1, 3, 16, 16)).astype(np.float32)]


def _onnx(kind: str, folder: Path) -> list[np.ndarray]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    path = folder / "model.onnx"
    if kind in ("onnx_bert", "onnx_gpt2", "onnx_vit"):
        import transformers

        if kind == "onnx_vit":
            model = transformers.ViTModel(transformers.ViTConfig(
                hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
                patch_size=8))
            args = (torch.randn(1, 3, 32, 32),)
        elif kind == "onnx_bert":
            model = transformers.BertModel(transformers.BertConfig(
                vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128))
            args = (torch.randint(0, 1000, (1, 16)),)
        else:
            model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
                vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=64, use_cache=False))
            args = (torch.randint(0, 1000, (1, 16)),)
        torch.onnx.export(model.eval(), args, str(path), dynamo=True, external_data=False)
        return [a.numpy() for a in args]
    if kind == "onnx_decoder23":
        class Block(nn.Module):
            def __init__(self, d: int = 64, heads: int = 4):
                super().__init__()
                self.heads, self.n1, self.n2 = heads, nn.RMSNorm(d), nn.RMSNorm(d)
                self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
                self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))

            def forward(self, x):
                b, t, d = x.shape
                q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                           for z in self.qkv(self.n1(x)).split(d, -1))
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
                x = x + self.o(a)
                return x + self.ff(self.n2(x))

        x = torch.randn(2, 16, 64)
        torch.onnx.export(nn.Sequential(Block(), Block()).eval(), (x,), str(path), dynamo=True, opset_version=23,
                          external_data=False)
        return [x.numpy()]
    # onnx_qdq: a CNN exported, then quantized by ONNX Runtime as its docs show
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, stride=2), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval()
    samples = [torch.randn(1, 3, 16, 16) for _ in range(8)]
    f32 = folder / "f32.onnx"
    torch.onnx.export(model, (samples[0],), str(f32), input_names=["x"], dynamo=False, opset_version=17)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = iter({"x": s.numpy()} for s in samples)

        def get_next(self):
            return next(self.left, None)

    quantize_static(str(f32), str(path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True)
    return [samples[0].numpy()]


MODELS = {"bert": lambda d: _hf("bert", d), "gpt2": lambda d: _hf("gpt2", d),
          "jax_cnn": lambda d: _jax("jax_cnn", d), "jax_post": lambda d: _jax("jax_post", d),
          "jax_encoder": lambda d: _jax("jax_encoder", d),
          **{k: (lambda d, k=k: _onnx(k, d)) for k in ("onnx_bert", "onnx_gpt2", "onnx_vit", "onnx_decoder23",
                                                         "onnx_qdq")},
          "onnx_detector": lambda d: detection_head(d / "model.onnx")}


#: Models that quantize: checked at ``validate.QUANT_RTOL`` of each output's scale, as collage validates them.
QUANTIZED = {"onnx_qdq"}


def _collage(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("collage"), *args], cwd=cwd, capture_output=True, text=True, timeout=1800)


def _last_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit {proc.returncode}"


def run_model(name: str, plans: list[str], folder: Path) -> list[Row]:
    """Every plan of ``plans`` on the model ``name`` (``default`` first: the reference)."""
    from collage_mlir.backends import get_backend
    from collage_mlir.measure.validate import QUANT_RTOL, compare
    from collage_runtime.manifest import load_manifest

    inputs = MODELS[name](folder)
    source = "model.onnx" if (folder / "model.onnx").is_file() else "model.mlir"
    flags = []
    for k, x in enumerate(inputs):
        np.save(folder / f"in{k}.npy", x)
        flags += ["--input", f"in{k}.npy"]
    rows, reference = [], None
    for plan in ["default", *[p for p in plans if p != "default"]]:
        tag = plan.replace(":", "_").replace(",", "_")
        built = _collage("compile", source, "--plan", plan, "-o", f"out_{tag}", cwd=folder)
        if built.returncode != 0:
            rows.append(Row(name, plan, Outcome.FAILED, "compile: " + _last_line(built)))
            continue
        ran = _collage("run", f"out_{tag}", *flags, "--output-dir", f"res_{tag}", cwd=folder)
        if ran.returncode != 0:
            rows.append(Row(name, plan, Outcome.FAILED, "run: " + _last_line(ran)))
            continue
        outs = [np.load(p) for p in sorted((folder / f"res_{tag}").glob("out_*.npy"),
                                            key=lambda p: int(p.stem.split("_")[1]))]
        if reference is None:
            reference = outs
            rows.append(Row(name, plan, Outcome.PASSED))
            continue
        plan_regions = load_manifest(folder / f"out_{tag}").plan["regions"]  # codegen regions too
        backends = {r["backend"] for r in plan_regions} | {"iree-cpu"}
        rtol = max(get_backend(b).tolerance.rtol for b in backends)
        atol = max(get_backend(b).tolerance.atol for b in backends)
        if name in QUANTIZED:  # int8 kernels round other values by a step than IREE's f32 q/dq arithmetic
            rtol = max(rtol, QUANT_RTOL)
        check = compare(outs, reference, rtol, atol)  # collage's own rule: relative to each output's scale
        rows.append(Row(name, plan, Outcome.PASSED if check.ok else Outcome.WRONG, check.message))
    return rows


def markdown(rows: list[Row]) -> str:
    out = ["| model | plan | outcome | detail |", "|---|---|---|---|"]
    out += [f"| {r.model} | {r.plan} | {r.outcome.value} | {r.detail[:200]} |" for r in rows]
    counts = {o: sum(r.outcome == o for r in rows) for o in Outcome}
    out.append("")
    out.append(", ".join(f"{n} {o.value}" for o, n in counts.items()) + f" of {len(rows)}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--plans", nargs="+", default=list(PLANS), help="plan strings (prefer: lists hold commas)")
    ap.add_argument("--md", help="write the table here too")
    args = ap.parse_args(argv)
    rows: list[Row] = []
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            for row in run_model(name, args.plans, Path(tmp)):
                print(f"{row.model:12} {row.plan:22} {row.outcome.value:7} {row.detail[:160]}", flush=True)
                rows.append(row)
    table = markdown(rows)
    print(table)
    if args.md:
        Path(args.md).write_text(table + "\n")
    return 0 if all(r.outcome == Outcome.PASSED for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
