"""A JAX transformer encoder in int8 over a declared range of lengths: ``collage_mlir.jax.jit(precision="int8",
dims=...)`` against ``jax.jit`` (f32, a compile per length, done before timing) and collage's f32 range.

The encoder is written as a JAX user writes one (``jax.nn.dot_product_attention`` under a mask, GELU, layer
norm, a masked mean over the sequence): ``--layers`` layers, 256 wide, vocabulary 8000, batch 2, lengths
``--dims`` (MIN:OPT:MAX). collage quantizes it once for the range (16 calibration batches at the OPT length),
places each bucket (MIN, OPT, MAX) and the fallback between them at its shape: the fastest int8 engine
agreeing with ONNX Runtime, or the f32 model where an engine runs that faster. What serves each shape is read
from the artifact (its buckets' provenance says ``precision``). Timed side by side, interleaved, median of
``--rounds`` rounds of 3 calls; the int8 error is against ``jax.jit`` (share of the output's scale).

    python -m studies.int8.jax_int8_range --rounds 7        # ~3 min; jax_int8_range.{json,md}
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from studies.common.report import header, write_report

HERE = Path(__file__).parent
VOCAB, WIDTH, HEADS = 8000, 256, 4


def encoder_of(layers: int):
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    p = {"emb": rng.standard_normal((VOCAB, WIDTH)) * 0.05, "pos": rng.standard_normal((512, WIDTH)) * 0.05,
         "layers": [{"qkv": rng.standard_normal((WIDTH, 3 * WIDTH)) * WIDTH ** -0.5,
                     "o": rng.standard_normal((WIDTH, WIDTH)) * WIDTH ** -0.5,
                     "f1": rng.standard_normal((WIDTH, 4 * WIDTH)) * WIDTH ** -0.5,
                     "f2": rng.standard_normal((4 * WIDTH, WIDTH)) * (4 * WIDTH) ** -0.5,
                     "g1": np.ones(WIDTH), "g2": np.ones(WIDTH)} for _ in range(layers)],
         "cls": rng.standard_normal((WIDTH, 3)) * WIDTH ** -0.5}
    p = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), p)

    def norm(x, g):
        m = x.mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * g

    def encoder(ids, mask):
        b, s = ids.shape
        x = p["emb"][ids] + p["pos"][:s]
        for lp in p["layers"]:
            q, k, v = (t.reshape(b, s, HEADS, WIDTH // HEADS) for t in jnp.split(norm(x, lp["g1"]) @ lp["qkv"], 3, -1))
            a = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None, None, :].astype(bool))
            x = x + a.reshape(b, s, WIDTH) @ lp["o"]
            x = x + jax.nn.gelu(norm(x, lp["g2"]) @ lp["f1"]) @ lp["f2"]
        return ((x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)) @ p["cls"]

    return encoder


def tokens(s: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, (2, s)).astype(np.int32), np.ones((2, s), np.int32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dims", default="16:64:128", help="the length's MIN:OPT:MAX")
    parser.add_argument("--lengths", default="16,40,64,100,128", help="lengths timed")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=str(HERE))
    parser.add_argument("--name", default="jax_int8_range")
    args = parser.parse_args()
    low, opt, high = (int(v) for v in args.dims.split(":"))
    lengths = [int(v) for v in args.lengths.split(",")]

    with tempfile.TemporaryDirectory(prefix="collage-study-") as cache:
        os.environ["COLLAGE_CACHE_DIR"] = cache  # a cache of the study's own: its artifact is the only one
        import jax

        import collage_mlir.jax as cj
        import collage_runtime
        from collage_mlir.shaped import quantizes_file

        encoder = encoder_of(args.layers)
        dims = {("0.1", "1.1"): (low, opt, high)}
        start = time.perf_counter()
        int8 = cj.jit(encoder, precision="int8", calibrate=[tokens(opt, i) for i in range(16)], dims=dims)
        int8(*tokens(opt, 99))
        int8_compile = time.perf_counter() - start
        (artifact,) = Path(cache, "compiled").glob("*.collage")
        with collage_runtime.load(artifact) as program:
            buckets = {b.label: program.program(b).manifest.provenance.get("precision", "?") for b in program.table.buckets}
            fallback = program.table.fallback.value
            if program.table.fallback.value != "none":
                fallback += " in " + ("int8" if quantizes_file(program.root / program.table.fallback.file) else "f32")
            served = {}
            for s in lengths:
                how = program.served(*tokens(s, 0))
                served[s] = how + (f" in {buckets[how.split(' ', 1)[1]]}" if how.startswith("bucket ") else
                                   fallback[len(program.table.fallback.value):] if how.endswith("fallback") else "")
        start = time.perf_counter()
        f32 = cj.jit(encoder, dims=dims)
        f32(*tokens(opt, 99))
        f32_compile = time.perf_counter() - start
        reference = jax.jit(encoder)
        runners = {"jax.jit f32": lambda a: np.asarray(reference(*a)), "collage f32": lambda a: np.asarray(f32(*a)),
                   "collage int8": lambda a: np.asarray(int8(*a))}
        rows = []
        for s in lengths:
            a = tokens(s, 7)
            for run in runners.values():
                run(a)  # jax.jit compiles this length here, and collage's f32 range any shape it compiles on first use
            samples = {k: [] for k in runners}
            for _ in range(args.rounds):
                for k, run in runners.items():
                    t = time.perf_counter()
                    for _ in range(3):
                        run(a)
                    samples[k].append((time.perf_counter() - t) / 3)
            want = np.asarray(reference(*a))
            error = float(np.abs(np.asarray(int8(*a)) - want).max() / np.abs(want).max())
            rows.append({"length": s, "ms": {k: float(np.median(v)) * 1e3 for k, v in samples.items()},
                         "int8_served_by": served[s], "int8_error": error})
    result = header(args.name) | {"layers": args.layers, "dims": [low, opt, high], "bucket_precision": buckets,
                                  "fallback": fallback, "int8_compile_s": int8_compile, "f32_compile_s": f32_compile,
                                  "rows": rows}
    names = list(runners)
    table = [f"| {r['length']} | " + " | ".join(f"{r['ms'][k]:.2f}" for k in names)
             + f" | {r['int8_served_by']} | {r['int8_error']:.3f} |" for r in rows]
    write_report(args.out, args.name, result,
                 f"# A JAX encoder ({args.layers} layers, 256 wide, batch 2) in int8 over lengths {low}..{high}\n\n"
                 f"Command: `{result['command']}`; device: {result['device']}\n\n"
                 f"collage int8: buckets {', '.join(f'{k} in {v}' for k, v in buckets.items())}; between them "
                 f"{fallback}; compiled in {int8_compile:.0f} s (the f32 range in {f32_compile:.0f} s).\n\n"
                 f"| length | {' | '.join(names)} | int8 served by | int8 error (of scale) |\n"
                 f"|---:|{'---:|' * len(names)}---|---:|\n" + "\n".join(table) + "\n")


if __name__ == "__main__":
    main()
