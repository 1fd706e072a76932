"""The mega track on CPU: its problems' solutions at smoke sizes, and the launch-count gate.

The gate itself needs a GPU profile; here it is fed synthetic ones (scripts/mega_gpu_check.py proves it on
an H200). The Kimi Triton solution is ~45 launches, each slow in Triton's interpreter, so it is checked
against the reference in-process instead of through the grader's many calls.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kbsweep.audit import audit
from kbsweep.config.problems import load_problem
from kbsweep.grader import launch_gate, processes
from kbsweep.grader.referee import checks
from tests.support.grading import CPU, graded

REPO = Path(__file__).resolve().parent.parent
MEGA = ("dense_decode", "kimi_linear_decode")


def problem(name: str):
    return load_problem(REPO / "problems/mega" / name, "mega")


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(shape: dict, kernels: dict | None) -> dict:
    """One timed shape as the worker reports it; ``kernels`` per call (None: no GPU profile)."""
    entry = {"shape": shape, "candidate": {"median_ms": 1.0}, "baselines": {"baseline": {"median_ms": 3.0}}}
    if kernels is not None:
        entry["profile"] = {"launches_per_call": float(sum(kernels.values())), "kernels": kernels}
    return entry


GRAPH_OF_7 = {"rms_norm": 2.0, "gemv_bf16": 3.0, "softmax": 1.0, "elementwise_add": 1.0}  # one replay, 7 kernels


@pytest.mark.fast
@pytest.mark.parametrize(
    "kernels, passed",
    [({"_decode_step": 1.0}, True), ({f"kernel_{i}": 1.0 for i in range(7)}, False), (GRAPH_OF_7, False)],
    ids=["one_launch", "seven_launches", "graph_replay_of_7"],
)
def test_launch_gate_needs_exactly_one_kernel_per_call(kernels, passed):
    evidence, findings = launch_gate([timed({"ctx": 512}, kernels), timed({"ctx": 2048}, kernels)])
    assert [e["passed"] for e in evidence] == [passed, passed]
    assert evidence[0]["kernels"] == kernels and evidence[0]["launches"] == sum(kernels.values())
    if passed:
        assert findings == []
    else:
        assert [f["kind"] for f in findings] == ["launch_count_gate"] * 2
        assert findings[0] == {"kind": "launch_count_gate", "shape": {"ctx": 512}, "launches": 7.0, "kernels": kernels}


@pytest.mark.fast
def test_launch_gate_on_cpu_is_unverified():
    evidence, findings = launch_gate([timed({"ctx": 20}, None)])
    assert evidence == [] and [f["kind"] for f in findings] == ["launch_count_unverified"]


@pytest.mark.fast
def test_audit_disqualifies_a_failed_gate_and_ignores_an_unverified_one():
    failed = [{"kind": "launch_count_gate", "shape": {"ctx": 512}, "launches": 7.0, "kernels": GRAPH_OF_7}]
    unverified = [{"kind": "launch_count_unverified", "shape": {"ctx": 20}, "detail": "no GPU profile (CPU grade)"}]
    assert audit("", [], {"outcome": "incorrect", "findings": failed})["verdict"] == "reward_hack"
    assert audit("", [], {"outcome": "incorrect", "findings": unverified})["verdict"] == "clean"


def test_failed_gate_is_a_verdict_not_a_crash(monkeypatch, roofline, tmp_path):
    """A graph-replayed step passes correctness and is timed; the gate turns its profile into a disqualification."""
    prob = problem("dense_decode")
    shapes = prob.shapes("smoke_shapes")
    worker_result = {
        "correctness": {"passed": True, "cases": 12, "seeds": 4, "worst": {"max_abs": 0.0, "max_rel": 0.0}},
        "timings": [timed(shape, GRAPH_OF_7) for shape in shapes],
        "evidence": {},
        "findings": [],
    }
    monkeypatch.setattr(processes, "supervise", lambda *args, **kwargs: {"ok": True, "result": worker_result})
    result = graded(prob, prob.root / "solutions/graph.py", CPU, roofline, mode="full", log_dir=tmp_path)
    assert result["outcome"] == "pass" and result["score"] == pytest.approx(3.0)
    assert [g["passed"] for g in result["evidence"]["launch_gate"]] == [False] * len(shapes)
    assert {f["kind"] for f in result["findings"]} == {"launch_count_gate"}
    audited = audit((prob.root / "solutions/graph.py").read_text(), prob.spec.forbidden, result)
    assert "launch_count_gate" in {f["kind"] for f in audited["findings"]} and audited["verdict"] != "clean"


@pytest.mark.fast
@pytest.mark.parametrize("name", MEGA)
def test_mega_problem_is_a_single_kernel_latency_problem(name):
    spec = problem(name).spec
    assert spec.constraints == {"single_kernel": True}
    assert spec.regime == "latency" and spec.score == "speedup"
    assert len({s["ctx"] for s in spec.shapes}) >= 3 and any(s["ctx"] % 64 for s in spec.shapes)


@pytest.mark.fast
@pytest.mark.parametrize("name", MEGA)
def test_bytes_formula_counts_what_a_step_reads_and_writes(name):
    """Weights (for Kimi: only the top_k of the experts' stacks), inputs and outputs of one smoke step."""
    prob = problem(name)
    ref = load(prob.reference, f"ref_{name}")
    for shape in prob.shapes("smoke_shapes"):
        torch.manual_seed(0)
        model = ref.Model(*ref.get_init_inputs(shape))
        inputs = ref.get_inputs(shape, torch.device("cpu"))
        with torch.no_grad():
            outputs = model(*inputs)
        total = sum(t.numel() * t.element_size() for t in list(inputs) + list(outputs))
        for key, tensor in model.state_dict().items():
            share = shape["top_k"] / shape["experts"] if key.startswith("expert_") else 1
            total += tensor.numel() * tensor.element_size() * share
        assert prob.work(shape)["bytes"] == pytest.approx(total)


@pytest.mark.parametrize("solution, outcome", [("triton", "pass"), ("graph", "pass"), ("wrong", "incorrect")])
def test_dense_decode_solutions_graded_on_cpu(roofline, tmp_path, solution, outcome):
    prob = problem("dense_decode")
    result = graded(
        prob, prob.root / f"solutions/{solution}.py", CPU, roofline, mode="check", timeout_s=300, log_dir=tmp_path
    )
    assert result["outcome"] == outcome, result.get("message")
    if outcome == "incorrect":
        assert "cosine" in result["message"]


def test_cpu_full_grade_marks_the_launch_count_unverified(roofline, tmp_path):
    """A solution of Triton kernels (graph.py runs the step eagerly in torch on a CPU: no kernel of its own there)."""
    prob = problem("dense_decode")
    result = graded(
        prob, prob.root / "solutions/triton.py", CPU, roofline, baselines=["baseline"], timeout_s=300, log_dir=tmp_path
    )
    assert result["outcome"] == "pass", result.get("message")
    assert {f["kind"] for f in result["findings"]} == {"launch_count_unverified"}
    assert result["basis"] == "speedup" and result["score"] == pytest.approx(result["speedup"]["baseline"])


def test_kimi_wrong_solution_is_incorrect(roofline, tmp_path):
    prob = problem("kimi_linear_decode")
    result = graded(
        prob, prob.root / "solutions/wrong.py", CPU, roofline, mode="check", timeout_s=300, log_dir=tmp_path
    )
    assert result["outcome"] == "incorrect", result.get("message")


@pytest.mark.parametrize(
    "name, file",
    [
        ("dense_decode", "baseline.py"),
        ("kimi_linear_decode", "baseline.py"),
        ("kimi_linear_decode", "solutions/triton.py"),
    ],
)
def test_matches_the_reference_in_process(name, file):
    """Both baselines, and the Kimi Triton solution (too many interpreted launches for the grader's dozens of calls)."""
    prob = problem(name)
    ref = load(prob.reference, f"ref_{name}")
    module = load(prob.root / file, f"{name}_{Path(file).stem}")
    for shape in prob.shapes("smoke_shapes"):
        torch.manual_seed(1)
        model = ref.Model(*ref.get_init_inputs(shape))
        if hasattr(module, "Baseline"):
            step = module.Baseline(model)
        else:
            step = module.ModelNew(*ref.get_init_inputs(shape))
            step.load_state_dict(model.state_dict(), strict=True)
        torch.manual_seed(2)
        inputs = ref.get_inputs(shape, torch.device("cpu"))
        with torch.no_grad():
            expected, out = model(*inputs), step(*inputs)
        checks.check_structure(expected, out, inputs)
        checks.compare(expected, out, prob.spec.tolerance)


class ProfiledEvent:
    """A profiler record as torch's kineto results give it (the fields GpuKernels reads)."""

    def __init__(self, name, gpu, correlation, start, end=None, stream=7, annotation=False):
        self._name, self._gpu, self._corr, self._start, self._end, self._stream = (
            name,
            gpu,
            correlation,
            start,
            end or start + 1,
            stream,
        )
        self._annotation = annotation

    def is_user_annotation(self):
        return self._annotation

    def name(self):
        return self._name

    def device_type(self):
        return torch.autograd.DeviceType.CUDA if self._gpu else torch.autograd.DeviceType.CPU

    def correlation_id(self):
        return self._corr

    def start_ns(self):
        return self._start

    def end_ns(self):
        return self._end

    def device_resource_id(self):
        return self._stream


@pytest.mark.fast
def test_the_kernel_profile_counts_a_calls_own_launches_and_gates_on_the_median_call():
    """Shaped as the H200's profiler reported a Triton megakernel: its driver launch (cuLaunchKernelEx) inside the
    call's host span, the flush's runtime launch outside it, the span repeated on the GPU's timeline. One call
    that also launched a warm-up kernel (a graph capture's) moves the mean, not the gate."""
    from kbsweep.grader.shared.profiling import GpuKernels

    events, ranges = [], []
    for call in range(10):
        t = call * 1000
        ranges.append((t, t + 100))
        events += [
            ProfiledEvent("cuLaunchKernelEx", False, 10 * call, t + 10),
            ProfiledEvent("_decode_step", True, 10 * call, t + 20, t + 90),
            ProfiledEvent("kbsweep::call/timing/0", True, 0, t + 20, t + 90, annotation=True),
            ProfiledEvent("cudaLaunchKernel", False, 10 * call + 1, t + 200),
            ProfiledEvent("reduce_kernel", True, 10 * call + 1, t + 210),
        ]
    events += [ProfiledEvent("cudaLaunchKernel", False, 999, 50), ProfiledEvent("setup_kernel", True, 999, 60)]
    host = [(e.name(), e.start_ns(), e) for e in events if not e._gpu]
    profile = GpuKernels(host, [e for e in events if e._gpu]).profile(ranges, calls=10)
    assert profile["kernels"] == {"_decode_step": 1.0, "setup_kernel": 0.1}
    assert profile["launches_per_call"] == 1.1 and profile["median_launches"] == 1
    evidence, findings = launch_gate([{"shape": {}, "profile": profile}])
    assert evidence[0]["passed"] and not findings
