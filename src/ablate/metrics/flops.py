"""FLOPs per token, MFU and HFU, peak FLOP/s (datasheet table and a measured GEMM probe).

Accounting (stated, since peers differ):
- N = matmul parameters of the transformer blocks (q, k, v, o, w1, w2, w3); the token embedding is a
  lookup and costs no FLOPs; the LM head (dim x vocab) is counted separately.
- Per token, forward = 2N + 2*head + attention; backward = 2x forward. So training = 6N + 6*head + attn.
- Attention: QK^T and AV each cost 2*seq*dim per token per layer in the forward, so 12*layers*dim*seq
  for training. We count the full seq x seq product (PaLM, torchtitan); we do NOT halve it for the
  causal mask (recent Megatron does), so our MFU is comparable to torchtitan's.
- MFU uses model FLOPs (the above). HFU adds what activation checkpointing recomputes: one more forward
  of each block (the article's 8N instead of 6N; attention 16 instead of 12), except each block's last
  matmul, which PyTorch's checkpoint does not redo (its output is not saved for backward); the LM head
  is not checkpointed. So HFU here is ~7.7N for Llama shapes: what the hardware really executes.
"""
from __future__ import annotations

import math
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch.utils.flop_counter import register_flop_formula

from ablate.config import ModelConfig
from ablate.hardware import for_device


def datasheet_peak(device_name: str, column: str) -> Optional[float]:
    """Dense peak FLOP/s for this device in a column (fp32 | bf16 | fp8: precision.Numerics.peak_column) of its
    conf/hardware file (hardware/: tensor-core bf16/fp16, fp8; fp32 the plain CUDA-core rate, which torch uses
    for fp32 matmuls by default), or None (with a warning) when it has none."""
    hw = for_device(device_name)
    peak = hw.peak_flops.get(column) if hw else None
    if peak is None:
        warnings.warn(f"no datasheet peak for {device_name!r} in {column}: no datasheet MFU "
                      "(set metrics.peak_tflops to give one)", stacklevel=2)
        return None
    return peak


@dataclass
class FlopsPerToken:
    model: float      # for MFU
    hardware: float   # for HFU (recompute included)


def ffn_matmul_params(cfg: ModelConfig, active: bool = True) -> int:
    """A block's feed-forward matmul parameters: the SwiGLU's; a mixture of experts' router and, active, the k
    experts a token is routed to (what its FLOPs see) or, not, every expert (what memory holds), and the shared
    ones."""
    if cfg.moe is None:
        return 3 * cfg.dim * cfg.ffn_hidden
    m = cfg.moe
    experts = m.top_k if active else m.experts
    return cfg.dim * m.experts + 3 * cfg.dim * (m.hidden or cfg.ffn_hidden) * (experts + m.shared_experts)


def ffn_w2_params(cfg: ModelConfig) -> int:
    """A block's last feed-forward matmul, per token (full recompute stops before it): w2; in a mixture, the shared
    experts' only (the routed experts' outputs are saved for the router weights' gradient: recomputed)."""
    if cfg.moe is None:
        return cfg.ffn_hidden * cfg.dim
    return (cfg.moe.hidden or cfg.ffn_hidden) * cfg.dim * cfg.moe.shared_experts


def block_matmul_params(cfg: ModelConfig, active: bool = True) -> int:
    head_dim = cfg.dim // cfg.n_heads
    attn = cfg.dim * head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    return cfg.n_layers * (attn + ffn_matmul_params(cfg, active))


def training_flops(cfg: ModelConfig, tokens: float, tokens_x_len: float) -> FlopsPerToken:
    """FLOPs to train on `tokens` tokens; `tokens_x_len` = sum over batches of tokens * sequence length
    (the attention term grows with the length, so batches of several lengths sum exactly)."""
    n = block_matmul_params(cfg)
    head = cfg.dim * cfg.vocab_size
    dense_fwd = 2 * (n + head) * tokens
    attn_fwd = 4 * cfg.n_layers * cfg.dim * tokens_x_len
    model = 3 * (dense_fwd + attn_fwd)
    return FlopsPerToken(model=float(model), hardware=float(model + recompute_flops(cfg, tokens, attn_fwd)))


def recompute_flops(cfg: ModelConfig, tokens: float, attn_fwd: float) -> float:
    """What model.activation_checkpointing redoes in backward (model/checkpointing.py). Every block: its forward
    but its last matmul - non-reentrant checkpointing stops recomputing once every saved tensor backward needs is
    back (torch.utils.checkpoint "early stop", on by default), so w2 is not redone. Every k-th block: that share of
    it. Selective: the matmuls whose outputs it drops, every second of a block's seven (wk, wo, w3), and attention
    only when it is spelled out as matmuls (attention=math: SDPA's output is kept)."""
    mode, layers = cfg.activation_checkpointing, cfg.n_layers
    if not mode:
        return 0.0
    head_dim = cfg.dim // cfg.n_heads
    if mode == "selective":
        dropped = cfg.dim * cfg.n_kv_heads * head_dim + cfg.n_heads * head_dim * cfg.dim + cfg.dim * cfg.ffn_hidden
        return 2.0 * layers * dropped * tokens + (attn_fwd if cfg.attention == "math" else 0.0)
    w2 = layers * ffn_w2_params(cfg)
    whole = 2 * (block_matmul_params(cfg) - w2) * tokens + attn_fwd
    share = 1.0 if mode is True else -(-layers // mode) / layers   # blocks 0, k, 2k, ... of the layers
    return whole * share


def full_recompute_flops(cfg: ModelConfig, tokens: float, tokens_x_len: float) -> float:
    """The article's 8N rule applied to this model's shape: training FLOPs plus one more forward of every
    block (all its matmuls and attention); the LM head is not checkpointed. What C1 "expects here"."""
    fwd_blocks = 2 * block_matmul_params(cfg) * tokens + 4 * cfg.n_layers * cfg.dim * tokens_x_len
    return training_flops(cfg, tokens, tokens_x_len).model + fwd_blocks


# Published MFU figures differ by what they count, so the summary gives each (`mfu_conventions`):
#   6N              matmul parameters only (blocks + LM head): the Kaplan et al. 2020 rule, no attention
#   6N+attn_full    + the full seq x seq attention products: PaLM (Chowdhery et al. 2022, appendix B),
#                   torchtitan, llm-foundry, nanoGPT; ablate's own `mfu`
#   6N+attn_causal  attention halved for the causal mask: Megatron-LM (num_floating_point_operations)
#   8N_hardware     + what activation checkpointing recomputes (the article's 8N; ablate's `hfu`)
MFU_CONVENTION = "6N+attn_full"
# The best published bf16 dense MFU: Megatron-Core "up to 47% MFU on H100 clusters" (GPT-3 175B, its
# performance docs). A figure above it gets a second look (the peak, the FLOP count); it is never clamped.
BEST_PUBLISHED_MFU = 0.47


def conventions(cfg: ModelConfig, tokens: float, tokens_x_len: float) -> Dict[str, float]:
    """FLOPs per token under each convention above, for these tokens (mean sequence length from
    tokens_x_len, as training_flops has it)."""
    fl = training_flops(cfg, tokens, tokens_x_len)
    dense = 6.0 * (block_matmul_params(cfg) + cfg.dim * cfg.vocab_size)
    attention = fl.model / tokens - dense
    return {"6N": dense, "6N+attn_full": fl.model / tokens, "6N+attn_causal": dense + attention / 2,
            "8N_hardware": fl.hardware / tokens}


@dataclass
class FlopModel:
    """FLOPs to train any model: `training(tokens, tokens_x_len)` = per_token * tokens + per_token_len *
    tokens_x_len (a transformer's FLOPs are linear in the tokens plus its attention's term in the length).
    The built-in Llama's comes from the formula above; any other model's is counted by torch's FLOP counter
    on the meta device (`counted`), once at set-up. `source` says which."""
    per_token: float               # model FLOPs per token independent of the length (the matmuls)
    per_token_len: float           # per token and unit of sequence length (attention's products)
    hw_per_token: float            # the same with activation checkpointing's recompute (HFU)
    hw_per_token_len: float
    matmul_params: int             # N of the 6N convention: parameters used in matmuls (LM head included)
    source: str
    llama: Optional[ModelConfig] = None   # the built-in model's config, for the formula's own figures

    @classmethod
    def analytic(cls, cfg: ModelConfig) -> "FlopModel":
        one, quad = training_flops(cfg, 1, 0), training_flops(cfg, 0, 1)
        return cls(one.model, quad.model, one.hardware, quad.hardware,
                   block_matmul_params(cfg) + cfg.dim * cfg.vocab_size, ANALYTIC, cfg)

    @classmethod
    def fitted(cls, counts: Dict[int, Tuple[float, float]], matmul_params: int, source: str = "") -> "FlopModel":
        """From counted training FLOPs of one sequence at two lengths, {length: (model, hardware)}:
        F(L) = a L + b L^2 solved for (a, b)."""
        (l1, c1), (l2, c2) = sorted(counts.items())[-1], sorted(counts.items())[0]

        def solve(i: int) -> Tuple[float, float]:
            f1, f2 = c1[i] / l1, c2[i] / l2
            b = (f1 - f2) / (l1 - l2) if l1 != l2 else 0.0
            return f1 - b * l1, b
        (a, b), (ha, hb) = solve(0), solve(1)
        return cls(a, b, ha, hb, matmul_params, source or COUNTED)

    def training(self, tokens: float, tokens_x_len: float) -> FlopsPerToken:
        return FlopsPerToken(model=self.per_token * tokens + self.per_token_len * tokens_x_len,
                             hardware=self.hw_per_token * tokens + self.hw_per_token_len * tokens_x_len)

    def conventions(self, tokens: float, tokens_x_len: float) -> Dict[str, float]:
        if self.llama is not None:
            return conventions(self.llama, tokens, tokens_x_len)
        fl = self.training(tokens, tokens_x_len)
        dense = 6.0 * self.matmul_params
        attention = fl.model / tokens - dense
        return {"6N": dense, "6N+attn_full": fl.model / tokens, "6N+attn_causal": dense + attention / 2,
                "8N_hardware": fl.hardware / tokens}

    def full_recompute(self, tokens: float, tokens_x_len: float) -> float:
        """The article's 8N rule: training plus one more forward. Exact per block for the built-in Llama
        (its LM head is not checkpointed); for any other model, 8/6 of the model FLOPs."""
        if self.llama is not None:
            return full_recompute_flops(self.llama, tokens, tokens_x_len)
        return self.training(tokens, tokens_x_len).model * 8 / 6

    def six_n(self) -> float:
        """6 x the matmul parameters of the blocks (built-in Llama) or of the whole model (any other)."""
        return 6.0 * (block_matmul_params(self.llama) if self.llama is not None else self.matmul_params)


def grouped_mm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of torch's grouped matmul (aten._grouped_mm: a mixture of experts' tokens, each row through its own
    expert's matrix), which torch's FLOP counter has no formula for. Each output element is a dot product over the
    inner dim, except a 2-D x 2-D product grouped along the inner dim (the experts' weight gradients), whose
    groups split that dim: 2·K·M·N in all."""
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    return 2 * math.prod(out_shape) * a_shape[-1]


if hasattr(torch.ops.aten, "_grouped_mm"):   # counted by every FlopCounterMode in this process from here on
    register_flop_formula(torch.ops.aten._grouped_mm)(grouped_mm_flops)


ANALYTIC = "analytic: the built-in Llama's formula (metrics/flops.py)"
COUNTED = "counted: torch.utils.flop_counter on the meta device, at train.seq_len and half of it"
COUNTED_REAL = ("counted: torch.utils.flop_counter on one real sequence in the run's dtype, at train.seq_len and half "
                "of it; activation checkpointing's recompute not told apart (the meta device cannot run this model)")


def utilization(tokens_per_s_per_device: float, flops: float, peak_flops: Optional[float]) -> Optional[float]:
    """Achieved FLOP/s over peak FLOP/s; None when there is no peak to compare with."""
    if not peak_flops:
        return None
    return tokens_per_s_per_device * flops / peak_flops


def gemm_probe(device: torch.device, dtype: torch.dtype, n: int, repeats: int = 10,
               warmup: int = 3) -> Tuple[float, float]:
    """This machine's matmul rate: the median of `repeats` n x n x n products after `warmup` ones (thread
    pools, clocks and caches settle). On CUDA the products run back to back, timed by CUDA events (a host
    clock around one ~1 ms GEMM with a sync would time the launch and the sync too). Returns (FLOP/s,
    seconds spent)."""
    started = time.perf_counter()
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    if device.type == "cuda":
        seconds = _cuda_gemm_seconds(a, b, repeats, warmup)
    else:
        times = []
        for i in range(repeats + warmup):
            t0 = time.perf_counter()
            torch.mm(a, b)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        seconds = statistics.median(times)
    del a, b
    if device.type == "cuda":   # the probe's buffers must not count as the run's memory or fragmentation
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return 2 * n**3 / seconds, time.perf_counter() - started


def _cuda_gemm_seconds(a: torch.Tensor, b: torch.Tensor, repeats: int, warmup: int) -> float:
    """Seconds per product: 5 batches of `repeats` back-to-back products between two CUDA events, median."""
    for _ in range(warmup):
        torch.mm(a, b)
    per_product = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            torch.mm(a, b)
        end.record()
        end.synchronize()
        per_product.append(start.elapsed_time(end) / 1e3 / repeats)
    return statistics.median(per_product)
