"""The activations libraries and engines fuse, recognised from a function's values on probe points
(``classify``), whatever ops spell it: the backends' epilogue matcher (``backends.epilogue``) and the ONNX
simplification (``onnx.optimize``, GELU) both ask it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: The points ``classify`` compares a function on: dense over [-8, 8], and four far out.
PROBE = np.concatenate([np.linspace(-8.0, 8.0, 1601), [-30.0, -12.0, 12.0, 30.0]])


@dataclass(frozen=True)
class Activation:
    """A library activation: oneDNN's post-op name, its scalars and algorithm."""

    name: str
    scalars: tuple[float, ...] = ()
    algorithm: str = ""


def _gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_KNOWN = [
    (Activation("gelu", (), "none"), _gelu),
    (Activation("gelu", (), "tanh"), _gelu_tanh),
    (Activation("sigmoid"), _sigmoid),
    (Activation("swish"), lambda x: x * _sigmoid(x)),
    (Activation("tanh"), np.tanh),
    (Activation("hardswish"), lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0),
    (Activation("hardsigmoid"), lambda x: np.clip(x + 3.0, 0.0, 6.0) / 6.0),
]


def classify(f: np.ndarray, x: np.ndarray = PROBE, atol: float = 2e-6) -> Activation | None:
    """The activation whose values on ``x`` are ``f`` (within ``atol`` relative to scale), else None."""
    if not np.all(np.isfinite(f)):
        return None

    def close(ref: np.ndarray) -> bool:
        return bool(np.all(np.abs(f - ref) <= atol * np.maximum(1.0, np.abs(ref))))

    lo, hi = float(f[x.argmin()]), float(f[x.argmax()])
    if lo == 0.0 and close(np.maximum(x, 0.0)):
        return Activation("relu")
    if lo > x.min() and hi < x.max() and close(np.clip(x, lo, hi)):
        return Activation("hardtanh", (lo, hi))
    alpha = -float(f[np.argmin(np.abs(x + 1.0))])  # the slope left of zero, if piecewise linear
    if close(np.where(x < 0, alpha * x, x)):
        return Activation("leaky_relu", (alpha,))
    for act, ref in _KNOWN:
        if close(ref(x)):
            return act
    return None
