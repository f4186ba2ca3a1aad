"""The measurement math, on hand-checked numbers and against independent counts."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ablate.config import ModelConfig, validate
from ablate.metrics import flops as F
from ablate.metrics.memory import fragmentation
from ablate.model import build_model
from conftest import compose_cfg

SIZES = ["tiny", "small", "1b", "8b", "70b"]


def counted_training_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> int:
    """FlopCounterMode over one forward+backward of the math-attention model (meta tensors: no memory)."""
    cfg.attention = "math"
    model = build_model(cfg, "meta")
    x = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        model(x, x).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_analytic_flops_match_the_flop_counter_within_1_percent(size, checkpointing):
    cfg = validate(compose_cfg([f"model={size}", f"model.activation_checkpointing={checkpointing}"])).model
    seq = 128
    counted = counted_training_flops(cfg, seq)
    analytic = F.training_flops(cfg, seq, seq * seq)
    expected = analytic.hardware   # the counter sees what runs: recompute included
    assert abs(counted - expected) / expected < 0.01, (size, counted, expected)


def test_tiny_flops_by_hand():
    # tiny: dim 64, 2 layers, 4 heads (head_dim 16), 2 kv heads, ffn 192, vocab 256
    cfg = ModelConfig()
    n = 2 * (64 * 16 * (2 * 4 + 2 * 2) + 3 * 64 * 192)   # = 2 * (12288 + 36864) = 98304
    assert F.block_matmul_params(cfg) == n == 98304
    seq = 64
    per_token = F.flops_per_token(cfg, seq)
    assert per_token.model == 6 * 98304 + 6 * 64 * 256 + 12 * 2 * 64 * 64 == 786432
    assert per_token.hardware == per_token.model
    ckpt = F.flops_per_token(ModelConfig(activation_checkpointing=True), seq)
    assert ckpt.model == 786432                            # MFU never counts the recompute
    # + a recomputed forward of each block (the article's 8N) less w2 (2 x 64 x 192 per layer), not redone
    assert ckpt.hardware == 786432 + 2 * (98304 - 2 * 64 * 192) + 4 * 2 * 64 * 64 == 966656


def test_mfu_and_hfu_on_hand_checked_numbers():
    # 1000 tokens/s/device x 786432 FLOP/token = 786.432 MFLOP/s against a 1 GFLOP/s peak
    assert F.utilization(1000, 786432, 1e9) == pytest.approx(0.786432)
    assert F.utilization(1000, 966656, 1e9) == pytest.approx(0.966656)
    assert F.utilization(1000, 786432, None) is None


def test_peak_table_and_unknown_devices():
    assert F.datasheet_peak("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert F.datasheet_peak("NVIDIA H100 PCIe", "bf16") == 756e12
    assert F.datasheet_peak("NVIDIA H200", "fp8") == 1979e12
    assert F.datasheet_peak("NVIDIA A100-SXM4-80GB", "fp16") == 312e12
    assert F.datasheet_peak("NVIDIA B200", "bf16") == 2250e12
    with pytest.warns(UserWarning, match="no datasheet peak"):
        assert F.datasheet_peak("NVIDIA GeForce RTX 4090", "bf16") is None   # never another device's peak


def test_fragmentation_from_hand_made_stats():
    gib = 2**30
    stats = {"active_bytes.all.peak": 48 * gib, "reserved_bytes.all.peak": 100 * gib,
             "inactive_split_bytes.all.peak": 30 * gib}
    assert fragmentation(stats) == {"fragmentation": pytest.approx(0.52), "inactive_split_frac": pytest.approx(0.30)}
    tight = {"active_bytes.all.peak": 979, "reserved_bytes.all.peak": 1000, "inactive_split_bytes.all.peak": 0}
    assert fragmentation(tight)["fragmentation"] == pytest.approx(0.021)
    assert fragmentation({}) == {"fragmentation": None, "inactive_split_frac": None}


def test_gemm_probe_measures_something():
    rate, seconds = F.gemm_probe(torch.device("cpu"), torch.float32, 128)
    assert rate > 0 and seconds > 0
