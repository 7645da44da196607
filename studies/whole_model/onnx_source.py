"""A whole model on ONNX Runtime from an ONNX file: the region built from the user's file (what collage does
since ``Backend.build_source``) against the region translated from StableHLO, interleaved in one process,
and ONNX Runtime on the file as its users run it (default session), timed after them. Also checks each program's outputs
against ONNX Runtime's on the file.

Models: Hugging Face BERT (``transformers.BertConfig()``: BERT-base, seeded weights) taking ``input_ids``
and ``attention_mask``, exported by torch's TorchScript ONNX exporter at one static shape, in f32 and
quantized by ``onnxruntime.quantization.quantize_dynamic`` (int8 weights, activations quantized at run time).

    python -m studies.whole_model.onnx_source [--layers 12] [--seq 64] [--rounds 7] [--name onnx_source]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from collage_mlir.dialects import collage
from collage_mlir.frontends import load_model
from collage_mlir.graph import Graph, number_ops
from collage_mlir.ir import new_context
from collage_mlir.iree import compile_module
from collage_mlir.search import resolve_plan

from ..common.report import header, write_report
from ..common.timing import interleaved_ms


def export_bert(out: Path, layers: int, seq: int) -> tuple[Path, Path, list[np.ndarray]]:
    """(f32 file, dynamic int8 file, inputs) of a seeded BERT at batch 1 x ``seq``."""
    import torch
    import transformers
    from onnxruntime.quantization import QuantType, quantize_dynamic

    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(num_hidden_layers=layers)).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.randint(0, 30000, (1, seq))
    mask = torch.ones(1, seq, dtype=torch.int64)
    mask[0, -seq // 4:] = 0  # a padded request
    f32 = out / "bert.onnx"
    torch.onnx.export(Hidden(), (ids, mask), str(f32), dynamo=False, opset_version=17,
                      input_names=["input_ids", "attention_mask"], output_names=["hidden"])
    int8 = out / "bert_dq.onnx"
    quantize_dynamic(str(f32), str(int8), weight_type=QuantType.QInt8)
    return f32, int8, [ids.numpy(), mask.numpy()]


def programs(path: Path, out: Path):
    """(from the file, translated) programs of ``path`` whole on ONNX Runtime."""
    import collage_runtime

    loaded = []
    for how in ("file", "translated"):
        module = load_model(path, new_context())
        if how == "translated":
            collage.OnnxSource.detach(module)
        number_ops(module)
        compile_module(module, resolve_plan("whole:ort", Graph(module)), out / f"{path.stem}.{how}")
        loaded.append(collage_runtime.load(out / f"{path.stem}.{how}"))
    return loaded


def main() -> None:
    import onnxruntime as ort

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--name", default="onnx_source")
    p.add_argument("--out", default=str(Path(__file__).parent))
    args = p.parse_args()
    result = header(args.name) | {"rows": []}
    lines = [f"{result['device']}, `{result['command']}`; median ms per call, {args.rounds} rounds (collage's two interleaved, ORT's after them)", "",
             "| model | ORT on the file | collage, from the file | collage, translated | translated / file | "
             "max \\|diff\\| vs ORT: file, translated |", "|---|---:|---:|---:|---:|---|"]
    with tempfile.TemporaryDirectory(prefix="onnx-source-") as tmp:
        f32, int8, inputs = export_bert(Path(tmp), args.layers, args.seq)
        for label, path in ((f"BERT ({args.layers} layers) 1x{args.seq}, f32", f32),
                            (f"BERT ({args.layers} layers) 1x{args.seq}, quantize_dynamic int8", int8)):
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            feeds = dict(zip((i.name for i in session.get_inputs()), inputs))
            (want,) = session.run(None, feeds)
            from_file, translated = programs(path, Path(tmp))
            diffs = [float(np.abs(np.asarray(p.invoke("main", *inputs)[0]) - want).max()) for p in (from_file, translated)]
            # ORT's default session spins its workers after a call, slowing whatever runs next: it is timed
            # apart (identical files measured 39.1 and 44.3 ms interleaved beside it, 39.9 and 40.3 without).
            ms = interleaved_ms({"file": lambda: from_file.invoke("main", *inputs),
                                 "translated": lambda: translated.invoke("main", *inputs)}, args.rounds)
            ms |= interleaved_ms({"ort": lambda: session.run(None, feeds)}, args.rounds)
            result["rows"].append({"model": label, "ms": ms, "max_diff": diffs})
            lines.append(f"| {label} | {ms['ort']:.2f} | {ms['file']:.2f} | {ms['translated']:.2f} | "
                         f"{ms['translated'] / ms['file']:.3f} | {diffs[0]:.2g}, {diffs[1]:.2g} |")
            from_file.close()
            translated.close()
    write_report(args.out, args.name, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
