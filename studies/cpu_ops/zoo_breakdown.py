"""Where IREE alone spends a zoo model's time, from the per-operator study (studies/cpu_ops/cpu_ops.json):
each convolution / matmul occurrence of the model at its measured median per backend, summed; against the
best backend per operator (what a placement could reach on those operators alone).

    python -m studies.cpu_ops.zoo_breakdown [--results studies/cpu_ops/cpu_ops.json]
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from studies.cpu_ops import model_zoo_ops as ops


def occurrences(model: str) -> list:
    """Every conv / matmul of one inference (BERT-base: 12 layers of Q, K, V, output, scores, x V, FFN)."""
    if model != "bert_base":
        return ops.MODELS[model]()
    proj, scores, av, up, down = ops.bert_base()
    return 12 * [proj, proj, proj, proj, scores, av, up, down]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(Path(__file__).parent / "cpu_ops.json"))
    args = p.parse_args()
    times = collections.defaultdict(dict)
    for r in json.load(open(args.results)):
        if r.get("median_ms") is not None:
            times[(r["model"], r["op"])][r["backend"]] = r["median_ms"]
    backends = sorted({b for d in times.values() for b in d})
    print("| model | ops | GFLOP | " + " | ".join(f"{b} ms" for b in backends) + " | best per op ms | top 3 ops on iree-cpu (ms, share) |")
    print("|---|---:|---:|" + "---:|" * len(backends) + "---:|---|")
    for model in ops.MODELS:
        occ = occurrences(model)
        total = collections.Counter()
        per_op = collections.Counter()
        for o in occ:
            t = times[(model, o.name)]
            for b, ms in t.items():
                total[b] += ms
            total["best"] += min(t.values())
            per_op[o.name] += t.get("iree-cpu", 0.0)
        top = ", ".join(f"{n} x{sum(1 for o in occ if o.name == n)} {ms:.0f} ({ms / total['iree-cpu']:.0%})"
                        for n, ms in per_op.most_common(3))
        print(f"| {model} | {len(occ)} | {sum(o.flops for o in occ) / 1e9:.2f} | "
              + " | ".join(f"{total[b]:.1f}" for b in backends) + f" | {total['best']:.1f} | {top} |")


if __name__ == "__main__":
    main()
