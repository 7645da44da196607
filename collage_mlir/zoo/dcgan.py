"""The DCGAN generator (Radford et al.; PyTorch's dcgan example): latent 100x1x1 → 3x64x64 through
transposed convolutions, batch norm and ReLU, tanh at the end."""

from __future__ import annotations

from torch import nn


class Generator(nn.Module):
    def __init__(self, nz: int = 100, ngf: int = 64, nc: int = 3):
        super().__init__()
        layers: list[nn.Module] = []
        cin = nz
        for k, mult in enumerate((8, 4, 2, 1)):
            cout = ngf * mult
            layers += [nn.ConvTranspose2d(cin, cout, 4, 1 if k == 0 else 2, 0 if k == 0 else 1, bias=False),
                       nn.BatchNorm2d(cout), nn.ReLU(True)]
            cin = cout
        layers += [nn.ConvTranspose2d(cin, nc, 4, 2, 1, bias=False), nn.Tanh()]
        self.main = nn.Sequential(*layers)

    def forward(self, z):
        return self.main(z)
