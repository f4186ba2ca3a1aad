"""The allocator and nccl groups reach the process environment, and are recorded honestly."""
import os

import torch

from ablate import allocator, nccl
from ablate.config import AllocatorConfig, NcclConfig


def unset(monkeypatch, *names):
    """Absent for this test, and absent again after it: setenv first so monkeypatch records the
    original state, even for variables the code under test sets in os.environ itself."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def test_allocator_sets_both_names_and_says_it_does_not_apply_without_cuda(monkeypatch):
    unset(monkeypatch, *allocator.ENV_NAMES)
    record = allocator.apply(AllocatorConfig(name="expandable", expandable_segments=True, max_split_size_mb=128))
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        assert os.environ[name] == "expandable_segments:True,max_split_size_mb:128"
    assert record["env"]["PYTORCH_ALLOC_CONF"] == "expandable_segments:True,max_split_size_mb:128"
    if not torch.cuda.is_available():
        assert record["applicable"] is False and "CUDA" in record["reason"]


def test_default_allocator_sets_nothing(monkeypatch):
    unset(monkeypatch, *allocator.ENV_NAMES)
    assert allocator.apply(AllocatorConfig())["env"] == {}
    assert "PYTORCH_ALLOC_CONF" not in os.environ


def test_nccl_async_error_handling_uses_the_name_this_torch_reads(monkeypatch):
    unset(monkeypatch, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ALGO")
    record = nccl.apply(NcclConfig(name="tuned", env={"NCCL_ALGO": "RING"}, async_error_handling=1))
    assert os.environ["NCCL_ALGO"] == "RING"
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"   # torch >= 2.2
    assert record["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


def test_the_allocator_check_reads_the_segments_the_allocator_recorded():
    from ablate.allocator import segments_check

    # as torch.cuda.memory_snapshot() lists them (only the key read here shown)
    expandable = [{"is_expandable": True, "total_size": 2 << 20}, {"is_expandable": True, "total_size": 20 << 20}]
    plain = [{"is_expandable": False, "total_size": 2 << 20}]
    assert segments_check(expandable, asked_expandable=True) == {"asked_expandable": True, "segments": 2,
                                                                 "expandable_segments": 2, "took": True}
    late = segments_check(plain, asked_expandable=True)
    assert late["took"] is False and "0 of 1 segments expandable" in late["reason"]
    assert segments_check(plain, asked_expandable=False)["took"] is True
    assert segments_check([], asked_expandable=True)["took"] is None


def test_on_a_cpu_the_allocator_check_says_why_it_is_absent():
    import torch

    from ablate.allocator import check_took
    from ablate.config import AllocatorConfig

    record = check_took(AllocatorConfig(name="expandable", expandable_segments=True), torch.device("cpu"))
    assert record["took"] is None and "no CUDA device" in record["reason"]
