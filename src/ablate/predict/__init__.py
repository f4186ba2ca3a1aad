"""How fast, before the run: one optimizer step's time on a layout and a machine (docs/prediction.md).

Per optimizer step and rank:
- compute, as the kernels run it (predict/kernels.py, predict/machine.py): each op of the rank's forward and
  backward (recompute included) at its class's achieved rate - matmuls at the roofline of the matmul rate and the
  memory bandwidth, attention at SDPA's kernel rate, every other op at the memory bandwidth, each at least a
  launch, or the time the machine measured for that very op (a calibrated file's op_us), each + autograd's per op,
  on every forward-backward of the step - the optimizer's step over the rank's shard (memory-bound, + a time per
  parameter tensor), what runs between the ops and the strategy's own bookkeeping per unit (a calibrated file's);
  where the machine has no such figures, the hardware FLOPs over the matmul rate (a bound on a datasheet's). Under
  a pipeline a stage's micro-batch actions (their compute and the collectives on their critical path: tp's, ep's,
  the sends) take that over 1 - the schedule's expected bubble (config/schedules.py);
- communication per mesh dim and collective kind (predict/network.py) = the comm model's bytes
  (parallel/comm_model.py) x the collective's bus factor / the bus bandwidth of the link the dim crosses
  (nccl-tests' figures per kind within a node; across nodes one NIC per rank of the group on a node), plus NCCL's
  latency per call;
- what of it is exposed, as each strategy schedules it: FSDP2/HSDP's gathers and reduce-scatters run a block
  ahead, behind the compute, all but the first gather and the last reduce-scatter (one unit's of the blocks + the
  root) when the compute is longer; DDP's and HSDP's all-reduce overlap the backward (2/3 of the compute), all but
  the last call of each reduction (issued as its backward ends), as do ZeRO-1/2's, whose gather of the updated
  partitions follows the optimizer step; tensor parallelism's collectives and the pipeline's sends sit on the
  critical path, all exposed; of what a schedule would hide, the machine hides its `overlap` share (a calibrated
  CPU's gloo runs on the ranks' own cores).
step = (compute + critical-path communication) (/ (1 - bubble)) + the rest of the exposed communication. Left
out: data wait, torch.compile's fusion, the interference of communication with the compute it overlaps on a GPU.
Pure arithmetic on the figures given: the plan (`ablate.plan --hardware`), a GPU run (`for_run`: summary.json's
`predicted`) and tests give them.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

from ablate import hardware
from ablate.config import ModelConfig
from ablate.config.dims import BY_NAME
from ablate.config.schedules import expected_of
from ablate.model import build_net
from ablate.model.facts import flop_model
from ablate.parallel.comm_model import expected_comm, fsdp_gathers, reductions, zero_traffic
from ablate.precision import numerics
from ablate.predict.kernels import work_of
from ablate.predict.machine import Machine, compute_seconds, of_hardware, of_run
from ablate.predict.network import BUS_FACTOR, comm_parts, crosses_nodes, exposed, link_bytes_per_s, per_node
from ablate.predict.step import Step, strides

__all__ = ["BUS_FACTOR", "Machine", "Step", "crosses_nodes", "link_bytes_per_s", "of_hardware", "per_node",
           "predict", "strides"]
# the bytes one parameter's optimizer step reads and writes (fp32 state): Adam's reads parameter, gradient and its
# two moments and writes parameter and moments (torch's foreach/fused AdamW: one pass); SGD's reads parameter and
# gradient and writes the parameter (momentum: one more each way)
OPTIMIZER_BYTES = {"adamw": 28, "adam": 28, "sgd": 12}
DDP_BUCKET_BYTES = 25 * 2**20   # DistributedDataParallel's bucket_cap_mb default: one all-reduce per bucket


def predict(step: Step, machine: Machine) -> Dict[str, object]:
    """summary.json's / the plan's `predicted`: step_time_s, tokens_per_s, mfu, compute_s, exposed_comm_s per dim
    (None where the comm model or the machine has no figure), and the rate's source."""
    step.strides = step.strides or strides(step.sizes)
    if not machine.rate.get(step.column):
        return {"step_time_s": None, "why": f"{machine.name}: no matmul rate for {step.column}"}
    compute, parts = compute_seconds(step, machine)
    by_kind = comm_parts(step, machine, compute)
    comm = {d: sum(p.values()) if p is not None else None for d, p in by_kind.items()}
    share = min(machine.overlap, 1.0)   # compute hides at most what the schedule lets it (a reading above 1 is noise)
    hidden = {d: (sum(s - share * (s - exposed(step, d, s, compute, k)) for k, s in p.items()) if p is not None
                  else None) for d, p in by_kind.items()}
    # a pipeline's stages wait (p - 1) of their micro-batch actions: each action is its compute and the collectives
    # on its critical path (tp's, ep's, the sends), so the bubble scales both
    in_action = sum(s for d, s in hidden.items() if s is not None and BY_NAME[d].hidden_by == "none")
    busy = (compute + in_action) / (1 - step.bubble)
    total = busy + sum(s for d, s in hidden.items() if s is not None and BY_NAME[d].hidden_by != "none")
    peak = machine.peak.get(step.column)
    return {"step_time_s": total, "tokens_per_s": step.tokens / total,
            "mfu": step.model_flops / total / peak if peak else None, "compute_s": compute,
            "compute_s_by_class": parts or None, "bubble_s": busy - compute - in_action, "exposed_comm_s": hidden,
            "comm_s": comm, "rate_source": source_of(step, machine, bool(parts))}


def source_of(step: Step, machine: Machine, per_op: bool) -> str:
    """What the compute was priced from: per op, or the FLOPs over the matmul rate (and why, where the machine has
    per-op figures)."""
    if per_op or not machine.per_op(step.column):
        return machine.rate_source
    why = "no ops recorded for this model" if step.work is None else f"no per-op figures for {step.column}"
    return f"{machine.rate_source} ({why}: the FLOPs over the matmul rate)"


def for_run(cfg, layout, facts: Dict[str, object], throughput, notes: Dict[str, str],
            here: Optional[Dict[str, object]] = None) -> Optional[Dict[str, object]]:
    """summary.json's `predicted`: on a CPU, the prediction the run made before its first step (`here`:
    predict/here.py, with its MFU against the run's calibrated peak); on a GPU, this run on its own GPU (its
    hardware file, its calibrated GEMM rate, its FLOP model, the comm model's bytes in `facts["modeled"]`). None
    and the reason in `notes` where there is none."""
    peak = throughput.peak
    comm = {k.split(".", 1)[1]: v for k, v in facts["modeled"].items() if k.startswith("comm_bytes_by_dim.")}
    step = step_of(cfg, layout, throughput.flop_model, comm, facts["blocks"]["count"] or 0)
    if peak.device_name == "cpu":
        if not (here or {}).get("step_time_s"):
            notes["predicted"] = (here or {}).get("why") or "not predicted"
            return None
        mfu = step.model_flops / here["step_time_s"] / peak.measured if peak.measured else None
        return {**here, "mfu": mfu}
    if not cfg.metrics.predict:
        notes["predicted"] = "not predicted: metrics.predict=false"
        return None
    hw = hardware.for_device(peak.device_name)
    if hw is None:
        notes["predicted"] = f"not predicted: no hardware file for {peak.device_name} (conf/hardware)"
        return None
    step = step_of(cfg, layout, throughput.flop_model, comm, facts["blocks"]["count"] or 0, facts.get("params"))
    return predict(step, of_run(hw, peak.measured, step.column))


def for_plan(cfg, layout, n_params: int, n_blocks: int, hw) -> Dict[str, object]:
    """`ablate.plan --hardware`'s `predicted`: the layout on that hardware (its file's rate and links), the FLOPs
    of the model's FLOP model (counted on the meta device for a model not built in)."""
    flops = flops_of(cfg.model, cfg.train.seq_len)
    step = step_of(cfg, layout, flops, expected_comm(cfg, layout, n_params), n_blocks, n_params,
                   by_signature=bool(hw.op_seconds))
    return predict(step, of_hardware(hw))


_FLOPS: Dict[str, object] = {}


def flops_of(model_cfg, seq: int):
    """The model's FLOP model, once per process for a model and a sequence length (the advisor plans many layouts
    of one model): the built-in Llama's formula needs no network; any other model is counted on the meta device."""
    key = repr((model_cfg, seq))
    if key not in _FLOPS:
        net = None if isinstance(model_cfg, ModelConfig) else build_net(model_cfg, "meta")
        _FLOPS[key] = flop_model(model_cfg, seq, net)
    return _FLOPS[key]


def step_of(cfg, layout, flops, comm_bytes: Dict[str, Optional[float]], n_blocks: int,
            n_params: Optional[int] = None, by_signature: bool = False) -> Step:
    """One optimizer step of the run `cfg` asks for on `layout`: a device's share of its replica's FLOPs (the FLOP
    model's, recompute included), the comm model's bytes and calls, the pipeline's expected bubble; given the
    model's parameters, its ops for the per-op compute model (one sequence's, scaled; `by_signature`: a
    micro-batch's, as the rank runs them, for a machine that timed ops at their shapes) and its optimizer's bytes."""
    t = cfg.train
    tokens = replica_tokens(cfg)
    per_replica = flops.training(tokens, tokens * t.seq_len)
    step = Step(per_replica.hardware / layout.model_ranks, per_replica.model / layout.model_ranks, comm_bytes,
                global_tokens(cfg, layout), n_blocks, layout.record(), cfg.launcher.nproc_per_node, cfg.parallel.name,
                numerics(cfg.precision.name).peak_column, expected_of(cfg.parallel), calls=calls_of(cfg, layout,
                                                                                                     comm_bytes,
                                                                                                     n_blocks))
    step.reductions = reductions(cfg)
    step.traffic = zero_split(cfg, comm_bytes)
    if n_params:
        cut = cfg.parallel.microbatches   # a pipeline runs each micro-batch through
        step.passes, step.micro_sequences, step.share = t.grad_accum * cut, t.batch_size / cut, 1 / layout.tp
        batch = int(step.micro_sequences) if by_signature and step.micro_sequences.is_integer() else 1
        step.work = recorded_work(cfg, layout.pp, batch)
        step.param_tensors = step.work.param_tensors if step.work else 0.0
        on_rank = n_params / (layout.model_ranks * layout.dp_shard)   # FSDP and ZeRO shard it over dp_shard
        step.optimizer_bytes = on_rank * OPTIMIZER_BYTES.get(cfg.optim.name, OPTIMIZER_BYTES["adamw"])
        step.optimizer_signature = optimizer_signature(cfg.optim.name, step.param_tensors, on_rank)
    return step


def optimizer_signature(optimizer: str, tensors: float, elements: float) -> str:
    """A rank's optimizer step as a calibrated file's optimizer_us keys it: the optimizer, the parameter tensors it
    steps and their elements on the rank."""
    return f"{optimizer}|{round(tensors)}|{round(elements)}"


def recorded_work(cfg, pp: int, batch: int):
    """The rank's ops (predict/kernels.py), or None for a model whose step neither fake tensors nor the meta device
    can run: a prediction never stops a run or a plan that can go on without it."""
    try:
        return work_of(cfg, pp, batch)
    except Exception:   # (any model's own code: whatever it raises, the FLOP model still answers)
        return None


def zero_calls(cfg, n_params: float) -> Dict[str, float]:
    """ZeRO-1/2's calls a step by kind (DeepSpeed's stage_1_and_2.py): each reduction's all-reduces, one per
    reduce_bucket_size elements, and the gradient norm's and the overflow check's scalar ones (their latency priced
    with the buckets'); the all-gathers of each parameter group (matrices and the rest: optim.py) in
    allgather_bucket_size shards. Tiny, 2 ranks: 3 all-reduces and 2 all-gathers, as counted."""
    p = cfg.parallel
    return {"all_reduce": reductions(cfg) * math.ceil(n_params / p.reduce_bucket_size) + 2,
            "all_gather": math.ceil(n_params / p.allgather_bucket_size) + 1}


def zero_split(cfg, comm_bytes: Dict[str, Optional[float]]) -> Dict[str, Dict[str, Tuple[float, float]]]:
    """Step.traffic for ZeRO-1/2's dp_shard: each kind's share of its bytes and its calls (empty for the rest)."""
    traffic = zero_traffic(cfg)
    if not traffic or not comm_bytes.get("dp_shard"):
        return {}
    per_param = sum(traffic.values())
    calls = zero_calls(cfg, comm_bytes["dp_shard"] / per_param)   # (the bytes are the parameters' x per_param)
    return {"dp_shard": {k: (b / per_param, calls[k]) for k, b in traffic.items()}}


def calls_of(cfg, layout, comm_bytes: Dict[str, Optional[float]], n_blocks: int) -> Dict[str, float]:
    """Collective calls per dim in one step (their latency), as the comm model's bytes are moved: FSDP's gathers
    per unit (the blocks of a stage and the root; comm_model.fsdp_gathers) and its one reduce-scatter a step; HSDP's
    all-reduce per unit once a step, DDP's per bucket of each reduction (every micro-step's, or with no_sync the
    last's); ZeRO-1/2's (zero_calls); TP's (sequence parallel) per micro-batch: two all-gathers and two
    reduce-scatters per block forward, as many backward, the embedding's output and the head's input each way, the
    loss's three all-reduces (vocab-parallel; else the logits' one gather), and once a step the norms' weight
    gradients' (2 a block + the final norm); a pipeline's sends per micro-batch: out of each of its v stages
    forward, back out of each but the first. The gradient norm (clip_grad_norm_ over DTensors) all-reduces once a
    step over each dim that shards the gradients (dp_shard under FSDP, tp). Tiny, 2 blocks, counted on a fake group:
    fsdp2 10 calls (grad_accum 2: 16), fsdp2 x tp2 dp_shard 10 and tp 29 (grad_accum 2: 16 and 52), hsdp 10 and 3."""
    micro, blocks = cfg.train.grad_accum, n_blocks / layout.pp
    pipeline = cfg.parallel.microbatches
    ddp = cfg.parallel.name in ("ddp", "ddp_sync")
    each = reductions(cfg)   # each all-reduces the gradients in buckets
    replicate = each * math.ceil((comm_bytes.get("dp_replicate") or 0) / each / DDP_BUCKET_BYTES) if ddp \
        else blocks + 1   # HSDP's: each unit's reduced shard, once a step
    zero = zero_split(cfg, comm_bytes)
    shard = sum(calls for _, calls in zero["dp_shard"].values()) if zero else \
        (fsdp_gathers(cfg, layout) + 1) * (blocks + 1) + 1
    ends = 1 if layout.pp > 1 else 2   # the embedding (and, on the last stage, the head, the loss, the final norm)
    loss = 0 if layout.pp > 1 else (3 if cfg.parallel.vocab_parallel else 1)
    tp = micro * pipeline * (8 * blocks + 2 * ends + loss) + 2 * blocks + ends - 1 + 1
    # a mixture's, per block and micro-batch: FSDP's unit of the rank's experts (efsdp); ep's three all-to-alls
    # forward (the counts, the slots out, back) and two backward
    sends = 2 * cfg.parallel.pp_stages_per_rank - 1
    return {"dp_shard": shard, "dp_replicate": replicate, "tp": tp,
            "pp": micro * pipeline * sends, "efsdp": micro * 3 * blocks, "ep": micro * pipeline * 5 * blocks}


def replica_tokens(cfg) -> int:
    """The tokens one model replica (a data-parallel rank's tp and pp group) trains on per optimizer step."""
    t = cfg.train
    return t.batch_size * t.seq_len * t.grad_accum


def global_tokens(cfg, layout) -> int:
    """The tokens the whole job trains on per optimizer step: every data-parallel replica's."""
    return replica_tokens(cfg) * layout.dp
