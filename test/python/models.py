"""Small models built in code (random weights) for the numerics tests."""

from __future__ import annotations

from collage_mlir.zoo.tiny import mlp, small_cnn  # noqa: F401  (shared with studies/)


def lstm(inputs: int = 8, hidden: int = 16):
    """A one-layer LSTM over the sequence and a linear head (its zero initial state is a splat constant)."""
    import torch
    from torch import nn

    class Lstm(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(inputs, hidden)
            self.head = nn.Linear(hidden, 4)

        def forward(self, x):
            y, _ = self.lstm(x)
            return self.head(y)

    torch.manual_seed(0)
    return Lstm().eval()


def branching():
    """Two branches of matmuls from one input, joined, with a residual: values fan out across regions."""
    import torch
    from torch import nn

    class Branching(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 32), nn.Linear(16, 32)
            self.c = nn.Linear(32, 16)

        def forward(self, x):
            h = torch.tanh(self.a(x)) * torch.sigmoid(self.b(x))
            return self.c(h) + x

    torch.manual_seed(0)
    return Branching().eval()
