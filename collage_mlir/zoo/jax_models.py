"""JAX models written the way JAX users write them: NHWC activations, HWIO kernels, ``jax.nn`` activations,
batch norm in inference form (flax's ``BatchNorm(use_running_average=True)``), weights as seeded random
arrays closed over by the function (so ``jax.jit(f).lower(x)`` embeds them as constants, as a deployed
model does). Each builder returns ``(f, example_args)``.
"""

from __future__ import annotations

import numpy as np


class _Weights:
    """Seeded He-scaled random weights, drawn in call order."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def __call__(self, *shape: int, fan_in: int | None = None) -> np.ndarray:
        fan = fan_in or int(np.prod(shape[:-1]))
        return (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan)).astype(np.float32)

    def norm(self, c: int) -> tuple:
        """Batch-norm statistics and affine parameters, near identity (mean 0, variance 1)."""
        r = self.rng
        return tuple(a.astype(np.float32) for a in (1 + 0.1 * r.standard_normal(c), 0.1 * r.standard_normal(c),
                                                     0.1 * r.standard_normal(c), 1 + 0.1 * np.abs(r.standard_normal(c))))


def _conv(x, k, stride=1, padding="SAME", groups=1):
    import jax

    return jax.lax.conv_general_dilated(x, k, (stride, stride), padding, dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        feature_group_count=groups)


def _batch_norm(x, p, eps=1e-5):
    import jax

    scale, bias, mean, var = p
    return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


def _max_pool(x, window=3, stride=2):
    import jax
    import jax.numpy as jnp

    pad = ((0, 0), ((window - 1) // 2, window // 2), ((window - 1) // 2, window // 2), (0, 0))
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, window, window, 1), (1, stride, stride, 1), pad)


def resnet(blocks=(2, 2, 2, 2), bottleneck: bool = False, base: int = 64, classes: int = 1000, image: int = 224,
           batch: int = 1, seed: int = 0):
    """ResNet-18 (basic blocks ``(2, 2, 2, 2)``) or ResNet-50 (``bottleneck``, ``(3, 4, 6, 3)``), NHWC."""
    import jax
    import jax.numpy as jnp

    w = _Weights(seed)
    stem = (w(7, 7, 3, base), w.norm(base))
    stages, cin = [], base
    for k, n in enumerate(blocks):
        planes = base * 2 ** k
        cout = planes * 4 if bottleneck else planes
        for b in range(n):
            stride = 2 if b == 0 and k > 0 else 1
            if bottleneck:
                convs = [(w(1, 1, cin, planes), w.norm(planes)), (w(3, 3, planes, planes), w.norm(planes)),
                         (w(1, 1, planes, cout), w.norm(cout))]
            else:
                convs = [(w(3, 3, cin, planes), w.norm(planes)), (w(3, 3, planes, cout), w.norm(cout))]
            proj = (w(1, 1, cin, cout), w.norm(cout)) if stride != 1 or cin != cout else None
            stages.append((convs, proj, stride))
            cin = cout
    head = (w(cin, classes), np.zeros(classes, np.float32))

    def f(x):
        h = jax.nn.relu(_batch_norm(_conv(x, stem[0], 2), stem[1]))
        h = _max_pool(h)
        for convs, proj, stride in stages:
            y = h
            for i, (k, p) in enumerate(convs):
                # torchvision's v1.5: the stride sits on the 3x3 conv (the first of a basic block)
                s = stride if (i == 1 if bottleneck else i == 0) else 1
                y = _batch_norm(_conv(y, k, s), p)
                if i < len(convs) - 1:
                    y = jax.nn.relu(y)
            shortcut = h if proj is None else _batch_norm(_conv(h, proj[0], stride), proj[1])
            h = jax.nn.relu(y + shortcut)
        return jax.nn.log_softmax(jnp.mean(h, axis=(1, 2)) @ head[0] + head[1])

    return f, (np.random.default_rng(seed + 1).standard_normal((batch, image, image, 3)).astype(np.float32),)
