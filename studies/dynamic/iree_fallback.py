"""IREE's dynamic program as the fallback between buckets of a StableHLO module, against the static program
at the same shape and against padding to the next bucket.

JAX models written as JAX users write them (``jax.nn``, NHWC), exported with ``jax.export`` and a symbolic
dim, compiled three ways through ``collage_mlir.iree.compile_file`` (the default plan: IREE alone, so the
three differ only in how the shape is served):

- **fallback**: buckets at MIN, OPT and MAX, nothing else declared: a shape between them runs on IREE's
  program of the module with its ``?`` dims kept (``Fallback.IREE``);
- **padded**: the same buckets with the dim declared paddable: the next bucket on zero-padded inputs;
- **static**: a program compiled for exactly that shape (what a bucket there would run);
- **ort** (a last column): the module's ONNX translation with dynamic dims on ONNX Runtime as the fallback,
  where its ops translate.

At each shape between buckets the three are timed side by side (interleaved rounds, median), and the
fallback's results are checked against jax's. Writes ``iree_fallback.json``/``.md`` beside this file (or
``--out``):

    python -m studies.dynamic.iree_fallback --rounds 5
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from studies.common.report import header, write_report
from studies.common.timing import interleaved_ms

HERE = Path(__file__).parent


def models():
    """name → (function of one array, example input shape with the symbol first, symbol, (MIN, OPT, MAX),
    shapes between buckets, whether rows are independent along the symbol: padding is exact)."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)

    def param(*shape, scale=0.1):
        return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)

    w1, w2, w3 = param(256, 512), param(512, 512), param(512, 10)

    def mlp(x):
        h = jax.nn.gelu(x @ w1)
        h = jax.nn.gelu(h @ w2)
        return jax.nn.log_softmax(h @ w3)

    k1, k2, k3, fc = param(3, 3, 3, 32), param(3, 3, 32, 64), param(3, 3, 64, 64), param(64, 10)

    def conv(x, k, stride):
        return jax.lax.conv_general_dilated(x, k, (stride, stride), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def cnn(x):  # NHWC
        h = jax.nn.relu(conv(x, k1, 2))
        h = jax.nn.relu(conv(h, k2, 2))
        h = jax.nn.relu(conv(h, k3, 1))
        return jax.nn.softmax(h.mean(axis=(1, 2)) @ fc)

    d, heads = 128, 4
    wq, wk, wv, wo, f1, f2 = (param(d, d), param(d, d), param(d, d), param(d, d), param(d, 4 * d),
                              param(4 * d, d))

    def layer_norm(h):
        mean = h.mean(-1, keepdims=True)
        return (h - mean) * jax.lax.rsqrt(((h - mean) ** 2).mean(-1, keepdims=True) + 1e-5)

    def encoder(x):  # [seq, d]: one sequence, its length dynamic
        s = x.shape[0]
        h = layer_norm(x)
        q, k, v = ((h @ w).reshape(s, heads, d // heads).transpose(1, 0, 2) for w in (wq, wk, wv))
        attention = jax.nn.softmax(q @ k.transpose(0, 2, 1) / np.sqrt(d // heads), axis=-1) @ v
        x = x + attention.transpose(1, 0, 2).reshape(s, d) @ wo
        return x + jax.nn.gelu(layer_norm(x) @ f1) @ f2

    return {
        "mlp": (mlp, ("b", 256), "b", (1, 8, 64), (3, 13, 40), True),
        "cnn_nhwc": (cnn, ("b", 32, 32, 3), "b", (1, 4, 16), (2, 6, 11), True),
        # attention mixes positions: a padded sequence computes something else (no mask here)
        "encoder": (encoder, ("s", d), "s", (8, 64, 256), (24, 100, 200), False),
    }


def exported(fn, shape, symbol: str) -> str:
    import jax
    import jax.numpy as jnp

    sym, = jax.export.symbolic_shape(symbol)
    spec = jax.ShapeDtypeStruct(tuple(sym if s == symbol else s for s in shape), jnp.float32)
    return jax.export.export(jax.jit(fn))(spec).mlir_module()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", action="append", help="only these models (default: all)")
    parser.add_argument("--out", default=str(HERE))
    args = parser.parse_args()

    import collage_runtime
    from collage_mlir.errors import CollageError
    from collage_mlir.iree import compile_file
    from collage_runtime.shapes import Fallback

    result = header("iree_fallback") | {"rounds": args.rounds, "models": {}}
    lines = ["| model | shape | static ms | fallback ms | padded to | padded ms | fallback / static | "
             "padded / static | fallback max err vs jax | ORT fallback / static |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    chosen = models()
    for name in args.model or chosen:
        fn, shape, symbol, (lo, opt, hi), between, paddable = chosen[name]
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            source = root / f"{name}.mlir"
            source.write_text(exported(fn, shape, symbol))
            dims = {symbol: (lo, opt, hi)}
            compile_file(source, output_dir=root / "fallback", dims=dims, fallback=Fallback.IREE)
            compile_file(source, output_dir=root / "padded", dims=dims, pad=[symbol] if paddable else [])
            try:  # the module's ONNX translation with dynamic dims on ONNX Runtime, where its ops translate
                compile_file(source, output_dir=root / "ort", dims=dims, fallback=Fallback.ORT)
                ort = collage_runtime.load(root / "ort")
            except CollageError as exc:
                print(f"{name}: no ORT fallback ({exc})", flush=True)
                ort = None
            rows = []
            with collage_runtime.load(root / "fallback") as fallback, collage_runtime.load(root / "padded") as padded:
                runners = {"fallback": lambda: fallback.invoke("main", x)}
                if paddable:
                    runners["padded"] = lambda: padded.invoke("main", x)
                if ort is not None:
                    runners["ort"] = lambda: ort.invoke("main", x)
                for value in between:
                    compile_file(source, output_dir=root / f"static{value}", dims={symbol: value})
                    x = np.random.default_rng(value).standard_normal(
                        [value if s == symbol else s for s in shape]).astype(np.float32)
                    assert fallback.served(x) == "iree fallback", fallback.served(x)
                    error = float(np.abs(fallback.invoke("main", x)[0] - np.asarray(fn(x))).max())
                    with collage_runtime.load(root / f"static{value}") as static:
                        ms = interleaved_ms({"static": lambda: static.invoke("main", x)} | runners, args.rounds)
                    to = padded.served(x).removeprefix("padded to ") if paddable else "n/a (not paddable)"
                    row = {"value": value, "padded_to": to, "max_error": error} | ms
                    rows.append(row)
                    pad_ms, pad_ratio = ((f"{ms['padded']:.3f}", f"{ms['padded'] / ms['static']:.2f}x") if paddable
                                         else ("-", "-"))
                    ort_ratio = f"{ms['ort'] / ms['static']:.2f}x" if ort is not None else "-"
                    lines.append(f"| {name} | {symbol}={value} | {ms['static']:.3f} | {ms['fallback']:.3f} | {to} | "
                                 f"{pad_ms} | {ms['fallback'] / ms['static']:.2f}x | {pad_ratio} | {error:.1e} | "
                                 f"{ort_ratio} |")
                    print(lines[-1], flush=True)
            if ort is not None:
                ort.close()
        result["models"][name] = {"dim": [lo, opt, hi], "rows": rows}
    write_report(args.out, "iree_fallback", result,
                 f"# IREE's dynamic program between buckets\n\nCommand: `{result['command']}`; "
                 f"device: {result['device']}\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
