"""The built-in model (`model=tiny|small|1b|8b|70b|405b`): a Llama-style decoder: RMSNorm, RoPE, SwiGLU,
grouped-query attention, SDPA.

One screen per idea, nanoGPT style. `attention="math"` spells attention out as matmuls so that
torch.utils.flop_counter can count it (it does not count SDPA on the CPU).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ablate.config import ModelConfig
from ablate.model.moe import MoE
from ablate.model.swiglu import SwiGLU


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(head_dim: int, seq_len: int, theta: float, device=None):
    """cos/sin of the rotary angles, shape (seq_len, head_dim // 2)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate pairs (x[..., ::2], x[..., 1::2]) of x: (batch, heads, seq, head_dim)."""
    x1, x2 = x[..., ::2].float(), x[..., 1::2].float()
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.n_kv_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.math = cfg.attention == "math"
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        # heads as the projections give them: n_heads / tp of them under tensor parallelism (parallel/tp.py)
        q = self.wq(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        repeat = self.n_heads // self.n_kv_heads
        if not self.math:
            # grouped-query attention inside the fused kernel: no copies of k and v
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=repeat > 1)
            return self.wo(out.transpose(1, 2).reshape(b, t, -1))
        if repeat > 1:  # each kv head serves `repeat` query heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        out = scores.masked_fill(~mask, float("-inf")).softmax(-1).type_as(v) @ v
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        # a SwiGLU, or a mixture of SwiGLU experts (model/moe.py)
        self.feed_forward = MoE(cfg.dim, cfg.ffn_hidden, cfg.moe) if cfg.moe else SwiGLU(cfg.dim, cfg.ffn_hidden)

    def forward(self, x, cos, sin):
        # (model.activation_checkpointing wraps this per block, as for any model's blocks: model/checkpointing.py)
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(cfg.dim // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        """GPT-2 style init: N(0, 0.02); output projections scaled by 1/sqrt(2 * layers)."""
        if self.tok_embeddings.weight.is_meta:
            return
        for name, p in self.named_parameters():
            if p.dim() >= 2:   # (a mixture of experts' stacked weights: 3-D)
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("wo.weight", "w2.weight", "w2")) \
                    else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def aux_loss(self):
        """The experts' balance losses of the last forward, summed (None: a dense model's, or none asked)."""
        losses = [m.aux_loss for m in self.modules() if isinstance(m, MoE) and m.aux_loss is not None]
        return sum(losses) if losses else None

    def forward(self, tokens):
        t = tokens.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))
