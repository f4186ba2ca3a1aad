"""The allocator and nccl groups reach the process environment, and are recorded honestly."""
import os

import torch

from ablate import allocator, nccl
from ablate.config import AllocatorConfig, NcclConfig


def test_allocator_sets_both_names_and_says_it_does_not_apply_without_cuda(monkeypatch):
    for name in allocator.ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    record = allocator.apply(AllocatorConfig(name="expandable", expandable_segments=True, max_split_size_mb=128))
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        assert os.environ[name] == "expandable_segments:True,max_split_size_mb:128"
    assert record["env"]["PYTORCH_ALLOC_CONF"] == "expandable_segments:True,max_split_size_mb:128"
    if not torch.cuda.is_available():
        assert record["applicable"] is False and "CUDA" in record["reason"]


def test_default_allocator_sets_nothing(monkeypatch):
    for name in allocator.ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    assert allocator.apply(AllocatorConfig())["env"] == {}
    assert "PYTORCH_ALLOC_CONF" not in os.environ


def test_nccl_async_error_handling_uses_the_name_this_torch_reads(monkeypatch):
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    record = nccl.apply(NcclConfig(name="tuned", env={"NCCL_ALGO": "RING"}, async_error_handling=1))
    assert os.environ["NCCL_ALGO"] == "RING"
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"   # torch >= 2.2
    assert record["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
