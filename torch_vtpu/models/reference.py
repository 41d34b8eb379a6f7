"""Small reference models for parity tests: each exercises a different family of
ops (dense + activations, convolution + batch norm, recurrent cells)."""
from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, in_features: int = 32, hidden: int = 64, out_features: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.LayerNorm(hidden),
            nn.ReLU(),
            nn.Linear(hidden, out_features),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNNClassifier(nn.Module):
    """Two conv + BatchNorm2d + ReLU + pooling stages and a linear head (images 1x16x16 by default).

    The convolutions have no bias, as usual before BatchNorm: BN's shift makes a bias
    redundant, its gradient is zero up to rounding, and AdamW would turn that rounding
    noise into full-size steps (so two backends that differ in the last bit would train
    visibly different biases and running means).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 8):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class LSTMClassifier(nn.Module):
    """Embedding -> 2-layer LSTM -> linear head on the last time step."""

    def __init__(self, vocab_size: int = 50, embed: int = 16, hidden: int = 32, num_classes: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1, :])
