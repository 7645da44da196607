"""Validation: a candidate's outputs against the reference outputs of the same region."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from collage_runtime.types import is_float


@dataclass(frozen=True)
class Check:
    """Whether outputs match (see ``compare``), with the largest absolute error and the largest error
    relative to the output's scale and, when not, why."""

    ok: bool
    max_abs: float
    max_rel: float
    message: str = ""


#: The least relative tolerance (of the output's scale) a half-precision output is checked with, whatever
#: the backends state: each op rounds to 2^-11 (f16) or 2^-8 (bf16), and a whole model's roundings add up.
#: A full BERT-base in f16 on an H200: IREE CUDA alone 2.4e-3 from IREE CPU, Triton's GEMMs 2.7e-3, torch
#: eager 1.8e-3; a tolerance of f32 (1e-4) called IREE alone wrong and let the tune drop it.
HALF_RTOL = {"float16": 1e-2, "bfloat16": 5e-2}


#: The least relative tolerance (of the output's scale) of a region or plan holding a ``uniform_quantize``:
#: a value near a rounding boundary moves by one quantization step under another accumulation order, and
#: steps compound through the layers. ResNet-50 int8 (QDQ, per-channel), against IREE's f32 arithmetic of
#: the same model: ONNX Runtime's int8 kernels 7.7 % of the output's scale, OpenVINO's 16 %. A layout or
#: indexing bug still misses by O(scale); the accuracy a user states is checked on held-out data besides.
QUANT_RTOL = 0.25


#: A model computing in bf16 rounds at every op, and a deep one far beyond ``HALF_RTOL``: torch's ResNet-50 cast
#: to bf16 gives, as the largest error relative to the output's scale from its exact arithmetic (bf16 computed in
#: f32), IREE 0.092, ONNX Runtime 0.095, OpenVINO in bf16 0.105, XLA 0.088, torch's own bf16 eager 0.117; each is
#: 0.08-0.11 from IREE's. So where the exact arithmetic is given, an output is also right within BF16_SLACK times
#: the reference's own distance from it (at least the tolerance): the largest ratio measured was 3.6 (ONNX Runtime
#: on the zoo's small ResNet in bf16: 0.052, IREE 0.0145; `studies/numerics/bf16_reference.py`). A layout or
#: indexing bug still misses by O(scale). The slack stops at ``QUANT_RTOL`` (a quarter of the scale is never rounding):
#: IREE's own bf16 run can be far off (a VGG-style CNN with batch norm cast to bf16: 0.45 of scale from its exact
#: arithmetic, where torch's bf16 eager is 0.0015), and 4 times that would pass anything.
BF16_SLACK = 4.0


def compare(outputs: Sequence[np.ndarray], references: Sequence[np.ndarray], rtol: float, atol: float,
            exact: Sequence[np.ndarray] | None = None) -> Check:
    """Compares ``outputs`` with ``references`` elementwise under ``|out - ref| <= atol + rtol * scale``
    (``rtol`` at least ``HALF_RTOL`` for a half-precision reference),
    where ``scale`` is the largest ``|ref|`` of that output: a sum that cancels to near zero carries the
    rounding error of its large terms, so an error relative to each element would reject every correct
    backend that sums in another order, while layout or indexing bugs still miss by O(scale). NaNs must
    sit where the reference has them; integer and boolean outputs must be equal. With ``exact`` (the
    model's exact arithmetic, for a model computing in bf16), a float output is also right within
    ``BF16_SLACK`` times the reference's own distance from it."""
    if len(outputs) != len(references):
        return Check(False, np.inf, np.inf, f"{len(outputs)} outputs, the reference has {len(references)}")
    max_abs = max_rel = 0.0
    problem = ""
    for k, (out, ref) in enumerate(zip(outputs, references)):
        out, ref = np.asarray(out), np.asarray(ref)
        if out.shape != ref.shape:
            return Check(False, np.inf, np.inf, f"output {k} has shape {list(out.shape)}, expected {list(ref.shape)}")
        if out.size == 0:
            continue
        if not (is_float(ref.dtype) or ref.dtype.kind == "c"):
            bad = int(np.count_nonzero(out != ref))
            if bad:
                max_abs = np.inf
                problem = problem or f"output {k}: {bad} of {ref.size} elements differ"
            continue
        tol = max(rtol, HALF_RTOL.get(ref.dtype.name, 0.0))
        diff, scale, bad = _errors(out, ref, tol, atol)
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float(diff.max()) / scale if scale > 0 else (0.0 if diff.max() == 0 else np.inf))
        if not bad:
            continue
        line = (f"output {k}: {bad} of {ref.size} elements beyond rtol={tol:g} atol={atol:g} "
                f"(max abs error {float(diff.max()):.3g})")
        if exact is not None:
            own, exact_scale, _ = _errors(ref, exact[k], 0.0, 0.0)
            slack = max(tol, min(BF16_SLACK * float(own.max()) / exact_scale if exact_scale > 0 else tol, QUANT_RTOL))
            if not _errors(out, exact[k], slack, atol)[2]:
                continue
            line += f", and beyond rtol={slack:g} of its exact arithmetic"
        problem = problem or line
    return Check(not problem, max_abs, max_rel, problem)


def _errors(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> tuple[np.ndarray, float, int]:
    """``|out - ref|`` elementwise (0 where equal, NaN against NaN included; inf where only one is NaN), the
    largest finite ``|ref|`` and how many elements lie beyond ``atol + rtol * scale``."""
    o, r = np.asarray(out).astype(np.float64), np.asarray(ref).astype(np.float64)
    same = (o == r) | (np.isnan(o) & np.isnan(r))  # equal infinities too
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(o - r))
    diff = np.where(np.isnan(diff), np.inf, diff)
    finite = np.abs(r[np.isfinite(r)])
    scale = float(finite.max()) if finite.size else 0.0
    return diff, scale, int(np.count_nonzero(diff > atol + rtol * scale))
