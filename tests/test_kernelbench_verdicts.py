"""KernelBench problems carry two verdicts: KernelBench's own eval (pinned semantics) and kbsweep's stricter checks.

The cases are KernelBench-format files written for these tests (tests/kernelbench_cases). Each expected
``kernelbench`` verdict is what KernelBench's ``eval_kernel_against_ref`` (v0.2, commit 423217d) decides:
measured by running its ``run_and_check_correctness`` on CPU over these files (docs/kernelbench.md, "Agreement").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kbsweep.config import kernelbench_sizing
from kbsweep.config.kernelbench import cache_key, fit, kernelbench_names, materialize, materialize_all, with_sizes
from kbsweep.config.problems import load_problem
from kbsweep.grader.referee import kernelbench_eval, reference_timers
from kbsweep.grader.shared import timing
from kbsweep.sandbox.confine import SandboxPolicy
from tests.support.grading import CPU, graded

REPO = Path(__file__).resolve().parent.parent
CASES = Path(__file__).parent / "kernelbench_cases"

# (problem/solution, KernelBench's verdict, kbsweep's outcome): the classes where the two graders' verdicts differ first
EXPECTED = [
    ("1_matmul/fp16", "incorrect", "incorrect"),  # 1e-3 relative error: inside 1e-2 (v0.1), outside 1e-4 (v0.2)
    ("2_variance/biased", "incorrect", "incorrect"),  # divides by n, not n - 1
    ("5_linear_relu/half_weight_cache", "incorrect", "incorrect"),  # a lossy cache made on the first call
    ("3_softmax/zeros", "incorrect", "incorrect"),  # within 1e-2 of every probability, not within 1e-4
    ("4_batchnorm/batch_statistics", "correct", "pass"),  # training mode: batch statistics are right
    ("4_batchnorm/running_statistics", "incorrect", "incorrect"),  # eval-mode BatchNorm is not the problem
    ("4_batchnorm/affine_renamed", "correct", "pass"),
    ("5_linear_relu/renamed", "correct", "pass"),  # same seed, same weights, other names: no state-dict copy
    ("5_linear_relu/own_init", "incorrect", "incorrect"),  # other weights than the seed's
    ("6_relu/in_place", "correct", "incorrect"),  # aliases its input: kbsweep's own finding only
    ("6_relu/tuple", "incorrect", "pass"),  # KernelBench reads output.shape; kbsweep takes a 1-tuple's tensor
    ("5_linear_relu/first_call_cache", "incorrect", "incorrect"),
    ("1_matmul/exact", "correct", "pass"),
    ("2_variance/unbiased", "correct", "pass"),
    ("2_variance/off_by_one_row", "incorrect", "incorrect"),
    ("3_softmax/exact", "correct", "pass"),
    ("3_softmax/log_softmax", "incorrect", "incorrect"),
    ("6_relu/exact", "correct", "pass"),
    ("6_relu/transposed_view", "correct", "pass"),
    ("6_relu/double", "incorrect", "incorrect"),
    ("6_relu/leaky", "incorrect", "incorrect"),
    ("6_relu/nan", "incorrect", "incorrect"),
    ("6_relu/wrong_shape", "incorrect", "incorrect"),
    ("6_relu/raises", "incorrect", "runtime_error"),
    ("6_relu/syntax_error", "compile_error", "compile_error"),
    ("6_relu/no_model_new", "compile_error", "compile_error"),
]


@pytest.mark.parametrize("case, kernelbench, kbsweep", EXPECTED, ids=[case for case, _, _ in EXPECTED])
def test_both_verdicts(roofline, tmp_path, case, kernelbench, kbsweep):
    name, solution = case.split("/")
    problem = load_problem(materialize(CASES, name), "kernelbench")
    result = graded(
        problem,
        CASES / "solutions" / name / f"{solution}.py",
        CPU,
        roofline,
        mode="check",
        timeout_s=300,
        log_dir=tmp_path,
    )
    assert result["verdicts"] == {"kernelbench": kernelbench, "kbsweep": kbsweep}, json.dumps(result, default=str)[
        :2000
    ]
    assert result["kernelbench"]["semantics"]["version"] == "0.2"


def test_in_place_aliasing_is_named_in_kbsweeps_verdict(roofline, tmp_path):
    problem = load_problem(materialize(CASES, "6_relu"), "kernelbench")
    result = graded(
        problem, CASES / "solutions/6_relu/in_place.py", CPU, roofline, mode="check", timeout_s=300, log_dir=tmp_path
    )
    assert "aliases an input" in result["message"] and result["kernelbench"]["trials"] == "(5 / 5)"


def test_version_pins_the_tolerance(roofline, tmp_path):
    """Under 0.1 (atol = rtol = 1e-2) the fp16 matmul passes both verdicts; under 0.2 it fails both."""
    problem = load_problem(materialize(CASES, "1_matmul", "0.1"), "kernelbench")
    result = graded(
        problem, CASES / "solutions/1_matmul/fp16.py", CPU, roofline, mode="check", timeout_s=300, log_dir=tmp_path
    )
    assert result["verdicts"] == {"kernelbench": "correct", "kbsweep": "pass"}
    assert result["kernelbench"]["semantics"]["atol"] == 1e-2


def test_kernelbench_timer_beside_kbsweeps(roofline, tmp_path):
    """Named by the grade, KernelBench's timer times the eager baseline in the referee beside kbsweep's figure, and
    the kernelbench record carries both; the scored speedup stays kbsweep's."""
    problem = load_problem(materialize(CASES, "6_relu"), "kernelbench")
    result = graded(
        problem,
        CASES / "solutions/6_relu/exact.py",
        CPU,
        roofline,
        mode="full",
        baselines=["eager"],
        timeout_s=300,
        log_dir=tmp_path,
        timing={"min_runs": 2, "max_runs": 5, "max_time_s": 0.5},
        timers=["kernelbench"],
    )
    assert result["outcome"] == "pass", result.get("message")
    eager = result["kernelbench"]["timing"]["eager"]
    assert eager["kernelbench"]["method"] == "host_perf_counter" and eager["kernelbench"]["num_trials"] == 100
    assert eager["kernelbench"]["min_ms"] <= eager["kernelbench"]["mean_ms"] <= eager["kernelbench"]["max_ms"]
    assert eager["kbsweep_median_ms"] == result["timings"][0]["baselines"]["eager"]["median_ms"]
    assert result["speedup"]["eager"] == pytest.approx(
        eager["kbsweep_median_ms"] / result["timings"][0]["candidate"]["median_ms"], rel=1e-6
    )


def test_unknown_timer_is_one_line(roofline, tmp_path):
    problem = load_problem(materialize(CASES, "6_relu"), "kernelbench")
    with pytest.raises(Exception, match="timers: unknown timer do_bench"):
        graded(problem, CASES / "solutions/6_relu/exact.py", CPU, roofline, timers=["do_bench"], log_dir=tmp_path)


@pytest.mark.fast
def test_kernelbench_timer_counts_as_kernelbench_does():
    """5 warm-up calls, then 1 discarded and 100 timed, on the one input set given."""
    calls = []
    timed = reference_timers.time_kernelbench(lambda x: calls.append(x), [7], "cpu")
    assert len(calls) == 106 and set(calls) == {7} and timed["num_trials"] == 100


@pytest.mark.fast
def test_trial_seeds_are_kernelbenchs():
    """KernelBench seeds the global generator with its seed and draws one randint(0, 2**32 - 1) per trial."""
    torch.manual_seed(42)
    drawn = [torch.randint(0, 2**32 - 1, (1,)).item() for _ in range(5)]
    assert kernelbench_eval.trial_seeds(42, 5) == drawn


def test_unknown_version_is_one_line():
    with pytest.raises(Exception, match="track.kernelbench_version: unknown KernelBench version '9.9'"):
        materialize(CASES, "6_relu", "9.9")


@pytest.mark.fast
def test_numeric_order():
    assert kernelbench_names(CASES) == ["1_matmul", "2_variance", "3_softmax", "4_batchnorm", "5_linear_relu", "6_relu"]


def test_cache_follows_solutions(tmp_path):
    (tmp_path / "10_relu.py").write_text((CASES / "6_relu.py").read_text())
    before = cache_key(tmp_path / "10_relu.py", tmp_path / "solutions/10_relu", "0.2", "fp32")
    (tmp_path / "solutions/10_relu").mkdir(parents=True)
    (tmp_path / "solutions/10_relu/exact.py").write_text((CASES / "solutions/6_relu/exact.py").read_text())
    assert cache_key(tmp_path / "10_relu.py", tmp_path / "solutions/10_relu", "0.2", "fp32") != before
    assert "exact" in load_problem(materialize(tmp_path, "10_relu"), "kernelbench").solutions()


def test_smoke_sizes_fit_the_budget(tmp_path):
    """Module-level sizes halved, largest first, until parameters + inputs + output fit; derived constants follow."""
    source = (CASES / "4_batchnorm.py").read_text().replace("batch_size = 8", "batch_size = 2048 * 2")
    (tmp_path / "9_big_bn.py").write_text(source + "\nbias_shape = (features, height)\n")
    fitted = fit(tmp_path / "9_big_bn.py", budget=1 << 20)
    assert fitted["fits"] and fitted["bytes"] <= 1 << 20 < fitted["full_bytes"]
    assert (
        fitted["sizes"]["batch_size"] < 4096 and "features" not in fitted["sizes"] or fitted["sizes"]["features"] >= 8
    )
    rewritten = with_sizes(source + "\nbias_shape = (features, height)\n", {"height": 8})
    assert "height = 8" in rewritten and "width = 16" in rewritten and "bias_shape = (features, height)" in rewritten


TIED = """import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, predictions, targets):  # (rows, cols) * (rows,): broadcasts only while cols == rows
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))

rows = 4096
feature_shape = (4096,)
kernel_shape = (3, 64)

def get_inputs():
    return [torch.rand(rows, *feature_shape), torch.rand(rows)]

def get_init_inputs():
    return []
"""


@pytest.mark.fast
def test_sizes_tied_by_broadcasting_are_halved_together(tmp_path):
    """A tuple's integer elements are sizes too (``name[i]``); a step that breaks the forward alone is taken with
    every size of the same value, so a file whose sizes only work together still fits (KernelBench's HingeLoss)."""
    (tmp_path / "7_tied.py").write_text(TIED)
    fitted = fit(tmp_path / "7_tied.py", budget=1 << 20)
    assert fitted["full_bytes"] > 64 << 20 and fitted["fits"], fitted
    sizes = fitted["sizes"]
    assert sizes["rows"] == sizes["feature_shape[0]"] < 4096 and "kernel_shape[1]" not in sizes, (
        sizes
    )  # 64 never had to move
    rewritten = with_sizes(TIED, sizes)
    assert f"feature_shape = ({sizes['rows']},)" in rewritten and "kernel_shape = (3, 64)" in rewritten
    untied = with_sizes(TIED, {"rows": 512})  # alone, the forward no longer broadcasts
    with pytest.raises(RuntimeError):
        namespace = {}
        exec(compile(untied, "untied", "exec"), namespace)  # noqa: S102 - test data
        namespace["Model"]()(*namespace["get_inputs"]())


@pytest.mark.fast
def test_smoke_sizes_fit_the_flop_budget(tmp_path):
    """A compute-bound file within the byte budget is halved until one forward (counted on meta) fits the FLOPs."""
    fitted = fit(CASES / "1_matmul.py", flop_budget=4e6)
    assert fitted["full_flops"] == 2 * 256**3 and fitted["full_bytes"] < 1 << 20  # over the FLOPs, not the bytes
    assert (
        fitted["fits"] and fitted["flops"] <= 4e6 and fitted["sizes"] and all(v < 256 for v in fitted["sizes"].values())
    )
    sizes = fitted["sizes"]
    assert fitted["flops"] == 2 * sizes.get("M", 256) * sizes.get("K", 256) * sizes.get("N", 256)


def test_one_sizing_child_for_a_folder_cached_by_content(tmp_path, monkeypatch):
    """Files are sized together in one child; a file that kills the child is that file's error alone; a second
    listing reads every successful fit from the cache (no child), and an edited file is sized again."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # a cache of its own
    monkeypatch.setattr(kernelbench_sizing.tempfile, "tempdir", None)
    big = (CASES / "6_relu.py").read_text().replace("batch_size = 16", "batch_size = 4096 * 8")
    for name, text in (
        ("1_big", big),
        ("2_dies", "import os\nos._exit(9)\n"),
        ("3_relu", (CASES / "6_relu.py").read_text()),
    ):
        (tmp_path / f"{name}.py").write_text(text)
    children = []
    real = kernelbench_sizing.fit_in_child
    monkeypatch.setattr(kernelbench_sizing, "fit_in_child", lambda files: children.append(list(files)) or real(files))
    names = ["1_big", "2_dies", "3_relu"]
    folders = materialize_all(tmp_path, names)
    assert children == [
        [tmp_path / f"{n}.py" for n in names],
        [tmp_path / "3_relu.py"],
    ]  # after the death, a child for the rest
    fitted = {f.name: json.loads((f / "fit.json").read_text()) for f in folders}
    assert fitted["1_big"]["fits"] and fitted["1_big"]["sizes"]["batch_size"] < 4096 * 8
    relu = fitted["3_relu"]
    assert (
        "exit code 9" in fitted["2_dies"]["error"]
        and relu["sizes"] == {}
        and relu["fits"]
        and relu["bytes"] == relu["full_bytes"]
    )
    children.clear()
    (tmp_path / "1_big.py").write_text(big.replace("dim = 1024", "dim = 512"))
    materialize_all(tmp_path, names)
    assert children == [[tmp_path / "1_big.py", tmp_path / "2_dies.py"]]  # the edited file and the failure, not 3_relu


@pytest.mark.fast
def test_fast_p_and_geomean_follow_kernelbenchs_verdict():
    """Correctness by KernelBench's verdict; the speedup of a cell kbsweep failed but KernelBench calls correct is
    its KernelBench-only timing (``kernelbench_speedup_*``); a pass logged before that metric existed: kbsweep's."""
    from kbsweep.reporting.report import kernelbench_metrics

    def row(kb, kbsweep, eager=None, compile_=None, kb_eager=None):
        found = {
            "model": "m",
            "params": {"track.problems_dir": "/x/level1"},
            "verdict.kernelbench": kb,
            "verdict.kbsweep": kbsweep,
            "speedup_eager": eager,
            "speedup_compile": compile_,
        }
        return {**found, "kernelbench_speedup_eager": kb_eager} if kb_eager else found

    rows = [
        row("correct", "pass", 2.5, 1.0),
        row("correct", "pass", 1.2, 0.25),
        row("correct", "incorrect"),
        row("correct", "incorrect", kb_eager=1.6),
        row("incorrect", "incorrect"),
    ]
    (entry,) = kernelbench_metrics(rows)
    assert entry["level"] == "level1" and entry["cells"] == 5 and entry["correct"] == 4 and entry["kbsweep_passed"] == 2
    assert (entry["fast_0"], entry["fast_1"], entry["fast_1.5"], entry["fast_2"]) == (0.8, 0.6, 0.4, 0.2)
    assert entry["geomean_eager"] == pytest.approx((2.5 * 1.2 * 1.6) ** (1 / 3)) and entry[
        "geomean_compile"
    ] == pytest.approx(0.5)


def test_kernelbench_correct_kbsweep_failed_is_timed_for_kernelbench_only(roofline, tmp_path):
    """The in-place ReLU (KernelBench: correct; kbsweep: aliases its input) is timed as KernelBench would time it:
    its speedup goes into the kernelbench record, kbsweep's outcome, score and speedups stay failed."""
    problem = load_problem(materialize(CASES, "6_relu"), "kernelbench")
    quick = {"min_runs": 2, "max_runs": 5, "max_time_s": 0.5}
    result = graded(
        problem,
        CASES / "solutions/6_relu/in_place.py",
        CPU,
        roofline,
        mode="full",
        baselines=["eager"],
        timeout_s=300,
        log_dir=tmp_path / "in_place",
        timing=quick,
    )
    assert (
        result["verdicts"] == {"kernelbench": "correct", "kbsweep": "incorrect"}
        and result["score"] is None
        and "speedup" not in result
    )
    timed = result["kernelbench"]["candidate_timing"]
    assert timed["candidate"]["calls"] >= 2 and timed["baselines"]["eager"]["median_ms"] > 0
    if timed["findings"]:  # the referee's clock disagreed with the figures (a loaded machine): no speedup is believed
        assert [f["kind"] for f in timed["findings"]] == ["time_disagreement"] and result["kernelbench"][
            "speedup"
        ] == {}
    else:
        assert result["kernelbench"]["speedup"]["eager"] == pytest.approx(
            timed["baselines"]["eager"]["median_ms"] / timed["candidate"]["median_ms"]
        )
    wrong = graded(
        problem,
        CASES / "solutions/6_relu/double.py",
        CPU,
        roofline,
        mode="full",
        baselines=["eager"],
        timeout_s=300,
        log_dir=tmp_path / "double",
        timing=quick,
    )
    assert wrong["verdicts"]["kernelbench"] == "incorrect" and "candidate_timing" not in wrong["kernelbench"]


# Forward calls per stage of a CPU grade of a KernelBench problem, as its checks need them (candidate, reference)
PASS_FORWARDS = {
    "import_candidate": (0, 0),
    "baselines": (0, timing.KERNELBENCH_HOST_RUNS),  # the eager reference timed: one host batch, no warm-up batch
    "kernelbench_correctness": (5, 5 + 1),  # KernelBench's 5 trials; the reference once more on the first timing inputs
    # 3 public seeds + the secret one; the stale-memory probe's call on the first timing inputs and its repeat on the
    # nominal ones; the pointer-cache probe's 11 warm calls and the calls after a few elements, then all, changed in place
    "correctness": (4 + 2 + 13, 4 + 1 + 1),  # the reference once more on the inputs a few elements changed
    "timing": (timing.KERNELBENCH_HOST_RUNS, 2),  # one host batch, 2 calls picked and compared
    "audit": (4, 1),  # a checked call, the two ghost replays, the checked call on their fresh inputs
}


def forwards(result):
    return {
        stage: (v["candidate_calls"], v["reference_calls"])
        for stage, v in result["evidence"]["stages"].items()
        if stage != "load_reference"
    }


def test_a_grade_makes_the_forwards_its_checks_need(roofline, tmp_path):
    """Counted by the referee per stage: no reference forward whose output is already known is run again (the
    nominal seed's output serves the poison and pointer-cache probes, the first timing inputs' output the arena's
    size, the timed calls' and the audit's comparisons), and a failed grade stops where its check failed."""
    problem = load_problem(materialize(CASES, "6_relu"), "kernelbench")
    passed = graded(
        problem,
        CASES / "solutions/6_relu/exact.py",
        CPU,
        roofline,
        mode="full",
        baselines=["eager"],
        timeout_s=300,
        log_dir=tmp_path / "exact",
    )
    assert passed["outcome"] == "pass", passed.get("message")
    assert forwards(passed) == PASS_FORWARDS
    assert passed["evidence"]["probe"]["calls"] == sum(c for c, _ in PASS_FORWARDS.values()) == 36
    wrong = graded(
        problem,
        CASES / "solutions/6_relu/leaky.py",
        CPU,
        roofline,
        mode="full",
        baselines=["eager"],
        timeout_s=300,
        log_dir=tmp_path / "leaky",
    )
    assert wrong["outcome"] == "incorrect" and wrong["kernelbench"]["trials"] == "(0 / 5)"
    assert forwards(wrong) == {
        **{k: PASS_FORWARDS[k] for k in ("import_candidate", "baselines", "kernelbench_correctness")},
        "correctness": (1, 1),
    }


WRITES_PAST_THE_CAP = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        with open("spill.bin", "wb") as f:  # one byte at 8 MiB, past a 4 MiB cap on any one file (sparse: no disk used)
            f.seek(8 << 20)
            f.write(b"x")
        return torch.relu(x)
"""


def test_a_candidate_writing_past_the_file_cap_is_a_runtime_error_naming_the_cap(roofline, tmp_path):
    problem = load_problem(materialize(CASES, "6_relu"), "kernelbench")
    (tmp_path / "spill.py").write_text(WRITES_PAST_THE_CAP)
    result = graded(
        problem,
        tmp_path / "spill.py",
        CPU,
        roofline,
        mode="check",
        timeout_s=300,
        log_dir=tmp_path / "grade",
        sandbox=SandboxPolicy(disk_mib=4),
    )  # the referee's arena for 6_relu: 3.5 MiB, within it
    assert result["outcome"] == "runtime_error", result.get("message")
    assert "file size cap of 4194304 bytes (4 MiB, sandbox.disk_mib) reached writing a file" in result["message"]


def test_a_kernelbench_reference_too_big_for_the_file_cap_names_the_cap_and_the_arena(roofline, tmp_path):
    """The referee's shared arena is a memfd: a file under the same cap. 4 MiB inputs (within the smoke budget, so
    not scaled down) under a 1 MiB cap: a harness_error that says so, not a bare ``OSError: File too large``."""
    folder = tmp_path / "problems"
    folder.mkdir()
    (folder / "6_relu.py").write_text((CASES / "6_relu.py").read_text().replace("dim = 1024", "dim = 65536"))
    problem = load_problem(materialize(folder, "6_relu"), "kernelbench")
    result = graded(
        problem,
        CASES / "solutions/6_relu/exact.py",
        CPU,
        roofline,
        mode="check",
        timeout_s=300,
        log_dir=tmp_path / "grade",
        sandbox=SandboxPolicy(disk_mib=1),
    )
    assert result["outcome"] == "harness_error", result.get("message")
    assert (
        "file size cap of 1048576 bytes (1 MiB, sandbox.disk_mib) reached writing the shared arena" in result["message"]
    )
