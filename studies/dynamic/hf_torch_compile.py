"""A Hugging Face classifier served through ``torch.compile(dynamic=True)`` with a declared sequence range, as a
user writes it, against torch eager and Inductor with dynamic shapes, per sequence length.

The model: ``DistilBertForSequenceClassification`` built from a config (4 layers, 256 wide, seeded weights),
batch 2, the second row's mask half zero. Collage: ``options={"dims": {("0.1", "1.1"): (8, 64, 128)}}`` (token
ids' and their mask's sequence, one dim: Hugging Face indexes the mask by the ids' positions, so the graph does
not tie them) with each ``--plans`` entry, buckets 8, 64, 128 and the fastest engine between them. Each length:
every contender checked against eager (atol 1e-4), then timed interleaved (``interleaved_ms``).

    python -m studies.dynamic.hf_torch_compile --rounds 7        # ~4 min; hf_torch_compile.{json,md}
"""

from __future__ import annotations

import argparse
import gc
import time
import warnings
from pathlib import Path

from studies.common.report import header, write_report
from studies.common.timing import interleaved_ms

LENGTHS = (8, 64, 128, 40, 100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--plans", default="whole:openvino,default", help="collage plans, comma-separated")
    parser.add_argument("--name", default="hf_torch_compile")
    args = parser.parse_args(argv)

    import torch
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    import collage_mlir.torch  # noqa: F401  (registers the backend)

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=1000, dim=256, n_layers=4, n_heads=4, hidden_dim=1024, num_labels=3)
    model = DistilBertForSequenceClassification(config).eval()

    def inputs(n: int) -> dict:
        ids, mask = torch.randint(0, 1000, (2, n)), torch.ones(2, n, dtype=torch.long)
        mask[1, n // 2:] = 0
        return {"input_ids": ids, "attention_mask": mask}

    contenders, built = {"eager": model}, {}
    torch._dynamo.reset()
    for plan in args.plans.split(","):
        options = {"dims": {("0.1", "1.1"): (8, 64, 128)}} | ({} if plan == "default" else {"plan": plan})
        contenders[f"collage {plan}"] = torch.compile(model, backend="collage", dynamic=True, options=options)
    contenders["inductor dynamic"] = torch.compile(model, dynamic=True)
    rows = []
    with torch.no_grad():
        for label, fn in contenders.items():  # the first call builds (collage: every bucket and the fallback)
            start = time.perf_counter()
            fn(**inputs(64))
            built[label] = time.perf_counter() - start
        served = {}
        for module in (o for o in gc.get_objects() if type(o).__name__ == "ShapedModule"):
            served[str(module.program.root)] = str(module.program.table.fallback.value)
        for n in LENGTHS:
            x = inputs(n)
            want = model(**x).logits
            for label, fn in contenders.items():
                torch.testing.assert_close(fn(**x).logits, want, rtol=1e-3, atol=1e-4, msg=f"{label} at {n}")
            ms = interleaved_ms({k: (lambda f=f: f(**x)) for k, f in contenders.items()}, args.rounds)
            rows.append({"length": n, "bucket": n in (8, 64, 128), "ms": ms})
            print(n, {k: round(v, 2) for k, v in ms.items()})
    labels, head = list(contenders), header(args.name)
    lines = [f"# {args.name}", "", f"Command: `{head['command']}`; {head['device']}.", "",
             "First call (build) s: " + ", ".join(f"{k} {v:.1f}" for k, v in built.items()) + ".",
             "Fallback engine of each collage range: " + ", ".join(sorted(set(served.values()))) + ".", "",
             "| tokens (batch 2) | served | " + " | ".join(labels) + " |",
             "|---:|---|" + "---:|" * len(labels)]
    for r in rows:
        lines.append(f"| {r['length']} | {'bucket' if r['bucket'] else 'between'} | "
                     + " | ".join(f"{r['ms'][k]:.2f}" for k in labels) + " |")
    write_report(Path(__file__).parent, args.name, head | {"rows": rows, "built_s": built, "fallbacks": served},
                 "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
