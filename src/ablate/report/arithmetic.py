"""The claims' own arithmetic (docs/week4.md), checked, and the article's MFU told under each convention
for the model C1 measured here: lines at the end of report.md."""
from __future__ import annotations

from typing import Iterable, List


def claims(held: Iterable[str]) -> List[str]:
    """The claims' own arithmetic (docs/week4.md), checked: the lines of the week-4 claims among `held` (the report's
    groups' claims; a sweep of the user's own, or runs compared ad hoc, hold none of them)."""
    held = set(held)
    return [line for line in _arithmetic() if line.split(":", 1)[0] in held]


def _arithmetic() -> List[str]:
    params = 70e9
    return [f"C2: 840 GB / 70B params = {840e9 / params:.0f} bytes/param (fp32 master + Adam m + v); "
            f"/ 64 GPUs = {840e9 / 64 / 1e9:.1f} GB per GPU",
            f"C2: the ZeRO paper's mixed-precision total is 16 bytes/param: {16 * params / 1e9:,.0f} GB, "
            f"{16 * params / 64 / 1e9:.1f} GB per GPU at 64 — before activations",
            f"C3: 87.5% = 1 - 1/8: one all-reduce instead of eight at grad_accum 8 ({1 - 1 / 8:.3f})",
            "C1: 6N = forward 2N + backward 4N per token; 8N adds the recomputed forward (ablate's HFU: "
            "~7.7N, PyTorch does not redo each block's last matmul)"]


ARTICLE_MFU = 0.606   # docs/week4.md, C1: "MFU 19.6% -> 60.6%", counted with 6N (no checkpointing)


def article_mfu(groups) -> List[str]:
    """The article's 60.6% (6N) told under each MFU convention for the model C1 measured here: the same
    throughput with each convention's FLOPs per token."""
    runs = [r for g in groups if g.sweep.get("claim") == "C1" for arm in g.arms.values() for r in arm.runs
            if r.summary.get("mfu_conventions") and not r.knob("model.activation_checkpointing")]
    if not runs:
        return []
    fpt = {k: v["flops_per_token"] for k, v in runs[0].summary["mfu_conventions"].items()}
    told = ", ".join(f"{name} {ARTICLE_MFU * f / fpt['6N']:.1%}" for name, f in fpt.items())
    return [f"C1: the article's {ARTICLE_MFU:.1%} (6N) under each convention for this model "
            f"({runs[0].summary.get('seq_len')} tokens per sequence): {told}; ablate's `mfu` is "
            f"{runs[0].summary.get('mfu_convention')}"]
