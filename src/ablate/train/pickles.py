"""Checkpoints execute nothing: every pickle a resume would open is first read by a restricted unpickler that
knows only the types its format needs (Python's "restricting globals" pattern); a pickle that names anything
else (os.system in a planted __reduce__, say) is refused before the checkpoint's loader ever sees it.

- meta.pt and ablate's own model_optimizer.pt: torch.load(weights_only=True) (checkpoint.py, parallel/base.py);
- DCP's `.metadata` (fsdp2), a plain pickle that torch's own loader reads with pickle.load: the allow-list
  below, its dataclasses and enums only;
- DeepSpeed's `*_states.pt`: torch.load(weights_only=True) with DeepSpeed's two enums/classes allowed.
Reading a DeepSpeed state twice (here, then by DeepSpeed) costs its size in reads: safety first.
"""
from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Optional

import torch

# (module, name) a DCP .metadata file may name: torch.distributed.checkpoint's own dataclasses, sizes, dtypes
DCP_METADATA = {("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("collections", "OrderedDict"),
                ("torch", "Size"), ("torch.serialization", "_get_layout"),
                ("torch.distributed.checkpoint.filesystem", "_StorageInfo")} | {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")}


class Refused(Exception):
    """A pickle names something its format never needs."""


class RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, allowed):
        super().__init__(file)
        self.allowed = allowed

    def find_class(self, module: str, name: str):
        is_dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) in self.allowed or is_dtype:
            return super().find_class(module, name)
        raise Refused(f"{module}.{name}")


def deepspeed_safe():
    """The non-tensor types DeepSpeed's ZeRO states hold (found in this version's files)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    return [ZeroStageEnum, LossScaler]


def unsafe(checkpoint: Path) -> Optional[str]:
    """Why this checkpoint's pickles must not be loaded, or None when each names only what its format needs."""
    metadata = checkpoint / "dcp" / ".metadata"
    if metadata.is_file():
        try:
            with metadata.open("rb") as f:
                RestrictedUnpickler(f, DCP_METADATA).load()
        except Refused as e:
            return f"{metadata.relative_to(checkpoint)} names {e}, which a checkpoint never needs: not loaded"
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
            return f"{metadata.relative_to(checkpoint)} cannot be read ({type(e).__name__})"
    states = sorted(checkpoint.glob("deepspeed/*/*_states.pt"))
    if states:
        with torch.serialization.safe_globals(deepspeed_safe()):
            for path in states:
                try:
                    torch.load(path, map_location="cpu", weights_only=True)
                except pickle.UnpicklingError as e:
                    found = re.search(r"GLOBAL (\S+)", str(e))
                    named = found.group(1) if found else "a type outside the allow-list"
                    return (f"{path.relative_to(checkpoint)} names {named}, which a checkpoint never needs: "
                            "not loaded")
                except (RuntimeError, EOFError, ValueError, OSError) as e:
                    return f"{path.relative_to(checkpoint)} cannot be read ({type(e).__name__})"
    return None
