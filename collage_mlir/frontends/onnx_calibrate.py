"""An f32 ONNX model made int8 from calibration data the user gives (``--precision int8 --calibrate DATA``).

ONNX Runtime's quantizer (``quantize_static``) writes the QDQ model: per-channel int8 weights, per-tensor
int8 activations, ranges by min-max, a percentile or entropy (``CalibrationMethod``) over the calibration
samples. The last quarter of the samples is held out: the int8 model is run against the f32 model on it
(ONNX Runtime, both), and the agreement — how often the top class on the last axis stays the same, and the
largest error relative to the output's scale — is reported beside speed; ``max_drop`` bounds the share of
held-out samples whose top class changes. The quantized model then comes in as any quantized model does
(``frontends.onnx_qdq``).

Data: ``.npy`` for a one-input model, ``.npz`` with one array per input name; each array is the input's
shape with a longer leading (batch) axis, a whole number of the model's batches, at least 2.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np

from ..errors import CollageError
from . import cache_dir, write_cache


class CalibrationMethod(Enum):
    MINMAX = "minmax"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"


@dataclass(frozen=True)
class Calibration:
    """What ``--precision int8`` quantizes with: the samples' file, the range method and the largest share
    of held-out samples whose top class may change (None: reported, not bounded)."""

    data: Path
    method: CalibrationMethod = CalibrationMethod.MINMAX
    max_drop: float | None = None


@dataclass(frozen=True)
class Agreement:
    """The int8 model against the f32 model on the held-out samples."""

    samples: int
    #: Share of held-out samples whose top class (argmax over the first output's last axis) changed.
    top1_changed: float
    #: Largest |int8 - f32| over the first output, relative to its largest |f32|.
    max_rel_error: float

    def line(self) -> str:
        return (f"int8 against f32 on {self.samples} held-out samples: top class changed on "
                f"{100 * self.top1_changed:.1f} %, max error {100 * self.max_rel_error:.1f} % of the output's scale")


def _batches(model, data: Path) -> list[dict[str, np.ndarray]]:
    import onnx

    constants = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in constants]
    try:
        loaded = np.load(data)
    except (OSError, ValueError) as exc:
        raise CollageError(f"cannot read the calibration data: {' '.join(str(exc).split())[:200]}",
                           where="--calibrate", exit_code=2) from None
    arrays = {inputs[0].name: loaded} if isinstance(loaded, np.ndarray) else dict(loaded)
    batches: list[dict[str, np.ndarray]] = []
    for i in inputs:
        if i.name not in arrays:
            raise CollageError(f"no array for the model's input '{i.name}' (an .npz holds one per input name, "
                               "an .npy serves a one-input model)", where="--calibrate", exit_code=2)
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        a = arrays[i.name]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        batch = dims[0] if dims and dims[0] > 0 else 1
        if a.ndim != len(dims) or list(a.shape[1:]) != dims[1:] or a.shape[0] % batch or a.shape[0] < 2 * batch:
            raise CollageError(f"input '{i.name}' takes {dims}: the data must be that shape with a leading axis of "
                               f"at least two batches of {batch}, got {list(a.shape)}", where="--calibrate",
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


def quantize_onnx(path: str | Path, calibration: Calibration) -> tuple[Path, Agreement]:
    """The int8 QDQ model of the f32 ONNX model at ``path`` (cached by model, data and method) and its
    agreement with the f32 model on the held-out samples; a CollageError where it exceeds ``max_drop``."""
    import onnx
    import onnxruntime as ort
    from onnxruntime import quantization as q

    model = onnx.load(str(path))
    batches = _batches(model, calibration.data)
    held = max(1, len(batches) // 4)
    calibrate, held_out = batches[:-held], batches[-held:]
    digest = hashlib.sha256(Path(path).read_bytes())
    digest.update(Path(calibration.data).read_bytes())
    digest.update(f"{calibration.method.value} {ort.__version__}".encode())
    out = cache_dir() / "int8" / f"{digest.hexdigest()[:32]}.onnx"
    if not out.is_file():

        class Reader(q.CalibrationDataReader):
            def __init__(self):
                self.items = iter(calibrate)

            def get_next(self):
                return next(self.items, None)

        method = {CalibrationMethod.MINMAX: q.CalibrationMethod.MinMax,
                  CalibrationMethod.PERCENTILE: q.CalibrationMethod.Percentile,
                  CalibrationMethod.ENTROPY: q.CalibrationMethod.Entropy}[calibration.method]
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
                                  calibrate_method=method)
        except Exception as exc:  # noqa: BLE001  the quantizer raises any type
            raise CollageError(f"ONNX Runtime's quantizer failed: {' '.join(str(exc).split())[:300]}",
                               where=str(path)) from None
        finally:
            root.setLevel(level)
        write_cache(out, tmp.read_bytes())
        tmp.unlink()
    agreement = _agreement(str(path), str(out), held_out)
    if calibration.max_drop is not None and agreement.top1_changed > calibration.max_drop:
        raise CollageError(f"{agreement.line()}: above --max-drop {calibration.max_drop:g}; nothing was built",
                           where=str(path))
    return out, agreement


def _agreement(f32: str, int8: str, held_out: list[dict[str, np.ndarray]]) -> Agreement:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    a, b = (ort.InferenceSession(p, options, providers=["CPUExecutionProvider"]) for p in (f32, int8))
    want = np.concatenate([a.run(None, feeds)[0] for feeds in held_out])
    got = np.concatenate([b.run(None, feeds)[0] for feeds in held_out])
    scale = float(np.abs(want).max()) or 1.0
    changed = float(np.mean(want.reshape(-1, want.shape[-1]).argmax(-1) != got.reshape(-1, got.shape[-1]).argmax(-1))) \
        if want.ndim and want.shape[-1] > 1 else 0.0
    return Agreement(want.reshape(-1, want.shape[-1]).shape[0] if want.ndim else 1, changed,
                     float(np.abs(got.astype(np.float64) - want).max()) / scale)
