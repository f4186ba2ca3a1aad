"""conf/data -> where the tokens come from (`dataloader` is how they reach the device).

- synthetic: learnable sequences made in process (dataloader.SyntheticBatches), no files;
- tokens:    a flat binary file of token ids (nanoGPT's train.bin: uint16; `data.dtype=uint32` for larger
             vocabularies), memory-mapped; an llm.c file's 1024-byte header is read and skipped;
- hf:        a tokenized Hugging Face `datasets` folder (save_to_disk), its `data.column` concatenated.

Batch i is a pure function of (seed, i): each of its sequences starts at an offset drawn from a generator
seeded with (seed, i) (nanoGPT's sampling), so a resumed run reads exactly the batches it would have, and
ranks, which take different i (dataloader.RankBatches), never read the same batch.
`check` refuses, in one line before any rank starts, a file shorter than one sequence, a size that is not
a whole number of ids of its dtype, and an id the model's vocabulary does not have.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ablate.config import ConfigError, DataConfig
from ablate.config.groups import TOKEN_DTYPES

# llm.c's .bin files (dev/data/data_common.py): 256 int32 header, then the ids; magic -> the ids' dtype
LLMC_HEADER_BYTES = 256 * 4
LLMC_MAGIC = {20240520: np.uint16, 20240801: np.uint32}


def llmc_header(path: Path) -> Optional[Tuple[np.dtype, int]]:
    """(dtype, token count) when the file starts with an llm.c header, else None."""
    if path.stat().st_size < LLMC_HEADER_BYTES:
        return None
    header = np.fromfile(path, dtype=np.int32, count=256)
    dtype = LLMC_MAGIC.get(int(header[0]))
    return (np.dtype(dtype), int(header[2])) if dtype is not None else None


def token_file(cfg: DataConfig) -> np.ndarray:
    """The token ids of a `data=tokens` file, memory-mapped (nothing read until a batch needs it)."""
    path = Path(cfg.path)
    if path.is_dir():
        raise ConfigError(f"data.path={cfg.path}: a directory; give a file of token ids (data=hf reads a datasets "
                          "folder)")
    if path.stat().st_size == 0:
        raise ConfigError(f"data.path={cfg.path}: an empty file (0 bytes); give a file of token ids")
    header = llmc_header(path)
    if header is not None:
        dtype, count = header
        return np.memmap(path, dtype=dtype, mode="r", offset=LLMC_HEADER_BYTES, shape=(count,))
    dtype = np.dtype(cfg.dtype)
    size = path.stat().st_size
    if size % dtype.itemsize:
        fits = [d for d in TOKEN_DTYPES if size % np.dtype(d).itemsize == 0]
        hint = f"valid choices: data.dtype={', '.join(fits)}" if fits else \
            f"nor of any dtype ablate reads ({', '.join(TOKEN_DTYPES)}): a truncated or foreign file?"
        raise ConfigError(f"data.path={cfg.path}: {size} bytes is not a whole number of {cfg.dtype} ids; {hint}")
    return np.memmap(path, dtype=dtype, mode="r")


def hf_tokens(cfg: DataConfig) -> np.ndarray:
    """The `data.column` of a tokenized datasets folder, packed into one array of ids."""
    try:
        from datasets import load_from_disk
    except ImportError:
        raise ConfigError("data=hf needs the datasets package: pip install 'ablate[hf]'") from None
    try:
        ds = load_from_disk(cfg.path)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"data.path={cfg.path}: not a datasets folder ({str(e).splitlines()[0]})") from None
    if cfg.column not in ds.column_names:
        raise ConfigError(f"data.column={cfg.column}: no such column in {cfg.path}; valid choices: "
                          f"{', '.join(ds.column_names)}")
    rows = ds.with_format("numpy")[cfg.column]
    return np.concatenate([np.asarray(r, dtype=np.int64).ravel() for r in rows]) if len(rows) else np.zeros(0)


class TokenBatches(Dataset):
    """Item i is a whole batch (inputs, targets) of `batch_size` sequences of `seq_len` read from `tokens`."""

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int):
        self.tokens, self.batch_size, self.seq_len, self.seed = tokens, batch_size, seq_len, seed

    def __len__(self):
        return 2**62

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        span = self.seq_len + 1
        starts = torch.randint(0, len(self.tokens) - span + 1, (self.batch_size,), generator=g).tolist()
        seq = torch.from_numpy(np.stack([np.asarray(self.tokens[s:s + span], dtype=np.int64) for s in starts]))
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


# data.name -> its token ids (None: made in process, dataloader.SyntheticBatches)
REGISTRY: Dict[str, Optional[Callable[[DataConfig], np.ndarray]]] = {"synthetic": None, "tokens": token_file,
                                                                      "hf": hf_tokens}


def tokens_of(cfg: DataConfig) -> Optional[np.ndarray]:
    if cfg.name not in REGISTRY:
        raise ConfigError(f"data.name={cfg.name}: not a valid choice; valid choices: {', '.join(REGISTRY)}")
    read = REGISTRY[cfg.name]
    return read(cfg) if read is not None else None


def check(cfg: DataConfig, seq_len: int, vocab_size: int, batch_size: int = 1) -> None:
    """A file that cannot feed this run, refused in one line (before any rank starts). Reads every id once."""
    tokens = tokens_of(cfg)
    if tokens is None:
        return
    if len(tokens) < seq_len + 1:
        raise ConfigError(f"data.path={cfg.path}: {len(tokens)} token ids, shorter than one sequence "
                          f"(train.seq_len + 1 = {seq_len + 1})")
    if len(tokens) < batch_size * (seq_len + 1):   # its sequences would overlap: every batch reads the same ids
        raise ConfigError(f"data.path={cfg.path}: {len(tokens)} token ids, shorter than one batch (train.batch_size "
                          f"x (train.seq_len + 1) = {batch_size} x {seq_len + 1} = {batch_size * (seq_len + 1)}); "
                          "a longer file, or a smaller train.batch_size or train.seq_len")
    largest = int(tokens.max())
    if largest >= vocab_size:
        raise ConfigError(f"data.path={cfg.path}: holds token id {largest}, but the model's vocabulary has "
                          f"{vocab_size} (ids 0..{vocab_size - 1}); another tokenizer's file, or data.dtype wrong?")
