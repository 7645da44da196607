"""Validation: a candidate's outputs against the reference outputs of the same region."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Check:
    """Whether outputs match (numpy ``allclose`` with the backend's tolerance, NaNs where the reference
    has them), with the largest absolute and relative errors and, when not, why."""

    ok: bool
    max_abs: float
    max_rel: float
    message: str = ""


def compare(outputs: Sequence[np.ndarray], references: Sequence[np.ndarray], rtol: float, atol: float) -> Check:
    """Compares ``outputs`` with ``references`` under ``|out - ref| <= atol + rtol * |ref|``."""
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
        if ref.dtype.kind not in "fc":
            bad = int(np.count_nonzero(out != ref))
            if bad:
                max_abs = np.inf
                problem = problem or f"output {k}: {bad} of {ref.size} elements differ"
            continue
        o, r = out.astype(np.float64), ref.astype(np.float64)
        both_nan = np.isnan(o) & np.isnan(r)
        diff = np.where(both_nan, 0.0, np.abs(o - r))
        diff = np.where(np.isnan(diff), np.inf, diff)
        rel = diff / np.maximum(np.abs(r), np.finfo(np.float32).tiny)
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float(np.where(diff == 0, 0.0, rel).max()))
        bad = int(np.count_nonzero(diff > atol + rtol * np.abs(np.nan_to_num(r))))
        if bad and not problem:
            problem = (f"output {k}: {bad} of {ref.size} elements beyond rtol={rtol:g} atol={atol:g} "
                       f"(max abs error {float(diff.max()):.3g})")
    return Check(not problem, max_abs, max_rel, problem)
