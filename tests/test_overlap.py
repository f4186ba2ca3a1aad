"""Exposed communication from traces: the interval arithmetic, and the analysis on small hand-written
traces whose overlap is known exactly (times in microseconds, as Chrome traces have them)."""
import pytest

from ablate.metrics import overlap as O


def ev(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "cat": cat}


def test_interval_arithmetic():
    assert O.union([(0, 2), (1, 3), (5, 6)]) == [(0, 3), (5, 6)]
    assert O.length([(0, 2), (1, 3)]) == 3
    assert O.intersect([(0, 4)], [(1, 2), (3, 5)]) == [(1, 2), (3, 4)]
    assert O.subtract([(0, 4)], [(1, 2), (3, 5)]) == [(0, 1), (2, 3)]
    assert O.clip([(0, 10)], (2, 4)) == [(2, 4)]


def cpu_trace():
    """Two steps of 1000 us. Step 1: compute 0-600 (nested ops), gloo all-reduce 400-900 on its own
    thread: 200 us hidden, 300 exposed; data wait 900-950. Step 2: all-reduce 1100-1300 wholly under
    compute 1000-1500; a barrier (not counted) 1600-1700."""
    return {"traceEvents": [
        ev("ProfilerStep#1", 0, 1000, cat="user_annotation"), ev("ProfilerStep#2", 1000, 1000, cat="user_annotation"),
        ev("aten::mm", 0, 600), ev("aten::add", 100, 100),
        ev("gloo:all_reduce", 400, 500, tid=7, cat="user_annotation"),
        ev("aten::copy_", 450, 100, tid=7),           # on the gloo thread: not compute
        ev("ablate:data_wait", 900, 50, cat="user_annotation"),
        ev("aten::mm", 1000, 500), ev("gloo:all_reduce", 1100, 200, tid=7, cat="user_annotation"),
        ev("gloo:barrier", 1600, 100, tid=7, cat="user_annotation"),
    ]}


def test_cpu_trace_overlap_is_exact():
    result = O.analyze(cpu_trace())
    s1, s2 = result["steps"]
    assert s1["step"] == 1 and s1["step_s"] == pytest.approx(1e-3)
    assert s1["compute_s"] == pytest.approx(600e-6) and s1["comm_s"] == pytest.approx(500e-6)
    assert s1["comm_exposed_s"] == pytest.approx(300e-6) and s1["comm_overlap_frac"] == pytest.approx(0.4)
    assert s1["data_wait_s"] == pytest.approx(50e-6) and s1["data_exposed_s"] == pytest.approx(50e-6)
    assert s1["idle_s"] == pytest.approx(50e-6)                    # 950-1000
    assert s2["comm_exposed_s"] == 0 and s2["comm_overlap_frac"] == pytest.approx(1.0)
    assert s2["comm_s"] == pytest.approx(200e-6)                  # the barrier is not communication
    assert result["mean"]["comm_exposed_s"] == pytest.approx(150e-6) and result["device"] == "cpu"


def test_gpu_trace_uses_kernels_and_copies():
    trace = {"traceEvents": [
        ev("ProfilerStep#5", 0, 1000, cat="user_annotation"),
        ev("ampere_sgemm", 0, 500, tid=7, cat="kernel"),
        ev("ncclDevKernel_AllReduce_Sum_f32", 300, 400, tid=8, cat="kernel"),
        ev("Memcpy HtoD (Pinned -> Device)", 450, 100, tid=9, cat="gpu_memcpy"),
    ]}
    (s,) = O.analyze(trace)["steps"]
    assert s["comm_s"] == pytest.approx(400e-6) and s["comm_exposed_s"] == pytest.approx(200e-6)
    assert s["data_wait_s"] == pytest.approx(100e-6) and s["data_exposed_s"] == pytest.approx(50e-6)


def test_a_step_without_communication_has_no_overlap_fraction():
    trace = {"traceEvents": [ev("ProfilerStep#1", 0, 100, cat="user_annotation"), ev("aten::mm", 0, 80)]}
    result = O.analyze(trace)
    assert result["steps"][0]["comm_overlap_frac"] is None and result["mean"]["comm_overlap_frac"] is None


def cuda_trace():
    """Two steps in the shape Kineto writes on CUDA (pids and tids as it gives them: the host process, the
    device's streams). Each step is annotated twice: `user_annotation` on the host (which runs ahead of the
    device) and `gpu_user_annotation` on the device; collectives are annotated on the host (`nccl:*`, the
    enqueue), mirrored on the device, and run as NCCL kernels. Device step 1 is 0-1000 us: compute kernels
    0-400 and 800-900, the all-reduce kernel 300-700 (100 us under compute, 300 exposed), an HtoD copy
    950-1000; idle = 1000 - |0-700 ∪ 800-900 ∪ 950-1000| = 150. Device step 2 is 1000-1600: compute
    1000-1500, the all-reduce kernel 1100-1300 (wholly hidden); idle 100."""
    host, dev = {"pid": 4242, "tid": 4242}, {"pid": 0}

    def h(name, ts, dur, cat):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, **host}

    def d(name, ts, dur, cat, stream=7):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "tid": stream, **dev}

    return {"traceEvents": [
        h("ProfilerStep#1", -300, 500, "user_annotation"), h("ProfilerStep#2", 200, 450, "user_annotation"),
        d("ProfilerStep#1", 0, 1000, "gpu_user_annotation"), d("ProfilerStep#2", 1000, 600, "gpu_user_annotation"),
        h("aten::mm", -290, 20, "cpu_op"), h("cudaLaunchKernel", -285, 5, "cuda_runtime"),
        h("nccl:all_reduce", -100, 30, "user_annotation"),              # the enqueue, not the transfer
        d("nccl:all_reduce", 300, 400, "gpu_user_annotation", stream=20),
        d("sm90_xmma_gemm_bf16bf16", 0, 400, "kernel"), d("void at::native::vectorized_elementwise", 800, 100,
                                                                   "kernel"),
        d("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 300, 400, "kernel", stream=20),
        d("Memcpy HtoD (Pinned -> Device)", 950, 50, "gpu_memcpy", stream=30),
        h("nccl:all_reduce", 250, 30, "user_annotation"),
        d("sm90_xmma_gemm_bf16bf16", 1000, 500, "kernel"),
        d("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1100, 200, "kernel", stream=20),
    ]}


def test_a_cuda_trace_has_one_window_per_step_and_counts_only_nccl_kernels():
    result = O.analyze(cuda_trace())
    assert [s["step"] for s in result["steps"]] == [1, 2] and result["device"] == "gpu"
    s1, s2 = result["steps"]
    assert s1["step_s"] == pytest.approx(1000e-6) and s2["step_s"] == pytest.approx(600e-6)
    assert s1["comm_s"] == pytest.approx(400e-6) and s1["compute_s"] == pytest.approx(500e-6)
    assert s1["comm_exposed_s"] == pytest.approx(300e-6) and s1["comm_overlap_frac"] == pytest.approx(0.25)
    assert s1["data_wait_s"] == pytest.approx(50e-6) and s1["idle_s"] == pytest.approx(150e-6)
    assert s2["comm_s"] == pytest.approx(200e-6) and s2["comm_exposed_s"] == 0
    assert s2["compute_s"] == pytest.approx(500e-6) and s2["idle_s"] == pytest.approx(100e-6)
    assert result["mean"]["comm_exposed_s"] == pytest.approx(150e-6)
