"""The measurement math, on hand-checked numbers and against independent counts."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ablate.compose import validate
from ablate.config import ModelConfig
from ablate.metrics import flops as F
from ablate.metrics.memory import fragmentation
from ablate.model import build as build_model
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
    """Each size's own shapes (width, GQA, FFN, vocabulary) on two of its layers: every layer counts the same,
    and with fewer of them the embedding and the head weigh more in the total, not less (70b's 80 layers on
    the meta device were 13 s of the fast tier)."""
    cfg = validate(compose_cfg([f"model={size}", f"model.activation_checkpointing={checkpointing}",
                                "model.n_layers=2"])).model
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
    per_token = F.training_flops(cfg, 1, seq)
    assert per_token.model == 6 * 98304 + 6 * 64 * 256 + 12 * 2 * 64 * 64 == 786432
    assert per_token.hardware == per_token.model
    ckpt = F.training_flops(ModelConfig(activation_checkpointing=True), 1, seq)
    assert ckpt.model == 786432                            # MFU never counts the recompute
    # + a recomputed forward of each block (the article's 8N) less w2 (2 x 64 x 192 per layer), not redone
    assert ckpt.hardware == 786432 + 2 * (98304 - 2 * 64 * 192) + 4 * 2 * 64 * 64 == 966656
    # the article's 8N rule for this shape (C1's "expected here"): every block's forward redone, w2 too
    assert F.full_recompute_flops(cfg, 1, seq) == 786432 + 2 * 98304 + 4 * 2 * 64 * 64 == 1015808


def test_mfu_and_hfu_on_hand_checked_numbers():
    # 1000 tokens/s/device x 786432 FLOP/token = 786.432 MFLOP/s against a 1 GFLOP/s peak
    assert F.utilization(1000, 786432, 1e9) == pytest.approx(0.786432)
    assert F.utilization(1000, 966656, 1e9) == pytest.approx(0.966656)
    assert F.utilization(1000, 786432, None) is None


def test_peak_table_and_unknown_devices():
    assert F.datasheet_peak("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert F.datasheet_peak("NVIDIA H100 PCIe", "bf16") == 756e12
    assert F.datasheet_peak("NVIDIA H200", "fp8") == 1979e12
    assert F.datasheet_peak("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
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


def test_mfu_above_one_is_removed_and_kept_with_its_reason():
    from ablate.metrics.throughput import invalid_utilizations

    figures = {"mfu": 3.46, "hfu": 3.5, "mfu_vs_measured_peak": 0.4, "mfu_vs_datasheet_peak": None}
    invalid = invalid_utilizations(figures, "measured")
    assert figures["mfu"] is None and figures["hfu"] is None and figures["mfu_vs_measured_peak"] == 0.4
    assert invalid["mfu"]["value"] == 3.46 and "impossible" in invalid["mfu"]["reason"]


def test_the_peak_cache_is_shared_and_says_when(tmp_path):
    from ablate.metrics.peak import measured_peak

    cache = str(tmp_path / "peak.json")
    first = measured_peak(torch.device("cpu"), "cpu", torch.float32, 64, cache)
    second = measured_peak(torch.device("cpu"), "cpu", torch.float32, 64, cache)
    assert not first["reused"] and second["reused"] and second["flops"] == first["flops"]
    assert first["measured_at"] and "64x64x64 float32" in first["how"]
    other = measured_peak(torch.device("cpu"), "cpu", torch.bfloat16, 64, cache)
    assert not other["reused"]          # another dtype is another peak


def test_the_deepspeed_loss_scale_is_read_from_deepspeeds_own_scaler():
    from types import SimpleNamespace

    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    from ablate.config import PrecisionConfig
    from ablate.parallel.zero import deepspeed_loss_scale, fp16_section

    section = fp16_section(PrecisionConfig(name="fp16", init_scale=1024.0, growth_interval=7))
    assert section["initial_scale_power"] == 10 and section["loss_scale_window"] == 7
    scaler = DynamicLossScaler(init_scale=2 ** section["initial_scale_power"],
                               scale_window=section["loss_scale_window"], min_scale=section["min_loss_scale"],
                               delayed_shift=section["hysteresis"], consecutive_hysteresis=False)
    optimizer = SimpleNamespace(loss_scaler=scaler)      # where ZeRO's optimizers keep DeepSpeed's scaler
    assert deepspeed_loss_scale(optimizer) == 1024.0
    for _ in range(7):                                   # clean steps: the scale holds for the window (7)...
        scaler.update_scale(False)
    assert deepspeed_loss_scale(optimizer) == 1024.0
    scaler.update_scale(False)                           # ...and the step after it doubles (DeepSpeed's own rule)
    assert deepspeed_loss_scale(optimizer) == 2048.0


def test_gemm_probe_measures_something():
    rate, seconds = F.gemm_probe(torch.device("cpu"), torch.float32, 128)
    assert rate > 0 and seconds > 0


def test_nvml_follows_cuda_visible_devices():
    from ablate.nvml import nvml_device

    assert nvml_device(0, visible="") == 0                      # nothing hidden: torch's index is NVML's
    assert nvml_device(1, visible="3,5") == 5                   # torch's cuda:1 is physical GPU 5
    assert nvml_device(0, visible="GPU-8d1f-aa,GPU-77") == "GPU-8d1f-aa"   # by UUID


def test_more_local_ranks_than_gpus_is_refused_in_one_line():
    from ablate.config import ConfigError
    from ablate.train.distributed import check_ranks_fit_gpus

    check_ranks_fit_gpus(1, 1)
    with pytest.raises(ConfigError, match="launcher.nproc_per_node=2: this machine has 1 GPU"):
        check_ranks_fit_gpus(2, 1)


def test_the_deepspeed_config_for_optimizer_offload_keeps_a_torch_adamw():
    from ablate.config import ParallelConfig, PrecisionConfig, TrainConfig
    from ablate.parallel.zero import ds_config
    from ablate.precision import Precision

    fp32 = Precision(PrecisionConfig())
    cfg = ds_config(ParallelConfig(name="zero2", offload_optimizer=True), TrainConfig(), fp32, 2)
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert cfg["zero_force_ds_cpu_optimizer"] is False       # DeepSpeed 0.19 raises for a torch optimizer otherwise
    assert cfg["bf16"] == {"enabled": False} and cfg["fp16"] == {"enabled": False}


def test_variants_without_a_row_never_borrow_another_parts_peak():
    for name in ("NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GB200"):
        with pytest.warns(UserWarning, match="no datasheet peak"):
            assert F.datasheet_peak(name, "bf16") is None
    assert F.datasheet_peak("NVIDIA H200", "bf16") == 989e12       # the SXM part keeps its row


def test_mfu_conventions_by_hand():
    """Tiny model (dim 64, 2 layers, 4 heads / 2 kv heads, ffn 192, vocab 256), 64-token sequences:
    blocks 2 x (64*16*(2*4 + 2*2) + 3*64*192) = 98,304 matmul parameters, head 64*256 = 16,384;
    6N = 6 x 114,688 = 688,128; full attention 12*2*64*64 = 98,304 per token, causal half 49,152."""
    from ablate.config import ModelConfig
    from ablate.metrics import flops as F

    tokens = 1000.0
    c = F.conventions(ModelConfig(), tokens, tokens * 64)
    assert c == {"6N": 688_128, "6N+attn_full": 786_432, "6N+attn_causal": 737_280, "8N_hardware": 786_432}
    recompute = F.conventions(ModelConfig(activation_checkpointing=True), tokens, tokens * 64)
    # one more forward of each block but its last matmul (w2: 2 x 192*64 per layer): 2*(98,304 - 24,576) + 32,768
    assert recompute["8N_hardware"] == 786_432 + 2 * (98_304 - 24_576) + 4 * 2 * 64 * 64


def test_nvml_handles_follow_cuda_visible_devices(monkeypatch):
    """torch's device 0 is NVML's device 3 under CUDA_VISIBLE_DEVICES=3,1, and a UUID is looked up as one
    (the memory guard, the sampler and the fp8 capability check all ask through this)."""
    from ablate import nvml

    class FakeNvml:
        def nvmlDeviceGetHandleByIndex(self, i):
            return ("index", i)

        def nvmlDeviceGetHandleByUUID(self, u):
            return ("uuid", u)

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert nvml.handle(FakeNvml(), 0) == ("index", 3) and nvml.handle(FakeNvml(), 1) == ("index", 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f1c")
    assert nvml.handle(FakeNvml(), 0) == ("uuid", "GPU-8f1c")


def test_a_run_started_by_a_large_process_reports_its_own_peak_memory():   # ~0.5 s: one bare python child
    """ru_maxrss survives execve on Linux: a run started by a tune driver or a pytest worker read its parent's
    peak (a trial "over the budget" that used 400 MB). The figure is the child's own high-water mark."""
    import subprocess
    import sys

    held = bytearray(800 * 2**20)
    held[::4096] = b"\x01" * len(held[::4096])   # touched: resident in this process
    code = "from ablate.metrics.memory import PeakRss; print(PeakRss().bytes())"
    child = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {sys.path!r}; {code}"],
                           capture_output=True, text=True, check=True)
    assert int(child.stdout) < 400 * 2**20, child.stdout   # a bare python with torch: ~ 100-300 MB
    del held


def test_a_stall_is_held_up_by_the_rank_that_arrived_last_at_a_collective():
    """In process (~0 s): the long steps' arrival times (wall clock) of two ranks; rank 1 reached the step's third
    collective 4 s after rank 0, which waited there: the stall names rank 1; arrivals that part by less than half
    the stall name nobody by them (the work before the first collective is the fallback)."""
    from ablate.metrics.steady import held_up_by

    stall = {"step": 22, "seconds": 4.1}
    per_rank = [{"rank": 0, "host": "a", "long_steps": [(22, [10.0, 10.01, 10.02, 14.05])]},
                {"rank": 1, "host": "b", "long_steps": [(22, [10.0, 10.01, 14.03, 14.05])]}]
    (held,) = held_up_by([stall], per_rank)
    assert held["rank"] == 1 and held["host"] == "b" and held["late_s"] == pytest.approx(4.01)
    assert all("long_steps" not in r for r in per_rank)   # not kept in summary.json
    together = [{"rank": r, "long_steps": [(22, [10.0, 14.04])], "slowest_before_comm": []} for r in (0, 1)]
    assert "rank" not in held_up_by([stall], together)[0]


def test_a_stall_the_others_waited_in_is_held_up_by_the_rank_that_did_not_wait():
    """In process (~0 s): rank 1 entered every collective on time, then stopped inside one: arrivals cannot tell,
    but rank 0 spent the stall blocked (a Work.wait) and rank 1 did not: rank 1. A rank stopped at a log point
    holds the others up in ablate's own collectives, outside any step: a stall between steps, named alike, unless
    that step checkpointed (expected work)."""
    from ablate.metrics.steady import held_up_by

    stall = {"step": 22, "seconds": 4.1, "x_median": 41.0}
    per_rank = [{"rank": 0, "long_steps": [(22, [10.0, 10.01], 4.05)]},
                {"rank": 1, "long_steps": [(22, [10.0, 10.01], 0.02)]}]
    (held,) = held_up_by([stall], per_rank)
    assert held["rank"] == 1 and held["others_blocked_s"] == 4.05
    gaps = [{"rank": 0, "long_gaps": [(30, 4.02, 4.01)]}, {"rank": 1, "long_gaps": [(30, 4.02, 0.001)]}]
    (between,) = held_up_by([], [dict(r) for r in gaps], median=0.1)
    assert between == {"step": 30, "seconds": 4.02, "x_median": pytest.approx(40.2), "between_steps": True,
                       "rank": 1, "host": None, "others_blocked_s": 4.01}
    assert held_up_by([], [dict(r) for r in gaps], median=0.1, checkpoint_steps=[30]) == []


def test_the_rank_stopped_and_continued_during_a_stall_is_named_first():
    """In process (~0 s): rank 1 stopped (SIGSTOP) after its step's last collective: its step is long, rank 0's is
    not; rank 0 waits at the log point in ablate's own collectives (a gap, not a step). Rank 1's SIGCONT handler
    recorded when it was continued (metrics/stopped.py): within the gap's window, so the stall names rank 1,
    stopped. Job control stopping every rank names none of them by that."""
    from ablate.metrics.steady import held_up_by

    per_rank = [{"rank": 0, "long_gaps": [(20, 4.0, 4.0, 1000.0, 1004.0)], "continued_at": []},
                {"rank": 1, "long_steps": [(20, [999.9], 0.01, 999.9, 1004.0)], "continued_at": [1004.01]}]
    (stall,) = held_up_by([], per_rank, median=0.03)
    assert (stall["step"], stall["rank"], stall["stopped"], stall["between_steps"]) == (20, 1, True, True)
    both = {"step": 22, "seconds": 4.0, "x_median": 100.0}
    everyone = [{"rank": r, "long_steps": [(22, [1.0, 5.0], 4.0, 1.0, 5.0)], "continued_at": [5.0]} for r in (0, 1)]
    assert "stopped" not in held_up_by([both], everyone, median=0.04)[0]
    # the stop seen twice: rank 1 stopped in the gap after step 20, rank 0 waiting in step 21: one stall, step 21's
    twice = [{"rank": 0, "long_steps": [(21, [1.0, 5.0], 4.0, 1.0, 5.0)], "continued_at": []},
             {"rank": 1, "long_gaps": [(20, 4.0, 0.0, 0.9, 4.9)], "continued_at": [4.9]}]
    (once,) = held_up_by([{"step": 21, "seconds": 4.0, "x_median": 100.0}], twice, median=0.04)
    assert (once["step"], once["rank"], once["stopped"]) == (21, 1, True) and "between_steps" not in once


def test_a_model_the_memory_tracker_cannot_follow_still_trains_and_says_why():
    """In process (~0.1 s): a root module called twice in one step is beyond torch's MemTracker (its module
    bookkeeping raises); the step goes on, no peak is recorded, and the reason is kept for the summary's note.
    A model it follows gets its peak with the parts live then."""
    from ablate.metrics.step_memory import StepMemory

    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    opt = torch.optim.AdamW(m.parameters())
    for twice in (True, False):
        tracked = StepMemory(torch.device("cpu"), m, opt)
        with tracked:
            x = torch.randn(4, 8)
            m(m(x) if twice else x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if twice:
            assert tracked.record()["peak_bytes_measured"] is None and "MemTracker" in tracked.why
        else:
            assert tracked.why is None and tracked.peak > 0 and {"params", "optimizer"} <= set(tracked.parts)
