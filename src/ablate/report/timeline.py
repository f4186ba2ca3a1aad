"""A timeline PNG of one profiled step of one rank: compute, communication and data-wait lanes, with the
communication nothing else ran during (exposed) in red. Drawn by the report beside each arm's run."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ablate.metrics import overlap as O

LANES = (("compute", "#2a7ab0"), ("comm", "#7fb27f"), ("data", "#e0a030"))


def draw(trace_path: Path, out_png: Path, title: str, training_step: Optional[int] = None) -> Optional[Path]:
    """The first profiled step of this trace (`training_step`: which step of the run that was, from the run's
    metrics.profile_steps); None when the trace has no step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = O.classify(O.load(trace_path))
    if not parts["steps"]:
        return None
    n, window = parts["steps"][0]
    lanes = {k: O.union(O.clip(parts[k], window)) for k, _ in LANES}
    exposed = O.subtract(lanes["comm"], lanes["compute"])
    t0 = window[0]
    fig, ax = plt.subplots(figsize=(9, 2.2))
    for y, (lane, colour) in enumerate(LANES):
        ax.broken_barh([((a - t0) * 1e3, (b - a) * 1e3) for a, b in lanes[lane]], (y - 0.35, 0.7), color=colour)
    ax.broken_barh([((a - t0) * 1e3, (b - a) * 1e3) for a, b in exposed], (1 - 0.35, 0.7), color="#c0392b",
                   label="exposed communication")
    figures = O.step_figures(parts, window)
    overlap_text = (f"{figures['comm_overlap_frac']:.0%}" if figures["comm_overlap_frac"] is not None else "—")
    ax.set_yticks(range(len(LANES)), [lane for lane, _ in LANES], fontsize=8)
    ax.set_xlabel("ms into the step", fontsize=8)
    ax.set_xlim(0, (window[1] - window[0]) * 1e3)
    which = f"training step {training_step}" if training_step is not None else f"profiled step {n}"
    ax.set_title(f"{title}: {which}; exposed comm {figures['comm_exposed_s'] * 1e3:.2f} ms, "
                 f"overlap {overlap_text}, data wait {figures['data_wait_s'] * 1e3:.2f} ms", fontsize=8)
    ax.legend(fontsize=7, loc="upper right")
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
