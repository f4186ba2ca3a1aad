"""SwiGLU, w2(silu(w1 x) * w3 x) (Shazeer 2020, arXiv 2002.05202): the built-in Llama's feed-forward and a mixture
of experts' shared experts."""
from __future__ import annotations

import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
