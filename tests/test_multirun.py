"""Every job of a multirun runs in its own process, with its own allocator/NCCL environment, recorded as
the process really had it (PyTorch reads the allocator settings once per process)."""
import json

import pytest

from conftest import cli_in_process

pytestmark = pytest.mark.slow


def test_each_arm_of_a_multirun_has_its_own_process_and_environment(tmp_path, capsys):
    """The -m call's main() in this process (conftest.cli_in_process), its 4 jobs processes of their own."""
    result = cli_in_process(capsys, ["-m", "allocator=default,expandable", "nccl=tuned,default", "logger=none",
                                     "train.steps=3", "train.warmup_steps=1", "metrics.gemm_probe_n=64",
                                     "metrics.predict=false",
                                     f"hydra.sweep.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*/summary.json"))]
    assert len(summaries) == 4
    assert len({s["provenance"]["pid"] for s in summaries}) == 4          # four processes
    for s in summaries:
        alloc, nccl = s["env"]["allocator"], s["env"]["nccl"]
        seen = alloc["process_env"]["PYTORCH_ALLOC_CONF"]
        if s["choices"]["allocator"] == "expandable":
            assert seen == "expandable_segments:True,max_split_size_mb:128"
        else:                       # never the previous job's setting, and the record says so truthfully
            assert seen is None and alloc["env"] == {}
        assert (nccl["process_env"].get("NCCL_ALGO") == "RING") == (s["choices"]["nccl"] == "tuned")
