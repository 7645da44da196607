"""JAX models written the way JAX users write them: NHWC activations, HWIO kernels, ``jax.nn`` activations,
batch norm in inference form (flax's ``BatchNorm(use_running_average=True)``), weights as seeded random
arrays closed over by the function (so ``jax.jit(f).lower(x)`` embeds them as constants, as a deployed
model does). Each builder returns ``(f, example_args)``. Builders with ``dtype="bf16"`` give the model as a JAX
user casts it to bf16: every weight and the image in bf16 (``ml_dtypes.bfloat16``).
"""

from __future__ import annotations

import numpy as np


def _numpy(dtype: str) -> np.dtype:
    from collage_runtime.types import NUMPY_DTYPES

    if dtype not in ("f32", "bf16"):
        raise ValueError(f"a JAX zoo model is f32 or bf16, not {dtype}")
    return NUMPY_DTYPES[dtype]


class _Weights:
    """Seeded He-scaled random weights, drawn in call order (in f32, then cast to ``dtype``)."""

    def __init__(self, seed: int = 0, dtype: str = "f32"):
        self.rng = np.random.default_rng(seed)
        self.dtype = _numpy(dtype)

    def __call__(self, *shape: int, fan_in: int | None = None) -> np.ndarray:
        fan = fan_in or int(np.prod(shape[:-1]))
        return (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan)).astype(np.float32).astype(self.dtype)

    def norm(self, c: int) -> tuple:
        """Batch-norm statistics and affine parameters, near identity (mean 0, variance 1)."""
        r = self.rng
        scale, bias, mean = 1 + 0.1 * r.standard_normal(c), 0.1 * r.standard_normal(c), 0.1 * r.standard_normal(c)
        return tuple(a.astype(np.float32).astype(self.dtype)
                     for a in (scale, bias, mean, 1 + 0.1 * np.abs(r.standard_normal(c))))

    def zeros(self, *shape: int) -> np.ndarray:
        return np.zeros(shape, self.dtype)

    def ones(self, *shape: int) -> np.ndarray:
        return np.ones(shape, self.dtype)


def _conv(x, k, stride=1, padding="SAME", groups=1):
    import jax

    return jax.lax.conv_general_dilated(x, k, (stride, stride), padding, dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        feature_group_count=groups)


def _batch_norm(x, p, eps=1e-5):
    import jax

    scale, bias, mean, var = p
    return (x - mean) * jax.lax.rsqrt(var + np.asarray(eps, var.dtype)) * scale + bias  # numpy makes bf16 + float f32


def _max_pool(x, window=3, stride=2):
    import jax
    import jax.numpy as jnp

    pad = ((0, 0), ((window - 1) // 2, window // 2), ((window - 1) // 2, window // 2), (0, 0))
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, window, window, 1), (1, stride, stride, 1), pad)


def _resnet_features(w: _Weights, blocks, bottleneck: bool, base: int):
    """``(features(x), channels)``: a ResNet's stem, max pool and stages (torchvision's v1.5 layout: the
    stride on the 3x3 conv), NHWC."""
    import jax

    stem = (w(7, 7, 3, base), w.norm(base))
    stages, cin = [], base
    for k, n in enumerate(blocks):
        planes = base * 2 ** k
        cout = planes * 4 if bottleneck else planes
        for b in range(n):
            stride = 2 if b == 0 and k > 0 else 1
            if bottleneck:
                convs = [(w(1, 1, cin, planes), w.norm(planes), 1), (w(3, 3, planes, planes), w.norm(planes), stride),
                         (w(1, 1, planes, cout), w.norm(cout), 1)]
            else:
                convs = [(w(3, 3, cin, planes), w.norm(planes), stride), (w(3, 3, planes, cout), w.norm(cout), 1)]
            proj = (w(1, 1, cin, cout), w.norm(cout)) if stride != 1 or cin != cout else None
            stages.append((convs, proj, stride))
            cin = cout

    def features(x):
        h = _max_pool(jax.nn.relu(_batch_norm(_conv(x, stem[0], 2), stem[1])))
        for convs, proj, stride in stages:
            y = h
            for i, (k, p, s) in enumerate(convs):
                y = _batch_norm(_conv(y, k, s), p)
                if i < len(convs) - 1:
                    y = jax.nn.relu(y)
            shortcut = h if proj is None else _batch_norm(_conv(h, proj[0], stride), proj[1])
            h = jax.nn.relu(y + shortcut)
        return h

    return features, cin


def _image(batch: int, image: int, seed: int, dtype: str = "f32") -> tuple:
    rng = np.random.default_rng(seed + 1)
    return (rng.standard_normal((batch, image, image, 3)).astype(np.float32).astype(_numpy(dtype)),)


def resnet(blocks=(2, 2, 2, 2), bottleneck: bool = False, base: int = 64, classes: int = 1000, image: int = 224,
           batch: int = 1, seed: int = 0, dtype: str = "f32"):
    """ResNet-18 (basic blocks ``(2, 2, 2, 2)``) or ResNet-50 (``bottleneck``, ``(3, 4, 6, 3)``), NHWC,
    log-softmax over the classes."""
    import jax
    import jax.numpy as jnp

    w = _Weights(seed, dtype)
    features, cin = _resnet_features(w, blocks, bottleneck, base)
    head = (w(cin, classes, fan_in=cin * 64), w.zeros(classes))  # logits of order 1

    def f(x):
        return jax.nn.log_softmax(jnp.mean(features(x), axis=(1, 2)) @ head[0] + head[1])

    return f, _image(batch, image, seed, dtype)


def _layer_norm(x, p, eps=1e-6):
    import jax
    import jax.numpy as jnp

    scale, bias = p
    mean = jnp.mean(x, -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(jnp.var(x, -1, keepdims=True) + eps) * scale + bias


def _encoder_layer(w: _Weights, d: int, mlp: int):
    """Weights of one transformer encoder layer (fused QKV, as flax's attention with ``qkv_features``)."""
    ones, zeros = w.ones(d), w.zeros(d)
    return {"qkv": w(d, 3 * d), "qkv_b": w.zeros(3 * d), "out": w(d, d), "out_b": zeros,
            "ln1": (ones, zeros), "ln2": (ones, zeros), "fc1": w(d, mlp), "fc1_b": w.zeros(mlp),
            "fc2": w(mlp, d), "fc2_b": zeros}


def _attention(x, p, heads: int, mask=None):
    import jax
    import jax.numpy as jnp

    b, s, d = x.shape
    qkv = (x @ p["qkv"] + p["qkv_b"]).reshape(b, s, 3, heads, d // heads)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // heads).astype(q.dtype)
    if mask is not None:
        logits = jnp.where(mask[:, None, None, :], logits, jnp.finfo(logits.dtype).min)
    a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v).reshape(b, s, d)
    return a @ p["out"] + p["out_b"]


def _mlp(x, p, gelu_approximate: bool):
    import jax

    return jax.nn.gelu(x @ p["fc1"] + p["fc1_b"], approximate=gelu_approximate) @ p["fc2"] + p["fc2_b"]


def vit(image: int = 224, patch: int = 16, d: int = 768, layers: int = 12, heads: int = 12, mlp: int = 3072,
        classes: int = 1000, batch: int = 1, seed: int = 0, dtype: str = "f32"):
    """ViT-B/16 as flax's reference implementation: patch embedding as a strided NHWC convolution, class
    token, learned position embedding, pre-norm encoder layers, head on the class token."""
    import jax.numpy as jnp

    w = _Weights(seed, dtype)
    embed = (w(patch, patch, 3, d), w.zeros(d))
    tokens = (image // patch) ** 2
    cls, pos = ((w(*shape, fan_in=d) * 0.02).astype(w.dtype) for shape in ((1, 1, d), (1, tokens + 1, d)))
    blocks = [_encoder_layer(w, d, mlp) for _ in range(layers)]
    norm, head = (w.ones(d), w.zeros(d)), w(d, classes)

    def f(x):
        h = _conv(x, embed[0], patch, "VALID") + embed[1]
        h = h.reshape(h.shape[0], -1, d)
        h = jnp.concatenate([jnp.broadcast_to(cls, (h.shape[0], 1, d)), h], axis=1) + pos
        for p in blocks:
            h = h + _attention(_layer_norm(h, p["ln1"]), p, heads)
            h = h + _mlp(_layer_norm(h, p["ln2"]), p, gelu_approximate=False)
        return _layer_norm(h, norm)[:, 0] @ head

    return f, _image(batch, image, seed, dtype)


def bert_encoder(seq: int = 128, d: int = 768, layers: int = 12, heads: int = 12, mlp: int = 3072,
                 vocab: int = 30522, batch: int = 1, seed: int = 0, dtype: str = "f32"):
    """A BERT-base encoder: token, position and type embeddings, post-norm layers with an attention mask
    from the input (padding), tanh GELU as BERT's TF/JAX ports use."""
    import jax.numpy as jnp

    w = _Weights(seed, dtype)
    tok, posn, typ = ((w(n, d, fan_in=d) * 0.02).astype(w.dtype) for n in (vocab, 512, 2))
    ln0 = (w.ones(d), w.zeros(d))
    blocks = [_encoder_layer(w, d, mlp) for _ in range(layers)]

    def f(ids, mask):
        h = jnp.take(tok, ids, axis=0) + posn[None, : ids.shape[1]] + typ[0]
        h = _layer_norm(h, ln0, 1e-12)
        for p in blocks:
            h = _layer_norm(h + _attention(h, p, heads, mask), p["ln1"], 1e-12)
            h = _layer_norm(h + _mlp(h, p, gelu_approximate=True), p["ln2"], 1e-12)
        return h

    rng = np.random.default_rng(seed + 1)
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    mask = np.ones((batch, seq), bool)
    mask[:, seq - seq // 8:] = False  # the last eighth is padding
    return f, (ids, mask)


def lstm(steps: int = 64, features: int = 128, hidden: int = 256, layers: int = 2, classes: int = 10,
         batch: int = 1, seed: int = 0):
    """A stacked LSTM over ``lax.scan`` (a ``stablehlo.while`` per layer), then a classifier on the last
    state. Each loop is one region candidate as a whole (XLA; ORT and OpenVINO as an ONNX ``Loop``)."""
    import jax
    import jax.numpy as jnp

    w = _Weights(seed)
    cells = []
    for k in range(layers):
        n_in = features if k == 0 else hidden
        cells.append((w(n_in, 4 * hidden), w(hidden, 4 * hidden, fan_in=4 * hidden), np.zeros(4 * hidden, np.float32)))
    head = w(hidden, classes)

    def f(x):  # (batch, steps, features)
        h_seq = jnp.swapaxes(x, 0, 1)
        for wi, wh, bias in cells:
            xs = h_seq @ wi + bias  # the input projection of every step at once, as flax's OptimizedLSTMCell

            def step(carry, xt, wh=wh):
                c, h = carry
                i, g, fg, o = jnp.split(xt + h @ wh, 4, axis=-1)
                c = jax.nn.sigmoid(fg) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                h = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (c, h), h

            zeros = jnp.zeros((x.shape[0], hidden), x.dtype)
            _, h_seq = jax.lax.scan(step, (zeros, zeros), xs)
        return jax.nn.log_softmax(h_seq[-1] @ head)

    return f, (np.random.default_rng(seed + 1).standard_normal((batch, steps, features)).astype(np.float32),)


def detector(image: int = 224, base: int = 32, anchors: int = 9, top: int = 100, batch: int = 1, seed: int = 0):
    """A single-shot detector: a ResNet-style NHWC backbone (three stages), a per-location score and box
    head for ``anchors`` anchors, then the post-processing JAX users write: the ``top`` highest scores by
    ``lax.top_k``, their boxes gathered and decoded, and sorted by the kept boxes' area. The backbone
    suits a graph engine; the top-k, gathers and sort run on XLA, IREE and (as ``TopK``/``GatherElements``)
    the ONNX engines."""
    import jax
    import jax.numpy as jnp

    w = _Weights(seed)
    features, cin = _resnet_features(w, (1, 1, 1), False, base)
    score_k, box_k = w(3, 3, cin, anchors), w(3, 3, cin, 4 * anchors, fan_in=9 * cin * 16)

    def f(x):
        h = features(x)
        scores = jax.nn.sigmoid(_conv(h, score_k)).reshape(x.shape[0], -1)
        boxes = _conv(h, box_k).reshape(x.shape[0], -1, 4)
        values, idx = jax.lax.top_k(scores, top)
        picked = jnp.take_along_axis(boxes, idx[..., None], axis=1)
        xy, wh = picked[..., :2], jnp.exp(jnp.clip(picked[..., 2:], -4.0, 4.0))
        decoded = jnp.concatenate([xy - wh / 2, xy + wh / 2], axis=-1)
        area = wh[..., 0] * wh[..., 1] * (values > 0.05)
        order = jnp.argsort(-area, axis=-1)
        return jnp.take_along_axis(decoded, order[..., None], axis=1), jnp.take_along_axis(values, order, axis=1)

    return f, _image(batch, image, seed)


def mobilenet_v2(width: float = 1.0, classes: int = 1000, image: int = 224, batch: int = 1, seed: int = 0,
                 dtype: str = "f32"):
    """MobileNetV2 (inverted residuals: 1x1 expand, 3x3 depthwise as ``feature_group_count``, 1x1 project;
    ``jax.nn.relu6``; batch norm in inference form), NHWC, global average pool, log-softmax: as flax's and
    Keras's MobileNetV2 write it."""
    import jax
    import jax.numpy as jnp

    w = _Weights(seed, dtype)

    def ch(c: float) -> int:
        return max(8, int(c * width + 4) // 8 * 8)

    stem_c = ch(32)
    stem = (w(3, 3, 3, stem_c), w.norm(stem_c))
    blocks, cin = [], stem_c
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)):
        cout = ch(c)
        for k in range(n):
            hidden = cin * t
            expand = (w(1, 1, cin, hidden), w.norm(hidden)) if t != 1 else None
            depthwise = (w(3, 3, 1, hidden, fan_in=9), w.norm(hidden))
            blocks.append((expand, depthwise, (w(1, 1, hidden, cout), w.norm(cout)), s if k == 0 else 1,
                           cin == cout and (s if k == 0 else 1) == 1))
            cin = cout
    last = max(1280, ch(1280))  # as torchvision: never narrower than 1280
    top = (w(1, 1, cin, last), w.norm(last))
    head = (w(last, classes, fan_in=last // 4), w.zeros(classes))  # logits of a few units

    def f(x):
        h = jax.nn.relu6(_batch_norm(_conv(x, stem[0], 2), stem[1]))
        for expand, (dk, dp), (pk, pp), stride, residual in blocks:
            y = h if expand is None else jax.nn.relu6(_batch_norm(_conv(h, expand[0]), expand[1]))
            y = jax.nn.relu6(_batch_norm(_conv(y, dk, stride, groups=y.shape[-1]), dp))
            y = _batch_norm(_conv(y, pk), pp)
            h = h + y if residual else y
        h = jax.nn.relu6(_batch_norm(_conv(h, top[0]), top[1]))
        return jax.nn.log_softmax(jnp.mean(h, axis=(1, 2)) @ head[0] + head[1])

    return f, _image(batch, image, seed, dtype)


def unet(image: int = 128, base: int = 32, depth: int = 3, classes: int = 2, batch: int = 1, seed: int = 0):
    """A segmentation U-Net: per level two 3x3 convs with ``jax.nn.silu``; down by max pooling (first level)
    and average pooling (the rest, a sum window over 4: flax's ``avg_pool``); up by ``lax.conv_transpose``
    (stride 2) and a skip concatenation; a 1x1 head, ``jax.image.resize`` bilinear to twice the input, softmax
    over the classes. NHWC."""
    import jax
    import jax.numpy as jnp

    w = _Weights(seed)
    widths = [base * 2 ** k for k in range(depth + 1)]
    down, cin = [], 3
    for c in widths:
        down.append((w(3, 3, cin, c), np.zeros(c, np.float32), w(3, 3, c, c), np.zeros(c, np.float32)))
        cin = c
    up = []
    for c in reversed(widths[:-1]):
        up.append((w(2, 2, cin, c), w(3, 3, 2 * c, c), np.zeros(c, np.float32), w(3, 3, c, c), np.zeros(c, np.float32)))
        cin = c
    head = w(1, 1, cin, classes)

    def block(x, k1, b1, k2, b2):
        return jax.nn.silu(_conv(jax.nn.silu(_conv(x, k1) + b1), k2) + b2)

    def f(x):
        skips, h = [], x
        for level, params in enumerate(down):
            if level == 1:
                h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
            elif level > 1:
                h = jax.lax.reduce_window(h, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4
            h = block(h, *params)
            skips.append(h)
        for (t, k1, b1, k2, b2), skip in zip(up, reversed(skips[:-1])):
            h = jax.lax.conv_transpose(h, t, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
            h = block(jnp.concatenate([h, skip], -1), k1, b1, k2, b2)
        logits = _conv(h, head)
        n, hh, ww, c = logits.shape
        return jax.nn.softmax(jax.image.resize(logits, (n, 2 * hh, 2 * ww, c), "bilinear"), axis=-1)

    return f, _image(batch, image, seed)
