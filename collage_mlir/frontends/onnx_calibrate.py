"""An f32 ONNX model made int8 from calibration data the user gives (``--precision int8 --calibrate DATA``),
and compiled programs checked against the f32 model on held-out samples (``HeldOut``: ``--held-out DATA``, or
the calibration data's last quarter).

ONNX Runtime's quantizer (``quantize_static``) writes the QDQ model: per-channel int8 weights, per-tensor
int8 activations, ranges by min-max, a percentile or entropy (``CalibrationMethod``) over the calibration
samples. The last quarter of the samples is held out: the int8 model is run against the f32 model on it
(ONNX Runtime without graph optimizations, both: the model's own arithmetic, the same on any CPU), and the agreement — how often the top class on the last axis stays the same, and the
largest error relative to the output's scale — is reported beside speed; ``max_drop`` bounds the share of
held-out samples whose top class changes, nodes falling back to f32 to meet it (``quantize_onnx``). The quantized model then comes in as any quantized model does
(``frontends.onnx_qdq``).

Data: ``.npy`` for a one-input model, ``.npz`` with one array per input name; each array is the input's
shape with a longer leading (batch) axis, a whole number of the model's batches, at least 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import itertools
import logging
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from collage_runtime.program import InputError
from collage_runtime.shapes import ShapeTable

from ..errors import CollageError
from . import cache_dir, write_cache


class CalibrationMethod(Enum):
    """A range method: its value is the CLI's name, ``ort`` ONNX Runtime's ``CalibrationMethod`` member."""

    MINMAX = "minmax"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"

    @property
    def ort(self) -> str:
        return {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}[self.value]


@dataclass(frozen=True)
class Calibration:
    """What ``--precision int8`` quantizes with: the samples' file, the range method and the largest share
    of held-out samples whose top class may change (None: reported, not bounded)."""

    data: Path
    method: CalibrationMethod = CalibrationMethod.MINMAX
    max_drop: float | None = None

    @property
    def held_out(self) -> HeldOut:
        """The samples the int8 model and its programs are checked on: the data's last quarter."""
        return HeldOut(self.data, self.max_drop, last_quarter=True)


@dataclass(frozen=True)
class HeldOut:
    """Samples a compiled program is checked on against the f32 model (``program_agreement``), and the largest
    share of them whose top class may change (None: reported, not bounded): ``--held-out DATA [--max-drop
    X]`` (every batch of the file), or what ``--precision int8`` holds out of its calibration data (its last
    quarter: ``Calibration.held_out``)."""

    data: Path
    max_drop: float | None = None
    last_quarter: bool = False


@dataclass(frozen=True)
class Agreement:
    """The int8 model (or the compiled program: ``subject``) against the f32 model on the held-out samples."""

    samples: int
    #: Share of held-out samples whose top class (argmax over the first output's last axis) changed.
    top1_changed: float
    #: Largest |int8 - f32| over the first output, relative to its largest |f32|.
    max_rel_error: float
    subject: str = "int8"

    def line(self) -> str:
        return (f"{self.subject} against f32 on {self.samples} held-out samples: top class changed on "
                f"{100 * self.top1_changed:.1f} %, max error {100 * self.max_rel_error:.1f} % of the output's scale")

    def exceeds(self, max_drop: float | None) -> bool:
        return max_drop is not None and self.top1_changed > max_drop

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Agreement":
        return cls(int(data["samples"]), float(data["top1_changed"]), float(data["max_rel_error"]),
                   str(data.get("subject", "the program")))


def _inputs(model) -> list:
    """The ONNX model's graph inputs that are no initializer: what the data feeds."""
    constants = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in constants]


def _load(data: Path) -> np.ndarray | dict[str, np.ndarray]:
    """The calibration data file: an array, or an .npz's arrays by name in their order; or one CollageError
    naming ``--calibrate``."""
    try:
        loaded = np.load(data)
        return loaded if isinstance(loaded, np.ndarray) else dict(loaded)
    except (OSError, ValueError) as exc:
        raise CollageError(f"cannot read the calibration data: {' '.join(str(exc).split())[:200]}",
                           where="--calibrate", exit_code=2) from None


def _cached_samples(arrays: Mapping[str, np.ndarray]) -> Path:
    """``arrays`` (per input name, batches along the leading axis) as an .npz in the cache, named by their
    names, dtypes, shapes and values: what ``Calibration.data`` names."""
    digest = hashlib.sha256()
    for name, a in arrays.items():
        digest.update(f"{name} {a.dtype} {a.shape} ".encode() + np.ascontiguousarray(a).tobytes())
    out = cache_dir() / "int8" / f"samples-{digest.hexdigest()[:32]}.npz"
    if not out.is_file():
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        write_cache(out, buf.getvalue())
    return out


def _batches(model, data: Path) -> list[dict[str, np.ndarray]]:
    import onnx

    inputs = _inputs(model)
    loaded = _load(data)
    arrays = {inputs[0].name: loaded} if isinstance(loaded, np.ndarray) else loaded
    batches: list[dict[str, np.ndarray]] = []
    for i in inputs:
        if i.name not in arrays:
            raise CollageError(f"no array for the model's input '{i.name}' (an .npz holds one per input name, "
                               "an .npy serves a one-input model)", where="--calibrate", exit_code=2)
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]  # 0: a dynamic dim, any size
        a = arrays[i.name]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        batch = dims[0] if dims and dims[0] > 0 else 1
        if a.ndim != len(dims) or not _fits(a.shape[1:], dims[1:]) or a.shape[0] % batch or a.shape[0] < 2 * batch:
            raise CollageError(f"input '{i.name}' takes {_shown(dims)}: the data must be that shape with a leading "
                               f"axis of at least two batches of {batch}, got {list(a.shape)}", where="--calibrate",
                               exit_code=2)
        pieces = np.split(a.astype(dtype), a.shape[0] // batch)
        if not batches:
            batches = [{} for _ in pieces]
        if len(pieces) != len(batches):
            raise CollageError("the inputs' arrays hold different numbers of batches", where="--calibrate",
                               exit_code=2)
        for b, piece in zip(batches, pieces):
            b[i.name] = piece
    return batches


def _fits(shape: Sequence[int], dims: Sequence[int]) -> bool:
    """Whether ``shape`` is ``dims``'s, a dynamic dim (0) taking any size."""
    return all(d == 0 or s == d for s, d in zip(shape, dims))


def _shown(dims: Sequence[int]) -> str:
    return "[" + ", ".join("?" if d == 0 else str(d) for d in dims) + "]"


def samples_file(path: str | Path, samples: Sequence[Sequence[np.ndarray]]) -> Path:
    """Samples given as arrays (per batch, one array per input of the ONNX model at ``path``, in order) written
    where ``Calibration`` reads them: an .npz in the cache, one array per input name, the batches along the
    leading axis; each batch must have the model's input shapes (one CollageError naming ``calibrate``)."""
    import onnx

    inputs = _inputs(onnx.load(str(path), load_external_data=False))
    if len(samples) < 2:
        raise CollageError(f"calibrate takes at least 2 batches (the last quarter is held out), got {len(samples)}",
                           exit_code=2)
    for k, batch in enumerate(samples):
        if len(batch) != len(inputs):
            raise CollageError(f"calibrate batch {k} has {len(batch)} inputs, the model takes {len(inputs)}",
                               exit_code=2)
        for i, a in zip(inputs, batch):
            dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
            if np.ndim(a) != len(dims) or not _fits(np.shape(a), dims):
                raise CollageError(f"calibrate batch {k}: an input of shape {list(np.shape(a))}, the model takes "
                                   f"{_shown(dims)}", exit_code=2)
    return _cached_samples({i.name: np.concatenate([np.asarray(b[k]) for b in samples]) for k, i in enumerate(inputs)})


def named_samples(path: str | Path, data: Path) -> Path:
    """``data`` holding a model's inputs by position (an .npy for a one-input model, an .npz's arrays in the
    order they were saved: ``np.savez(f, x, mask)``) rewritten in the cache under the input names of the
    ONNX model at ``path`` (a translated model's ``in0``, ``in1``, ...), as ``Calibration`` reads them."""
    import onnx

    names = [i.name for i in _inputs(onnx.load(str(path), load_external_data=False))]
    loaded = _load(data)
    arrays = [loaded] if isinstance(loaded, np.ndarray) else list(loaded.values())
    if len(arrays) != len(names):
        raise CollageError(f"the model takes {len(names)} inputs, the data holds {len(arrays)} arrays (by position: "
                           "an .npy for one input, an .npz's arrays in order)", where="--calibrate", exit_code=2)
    return _cached_samples(dict(zip(names, arrays)))


#: At most this share of the quantized compute nodes falls back to f32 to meet ``max_drop``: beyond it the
#: model is hardly int8 any more, and the bound is reported as not met.
MAX_FALLBACK_SHARE = 0.5
#: How many candidate nodes each fallback step tries (each one quantization and one held-out run).
TRIALS = 8


def _held(batches: int) -> int:
    """How many of the calibration data's batches are held out: the last quarter, at least one."""
    return max(1, batches // 4)


def held_out_samples(path: str | Path, held: HeldOut) -> list[dict[str, np.ndarray]]:
    """The batches of ``held``'s data for the f32 model at ``path`` (where they are the last quarter of
    calibration data: those ``quantize_onnx`` holds out)."""
    import onnx

    batches = _batches(onnx.load(str(path), load_external_data=False), held.data)
    return batches[-_held(len(batches)):] if held.last_quarter else batches


def program_agreement(f32: str | Path, run, held_out: list[dict[str, np.ndarray]]) -> Agreement:
    """A compiled program (``run``: feeds → its first output) against the f32 model at ``f32`` (ONNX Runtime
    unoptimized) on ``held_out``: what the engines' own int8 kernels and the plan's float regions compute."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(f32), _options(), providers=["CPUExecutionProvider"])
    want = np.concatenate([session.run(None, feeds)[0] for feeds in held_out])
    return _compare(want, np.concatenate([np.asarray(run(feeds)) for feeds in held_out]), "the program")


def program_on_held_out(f32: str | Path, held: HeldOut, program) -> Agreement:
    """A loaded ``collage_runtime`` program against the f32 ONNX model ``f32`` on ``held``'s samples
    (``program_agreement``); a shape-bucket program gets them batched each way it serves a batch
    (``across_batches``)."""
    samples = held_out_samples(f32, held)
    table = getattr(program, "table", None)  # a shape-bucket artifact: every way it serves a batch
    if table is not None:
        feeds = across_batches(samples, table)
    else:
        signature = program.signature("main")
        feeds = list(samples) if signature is None else fitted(samples, signature.inputs, held)
    try:
        return program_agreement(f32, lambda f: program.invoke("main", *f.values())[0], feeds)
    except InputError as exc:  # a program specialised to another shape (--input) than the samples'
        raise CollageError(f"the held-out samples do not fit the compiled program ({exc}): give samples of the "
                           "shape it is compiled for, or declare the dynamic dims with --dim", where=str(held.data),
                           exit_code=2) from None


def held_out_fits(f32: str | Path, held: HeldOut, specs: Sequence) -> None:
    """That ``held``'s samples fit a static program whose inputs are ``specs`` (``fitted``): checked before a
    tune spends its budget, not after it."""
    fitted(held_out_samples(f32, held), specs, held)


def fitted(samples: Sequence[Mapping[str, np.ndarray]], specs: Sequence, held: HeldOut) -> list[dict[str, np.ndarray]]:
    """``samples`` as feeds of a static program whose inputs are ``specs`` (``regrouped``); one CollageError
    line where they do not fit it."""
    feeds = regrouped(samples, specs)
    for feed in feeds:
        arrays = [np.asarray(a) for a in feed.values()]
        bad = next((f"input {k}: expected {s}, got {a.dtype}{list(a.shape)}" for k, (s, a) in enumerate(zip(specs, arrays))
                    if s is not None and not s.accepts(a)), None)
        if len(arrays) != len(specs):
            bad = f"it takes {len(specs)} inputs, the samples hold {len(arrays)}"
        if bad is not None:
            raise CollageError(f"the held-out samples do not fit the compiled program ({bad}): give samples of the "
                               "shape it is compiled for, or declare the dynamic dims with --dim",
                               where=str(held.data), exit_code=2)
    return feeds


def regrouped(samples: Sequence[Mapping[str, np.ndarray]], specs: Sequence) -> list[dict[str, np.ndarray]]:
    """``samples`` stacked along the leading axis into feeds of a static program's own leading size, where
    every input differs from the program's (``specs``: its ``TensorSpec`` inputs) there alone (samples of one
    image, a program compiled for an ``--input`` batch of 8); the rows past the last whole feed are dropped.
    As they are otherwise, or where they fill no feed (then the program check says they do not fit)."""
    if not samples or len(specs) != len(samples[0]) or any(s is None or not s.shape for s in specs):
        return list(samples)
    size = specs[0].shape[0]
    arrays = list(samples[0].values())
    if size is None or any(s.shape[0] != size for s in specs) or not all(
            a.ndim == len(s.shape) and a.shape[1:] == tuple(s.shape[1:]) and a.shape[0] != size
            for a, s in zip(arrays, specs)):
        return list(samples)
    rows = {k: np.concatenate([s[k] for s in samples]) for k in samples[0]}
    total = len(next(iter(rows.values())))
    return [{k: v[i:i + size] for k, v in rows.items()} for i in range(0, total - size + 1, size)] or list(samples)


def across_batches(samples: Sequence[Mapping[str, np.ndarray]], table: ShapeTable) -> list[dict[str, np.ndarray]]:
    """``samples`` regrouped along the leading axis, where every input's carries the same dim (a batch), into
    feeds of each bucket's size of it and of a size between each two buckets (padded or the fallback's),
    in turn while samples last: so a program check runs each way the shape table serves a batch. As they
    are where the leading axis is no dim."""
    names = {axes[0] if axes else None for axes in table.inputs}
    if len(names) != 1 or None in names:
        return list(samples)
    (name,) = names
    sizes = sorted({b.values[name] for b in table.buckets})
    sizes += [(a + b) // 2 for a, b in zip(sizes, sizes[1:]) if b - a > 1]
    rows = {k: np.concatenate([s[k] for s in samples]) for k in samples[0]}
    total, start, feeds = len(next(iter(rows.values()))), 0, []
    for n in itertools.cycle(sizes):
        n = min(n, total - start)
        if n not in table.dim(name):  # none left, or fewer than the range's least (dropped)
            return feeds
        feeds.append({k: v[start:start + n] for k, v in rows.items()})
        start += n
    return feeds


def quantize_onnx(path: str | Path, calibration: Calibration) -> tuple[Path, Agreement, tuple[str, ...]]:
    """The int8 QDQ model of the f32 ONNX model at ``path`` (cached by model, data, method and the nodes
    kept in f32), its agreement with the f32 model on the held-out samples, and the nodes kept in f32.

    Where the agreement exceeds ``max_drop``, one quantized node falls back to f32 and the model is
    quantized again, as Neural Compressor and OpenVINO's accuracy control do: of the ``TRIALS`` nodes whose
    outputs differ most from f32's (relative to each output's scale), the one whose fallback alone gives
    the best agreement. Up to ``MAX_FALLBACK_SHARE`` of the quantized nodes; then a CollageError says so.
    (The largest output error alone is a poor guide: it grows downstream of the node that causes it.)"""
    import onnx

    try:
        model = onnx.load(str(path))
    except (OSError, ValueError) as exc:  # onnx raises DecodeError, a ValueError, on a file that is no model
        raise CollageError(f"cannot read the ONNX model: {' '.join(str(exc).split())[:200]}", where=str(path),
                           exit_code=2) from None
    batches = _batches(model, calibration.data)
    held = _held(len(batches))
    calibrate, held_out = batches[:-held], batches[-held:]
    kept: list[str] = []
    while True:
        out = _quantized(path, calibrate, calibration.method, tuple(kept))
        agreement = _agreement(str(path), str(out), held_out)
        if not agreement.exceeds(calibration.max_drop):
            return out, agreement, tuple(kept)
        nodes = [n for n in _quantized_nodes(out) if n.name not in kept]
        if not nodes or len(kept) + 1 > MAX_FALLBACK_SHARE * (len(nodes) + len(kept)):
            f32 = f" with {len(kept)} of its nodes in f32" if kept else ""
            raise CollageError(f"{agreement.line()}{f32}: above --max-drop {calibration.max_drop:g}; nothing was "
                               "built", where=str(path))
        suspects = _by_output_error(str(path), str(out), nodes, held_out)[:TRIALS]
        trials = {name: _agreement(str(path), str(_quantized(path, calibrate, calibration.method, (*kept, name))),
                                   held_out) for name in suspects}
        kept.append(min(trials, key=lambda n: (trials[n].top1_changed, trials[n].max_rel_error)))


def _softmax_inputs(graph) -> list[str]:
    """The Softmax nodes and the nodes whose results they read, kept in f32: an attention mask fills the
    scores of padded keys with a huge negative value (``Where``, ``Add``), which a quantized tensor clamps
    to its calibrated minimum, so padded keys took a share of every softmax (a DistilBERT's logits moved
    1 % of their scale when its input was padded). In f32 they get none, and the probabilities the next
    MatMul quantizes are exactly 0 there."""
    softmax = [n for n in graph.node if n.op_type == "Softmax"]
    feeding = {i for n in softmax for i in n.input}
    return [n.name for n in graph.node if n.name and (n.op_type == "Softmax" or feeding & set(n.output))]


def _quantized(path: str | Path, calibrate: list, method: CalibrationMethod, kept: tuple[str, ...]) -> Path:
    import onnx
    import onnxruntime as ort
    from onnxruntime import quantization as q

    digest = hashlib.sha256(Path(path).read_bytes())
    for batch in calibrate:
        for name in sorted(batch):
            digest.update(np.ascontiguousarray(batch[name]).tobytes())
    digest.update(f"{method.value} {ort.__version__} {' '.join(kept)} scalar-pairs-folded softmax-f32".encode())
    out = cache_dir() / "int8" / f"{digest.hexdigest()[:32]}.onnx"
    if out.is_file():
        return out

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.items = iter(calibrate)

        def get_next(self):
            return next(self.items, None)

    tmp = out.with_suffix(".partial.onnx")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    level = root.level
    try:
        # Its advice ("consider pre-processing") goes to the root logger, its progress to stdout.
        root.setLevel(logging.ERROR)
        with contextlib.redirect_stdout(io.StringIO()):
            q.quantize_static(str(path), str(tmp), Reader(), quant_format=q.QuantFormat.QDQ, per_channel=True,
                              activation_type=q.QuantType.QInt8, weight_type=q.QuantType.QInt8,
                              calibrate_method=q.CalibrationMethod[method.ort],
                              nodes_to_exclude=[*kept, *_softmax_inputs(onnx.load(str(path)).graph)])
    except Exception as exc:  # noqa: BLE001  the quantizer raises any type
        raise CollageError(f"ONNX Runtime's quantizer failed: {' '.join(str(exc).split())[:300]}",
                           where=str(path)) from None
    finally:
        root.setLevel(level)
    model = onnx.load(str(tmp))
    if _scalar_pairs_folded(model.graph):
        onnx.save(model, str(tmp))
    write_cache(out, tmp.read_bytes())
    tmp.unlink()
    return out


def openvino_ready(model: Path, directory: Path) -> Path:
    """``model``, or, where ORT's quantizer left pairs on scalar constants in it (a user's own int8 file), a copy
    in ``directory`` with them folded (``_scalar_pairs_folded``): what OpenVINO can compile."""
    import onnx

    target = directory / f"folded-{model.name}"
    if target.exists():
        return target
    proto = onnx.load(str(model))
    if not _scalar_pairs_folded(proto.graph):
        return model
    onnx.save(proto, str(target), save_as_external_data=proto.ByteSize() > 1 << 30, location=f"{target.name}.data")
    return target


def _scalar_pairs_folded(graph) -> int:
    """Folds each QuantizeLinear and DequantizeLinear of a scalar constant into the constant it computes (round half
    to even, saturated: the pair's own value). ORT's quantizer wraps a constant multiplier (attention's 1/sqrt(d)
    in a TorchScript export of BERT) in such a pair, on which OpenVINO's low-precision transformations fail
    ("MultiplyPartialTransformation ... index '0' out of range", OpenVINO 2026.4, static or dynamic dims), so it
    could not compile the int8 model at all; the pair quantizes nothing an engine runs in int8. Returns how many
    nodes were folded."""
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    values |= {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node
               if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value"}
    folded: set[str] = set()
    kept = []
    for n in graph.node:
        ins = [values.get(i) for i in n.input]
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") or any(v is None for v in ins) or ins[0].ndim:
            kept.append(n)
            continue
        scale = ins[1].astype(np.float64)
        zero = ins[2] if len(ins) > 2 else np.zeros((), np.uint8)
        if n.op_type == "QuantizeLinear":
            info = np.iinfo(zero.dtype)
            q = np.round(ins[0].astype(np.float64) / scale) + zero.astype(np.float64)  # numpy: half to even
            values[n.output[0]] = np.clip(q, info.min, info.max).astype(zero.dtype)
        else:
            values[n.output[0]] = ((ins[0].astype(np.float64) - zero.astype(np.float64)) * scale).astype(ins[1].dtype)
        folded.add(n.output[0])
    if not folded:
        return 0
    read = {i for n in kept for i in n.input} | {o.name for o in graph.output}
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(values[name], name) for name in sorted(folded & read))
    return len(folded)



def _quantized_nodes(int8: Path) -> list:
    """The float nodes of the int8 model that read a dequantized value (the quantizer's quantized nodes, and
    nodes kept in f32 whose producer's output is quantized)."""
    import onnx

    model = onnx.load(str(int8))
    dequantized = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return [n for n in model.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and n.name
            and any(i in dequantized for i in n.input)]


def _by_output_error(f32: str, int8: str, nodes: list, held_out: list[dict[str, np.ndarray]]) -> list[str]:
    """The names of ``nodes``, those whose first output differs most from f32's (relative to f32's largest
    value there) on the held-out samples first."""
    import onnx

    outputs = [n.output[0] for n in nodes]
    runs = []
    for path in (f32, int8):
        model = onnx.load(path)
        present = {o for n in model.graph.node for o in n.output}
        model.graph.output.extend(onnx.ValueInfoProto(name=o) for o in outputs if o in present)
        runs.append(_run(model.SerializeToString(), outputs, held_out))
    errors = {}
    for node, name in zip(nodes, outputs):
        want, got = runs[0].get(name), runs[1].get(name)
        if want is not None and got is not None and want.shape == got.shape:
            errors[node.name] = float(np.abs(got - want).max()) / (float(np.abs(want).max()) or 1.0)
    return sorted((n.name for n in nodes), key=lambda name: -errors.get(name, 0.0))


def _run(model: bytes, names: list[str], held_out: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = _options()
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    wanted = [o.name for o in session.get_outputs() if o.name in names]
    found = [session.run(wanted, feeds) for feeds in held_out]
    return {name: np.concatenate([np.asarray(f[k], np.float64) for f in found]) for k, name in enumerate(wanted)}


def _options():
    """ONNX Runtime without graph optimizations: the int8 model's own arithmetic (each quantize rounded as
    the model says, f32 ops between), the same on every CPU, not one engine's int8 kernels."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return options


def _agreement(f32: str, int8: str, held_out: list[dict[str, np.ndarray]]) -> Agreement:
    import onnxruntime as ort

    options = _options()
    a, b = (ort.InferenceSession(p, options, providers=["CPUExecutionProvider"]) for p in (f32, int8))
    want = np.concatenate([a.run(None, feeds)[0] for feeds in held_out])
    return _compare(want, np.concatenate([b.run(None, feeds)[0] for feeds in held_out]), "int8")


def _compare(want: np.ndarray, got: np.ndarray, subject: str) -> Agreement:
    scale = float(np.abs(want).max()) or 1.0
    changed = float(np.mean(want.reshape(-1, want.shape[-1]).argmax(-1) != got.reshape(-1, got.shape[-1]).argmax(-1))) \
        if want.ndim and want.shape[-1] > 1 else 0.0
    return Agreement(want.reshape(-1, want.shape[-1]).shape[0] if want.ndim else 1, changed,
                     float(np.abs(got.astype(np.float64) - want).max()) / scale, subject)
