"""`kbsweep calibrate`: attainable peaks measured on this machine, stored beside the datasheet figures."""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Dict

import torch

from kbsweep.config.gpus import GpuSpec, require_card
from kbsweep.errors import KbsweepError

GEMM_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8", "int8")


def timed(fn: Callable[[], Any], device: torch.device, repeats: int = 20) -> float:
    """Median seconds per call (events on CUDA, perf_counter on CPU), after warm-up."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return sorted(samples)[len(samples) // 2]


def gemm(dtype: str, n: int, device: torch.device) -> Callable[[], Any]:
    if dtype == "fp8":
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    if dtype == "int8":
        a = torch.randint(-64, 64, (n, n), dtype=torch.int8, device=device)
        b = torch.randint(-64, 64, (n, n), dtype=torch.int8, device=device)
        return lambda: torch._int_mm(a, b)
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}[dtype]
    a = torch.randn(n, n, device=device, dtype=torch_dtype)
    b = torch.randn(n, n, device=device, dtype=torch_dtype)
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    return lambda: a @ b


def launch_latency(device: torch.device) -> Dict[str, float]:
    x = torch.zeros(1, device=device)
    calls = 200
    t0 = time.perf_counter()
    for _ in range(calls):
        x.add_(1)
    if device.type == "cuda":
        torch.cuda.synchronize()
    eager = (time.perf_counter() - t0) / calls * 1e6
    out = {"launch_us_eager": eager}
    if device.type == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                x.add_(1)
        graph.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        out["launch_us_graph"] = (time.perf_counter() - t0) / calls * 1e6
    return out


def require_here(gpu: Dict[str, Any]) -> None:
    """Refuse (one line) a GPU config whose card this machine lacks, as a grade does (:func:`require_card`): another
    chip's peaks would be stored under its name, and a machine without CUDA has nothing to measure."""
    spec = GpuSpec(**gpu)
    require_card(spec)
    if spec.cuda and not torch.cuda.is_available():  # NVML lists the card, but this torch cannot reach it
        raise KbsweepError(
            f"gpu={spec.name}: torch {torch.__version__} here has no CUDA to calibrate with; install a CUDA build of torch, or use gpu=cpu"
        )


def calibrate(gpu: Dict[str, Any]) -> Dict[str, Any]:
    """Large copy and read bandwidth, dense GEMM peaks per dtype, launch latency, on the device of ``gpu`` (a GPU
    config: checked to be this machine's first)."""
    require_here(gpu)
    device = torch.device("cuda" if gpu["device"] == "cuda" else "cpu")
    on_gpu = device.type == "cuda"
    nbytes = (4 << 30) if on_gpu else (64 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    result: Dict[str, Any] = {
        # bound methods rather than closures over the names the del below unbinds
        "copy_gbps": 2 * nbytes / timed(functools.partial(dst.copy_, src), device) / 1e9,
        "read_gbps": nbytes / timed(src.sum, device) / 1e9,
        "peaks_tflops": {},
        "measured_on": time.strftime("%Y-%m-%d"),
        "software": {"torch": str(torch.__version__), "cuda": torch.version.cuda},
    }
    del src, dst
    n = 8192 if on_gpu else 512
    for dtype in GEMM_DTYPES if on_gpu else ("fp32",):
        try:
            seconds = timed(gemm(dtype, n, device), device, repeats=10)
            result["peaks_tflops"][dtype] = 2 * n**3 / seconds / 1e12
        except Exception as exc:  # a dtype the chip or build lacks
            result["peaks_tflops"][dtype] = None
            result.setdefault("errors", {})[dtype] = str(exc).splitlines()[0][:200]
    torch.backends.cuda.matmul.allow_tf32 = False
    result.update(launch_latency(device))
    if on_gpu:
        props = torch.cuda.get_device_properties(0)
        result["device"] = props.name
        result["l2_mib"] = props.L2_cache_size / 2**20
        result["sm_count"] = props.multi_processor_count
    return result
