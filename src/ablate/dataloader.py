"""conf/dataloader -> the path that carries batches to the device, and the synthetic source (conf/data's default).

The data is made in-process (no downloads) and is learnable: each sequence counts upward modulo the
vocabulary with a stride of 1, 2 or 3 (fixed per sequence), and a few tokens are replaced by noise.
A model first learns "next = previous + a small stride", then which stride, so the loss falls fast.
Batch i is a pure function of (seed, i): any rank, worker or resumed run gets the same batch i.
"""
from __future__ import annotations

import time
from typing import Iterator, Optional, Tuple

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ablate.config import DataConfig, DataloaderConfig, TrainConfig
from ablate.data import TokenBatches, tokens_of

NOISE_PROB = 0.05
STRIDES = (1, 2, 3)


class SyntheticBatches(Dataset):
    """Item i is a whole batch (inputs, targets) of shape (batch_size, length)."""

    def __init__(self, vocab_size: int, batch_size: int, seq_len: int, seq_len_min: Optional[int],
                 seed: int, read_latency_ms: float = 0.0):
        self.vocab_size, self.batch_size, self.seq_len = vocab_size, batch_size, seq_len
        self.seq_len_min, self.seed, self.read_latency_s = seq_len_min, seed, read_latency_ms / 1000

    def __len__(self):
        return 2**62

    def length_of(self, index: int) -> int:
        if self.seq_len_min is None:
            return self.seq_len
        g = torch.Generator().manual_seed(self.seed * 7919 + index)
        return int(torch.randint(self.seq_len_min, self.seq_len + 1, (1,), generator=g))

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.read_latency_s:
            time.sleep(self.read_latency_s)  # stands for reading from slow storage
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        b, t, v = self.batch_size, self.length_of(index) + 1, self.vocab_size
        start = torch.randint(0, v, (b, 1), generator=g)
        stride = torch.tensor(STRIDES)[torch.randint(0, len(STRIDES), (b, 1), generator=g)]
        seq = (start + stride * torch.arange(t)) % v
        noise = torch.rand(b, t, generator=g) < NOISE_PROB
        seq = torch.where(noise, torch.randint(0, v, (b, t), generator=g), seq)
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


class RankBatches(Sampler):
    """Batch indices for one rank: rank, rank + world, ... from `start` (a global micro-step count)."""

    def __init__(self, rank: int, world_size: int, start: int = 0):
        self.rank, self.world_size, self.start = rank, world_size, start

    def __iter__(self) -> Iterator[int]:
        i = self.start
        while True:
            yield i * self.world_size + self.rank
            i += 1


def build_loader(train: TrainConfig, data: DataloaderConfig, source: DataConfig, vocab_size: int, dp_rank: int,
                 dp_degree: int, start_micro_step: int, device: torch.device) -> DataLoader:
    """Batches from `source` (conf/data: data.py), delivered as `data` (conf/dataloader) says: this data-parallel
    rank's share of dp_degree (parallel/mesh.py; the ranks of a tensor-parallel group read the same batches)."""
    tokens = tokens_of(source)
    if tokens is None:
        dataset = SyntheticBatches(vocab_size, train.batch_size, train.seq_len, train.seq_len_min,
                                   train.seed, data.read_latency_ms)
    else:
        dataset = TokenBatches(tokens, train.batch_size, train.seq_len, train.seed)
    workers = data.num_workers
    return DataLoader(
        dataset, batch_size=None, sampler=RankBatches(dp_rank, dp_degree, start_micro_step),
        num_workers=workers, pin_memory=data.pin_memory and device.type == "cuda",
        prefetch_factor=data.prefetch_factor if workers else None,
        persistent_workers=data.persistent_workers if workers else False)


class DeviceFeeder:
    """Next batch on the device, timing how long the step waited for the loader and for the copy.

    With `cuda_prefetch` on CUDA, batch k+1 is copied on a side stream while step k computes
    (the current stream waits on it only when the batch is used)."""

    def __init__(self, loader: DataLoader, data: DataloaderConfig, device: torch.device):
        self.batches = iter(loader)
        self.device = device
        self.non_blocking = data.non_blocking and device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if data.cuda_prefetch and device.type == "cuda" else None
        self.wait_s = 0.0   # host seconds blocked on the loader
        self.copy_s = 0.0   # host seconds issuing (or, when blocking, doing) host-to-device copies
        self.tokens = 0         # tokens delivered (this rank)
        self.tokens_x_len = 0   # sum of tokens * sequence length (for the attention FLOPs)
        self._ready = self._fetch() if self.stream is not None else None

    def _fetch(self):
        t0 = time.perf_counter()
        with torch.profiler.record_function("ablate:data_wait"):   # what a trace reads as data wait
            x, y = next(self.batches)
        t1 = time.perf_counter()
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        else:
            x, y = x.to(self.device, non_blocking=self.non_blocking), y.to(self.device, non_blocking=self.non_blocking)
        self.wait_s += t1 - t0
        self.copy_s += time.perf_counter() - t1
        return x, y

    def __next__(self):
        if self.stream is None:
            x, y = self._fetch()
        else:
            x, y = self._ready
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            x.record_stream(torch.cuda.current_stream(self.device))
            y.record_stream(torch.cuda.current_stream(self.device))
            self._ready = self._fetch()
        self.tokens += x.numel()
        self.tokens_x_len += x.numel() * x.shape[1]
        return x, y
