"""Tiny models built in code (seeded random weights) for the tests and the studies: ``small_cnn``, ``mlp``
(each an ``nn.Module``), and ``resnet``/``encoder`` (each ``(nn.Module, example input)``: one bottleneck of a
ResNet, one BERT-style encoder layer; ``gemms``: every GEMM a kernel backend takes; ``chain2``/``chain8``: linear
chains whose difference prices one layer). Seconds to import, unlike the zoo's benchmark models."""

from __future__ import annotations


def small_cnn():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=4), nn.ReLU(),
        nn.Conv2d(16, 8, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10),
    ).eval()


def mlp():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5)).eval()


def resnet(width: int = 8):
    """Stem (conv 7x7/2, batch norm, relu, max pool), one bottleneck with a projection shortcut, head.
    Batch-norm statistics are randomised so folding them into the conv is visible in the numbers."""
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            cout = 4 * mid
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            return torch.relu(self.body(x) + self.down(x))

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                          nn.MaxPool2d(3, 2, 1), Bottleneck(width, width, 2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 10)).eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    return model, torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def encoder(vocab: int = 64, d: int = 32, heads: int = 2, layers: int = 1, seq: int = 16):
    """BERT-style: token, position and segment embeddings, layer norm, post-norm layers of masked
    attention (a boolean padding mask) and a GELU feed-forward."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)

        def forward(self, x, mask):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = self.n1(x + self.out(a.transpose(1, 2).reshape(b, t, d)))
            return self.n2(x + self.down(F.gelu(self.up(x))))

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos, self.seg = nn.Embedding(vocab, d), nn.Embedding(seq, d), nn.Embedding(2, d)
            self.norm = nn.LayerNorm(d)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, ids):
            x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))[None] + self.seg(torch.zeros_like(ids))
            x = self.norm(x)
            mask = (ids != 0)[:, None, None, :]  # padding tokens are id 0
            for layer in self.layers:
                x = layer(x, mask)
            return x

    torch.manual_seed(0)
    model = Encoder().eval()
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):  # not the identity affine of a fresh LayerNorm
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    # int32 ids: OpenVINO computes i64 in 32 bits and so takes i64 only from constants (test below).
    ids = torch.randint(1, vocab, (1, seq), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    ids[0, -3:] = 0
    return model, ids


def gemms(d: int = 64, tokens: int = 32):
    """Every GEMM shape a kernel backend takes, each once (``(nn.Module, example input)``): linear layers with
    a bias and each activation (ReLU, erf and tanh GELU, SiLU, sigmoid, tanh), without a bias, with a
    residual add, and batched matmuls of both operand layouts (attention's ``q @ k^T`` and ``p @ v``)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Gemms(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.ModuleList(nn.Linear(d, d) for _ in range(7))
            self.nobias = nn.Linear(d, 2 * d, bias=False)
            self.res = nn.Linear(2 * d, d)

        def forward(self, x):
            acts = (torch.relu, F.gelu, lambda v: F.gelu(v, approximate="tanh"), F.silu, torch.sigmoid,
                    torch.tanh, lambda v: v)
            for lin, act in zip(self.lin, acts):
                x = act(lin(x))
            x = x + self.res(self.nobias(x))
            q = x.view(x.shape[0], 4, d // 4).transpose(0, 1)      # 4 x tokens x d/4
            p = torch.softmax(q @ q.transpose(1, 2), dim=-1)        # w as n x k
            return (p @ q).transpose(0, 1).reshape(x.shape)        # w as k x n

    torch.manual_seed(0)
    return Gemms().eval(), torch.randn(tokens, d)


def chain2():
    """``chain(2)``: two linear layers (for per-layer costs against ``chain8``)."""
    return chain(2)


def chain8():
    """``chain(8)``: eight linear layers."""
    return chain(8)


def chain(layers: int, d: int = 256, tokens: int = 64):
    """``layers`` linear layers with ReLU, ``tokens`` x ``d`` (``(nn.Module, example input)``): one region a
    layer on a library or kernel backend, so programs of two lengths give a region's cost by difference."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(d, d), nn.ReLU())])
    return model.eval(), torch.randn(tokens, d)


def encoder_mid():
    """``encoder`` at width 256 (4 heads, 2 layers, 128 tokens, vocab 512): GEMMs big enough for a GPU to
    tell kernels apart, small enough (1.7 M weights) to carry to one."""
    return encoder(vocab=512, d=256, heads=4, layers=2, seq=128)
