"""GPU MODE KernelBot problem folders as kbsweep problems (track=gpumode, docs/gpumode.md).

The four problems under problems/gpumode_sample are gpu-mode/reference-kernels' pmpp_v2 vectoradd_py, grayscale_py,
histogram_py and prefixsum_py (commit f83cb92, their LICENSE beside them). On CPU, in their scaled-down smoke
shapes: their own submission passes kbsweep's grade and a wrong one fails it, and GPU MODE's own test pass
(``own_verdict``: their eval's ``_run_single_test`` over their task.yml tests) gives the same verdicts.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from kbsweep.config import gpumode
from kbsweep.config.gpumode_adapter import load_modules, own_verdict
from kbsweep.config.problems import load_problem
from kbsweep.errors import KbsweepError
from tests.support.grading import CPU, graded

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "problems/gpumode_sample"
# (problem, solution as a bridged file's stem, their folder's file for their eval, expected verdict)
CASES = [
    ("vectoradd_py", "submission", "submission.py", "pass"),
    ("vectoradd_py", "wrong", None, "incorrect"),
    ("grayscale_py", "submission", "submission.py", "pass"),
    ("grayscale_py", "wrong_empty", "solutions/wrong/empty.py", "incorrect"),
    ("histogram_py", "correct_ref", "solutions/correct/ref.py", "pass"),
    ("histogram_py", "wrong_empty", "solutions/wrong/empty.py", "incorrect"),
    ("prefixsum_py", "submission", "submission.py", "pass"),
    ("prefixsum_py", "wrong", None, "incorrect"),
]


def test_the_sample_lists_four_problems_with_their_licence():
    assert gpumode.gpumode_names(SAMPLE) == ["grayscale_py", "histogram_py", "prefixsum_py", "vectoradd_py"]
    assert "Researcher Reciprocity License" in (SAMPLE / "LICENSE").read_text()


def test_shapes_come_from_the_task_file():
    problem = load_problem(gpumode.materialize_all(SAMPLE, ["vectoradd_py"])[0], "gpumode")
    assert problem.shapes("shapes")[0] == {"size": 1024}  # task.yml's first benchmark, its seed left out
    assert problem.shapes("smoke_shapes") == [{"size": 127}, {"size": 128}]
    assert {"size": 256} in problem.spec.held_out_shapes and problem.spec.gpumode["ranked_timeout"] == 420
    assert {"submission", "reference", "wrong", "correct_submission_triton"} <= set(problem.solutions())


def test_every_sample_problem_holds_out_a_gpu_and_a_smoke_shape():
    for root in gpumode.materialize_all(SAMPLE, gpumode.gpumode_names(SAMPLE)):
        problem = load_problem(root, "gpumode")
        assert problem.held_out_shapes("shapes") and problem.spec.held_out_smoke_shapes, problem.id
        assert not [s for s in problem.held_out_shapes("smoke_shapes") if s in problem.shapes("smoke_shapes")]


def test_smoke_shapes_are_scaled_to_the_cpu_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(gpumode, "SMOKE_BYTES", 2**16)
    monkeypatch.setattr(gpumode, "cache_root", lambda: tmp_path)
    problem = load_problem(gpumode.materialize_all(SAMPLE, ["grayscale_py"])[0], "gpumode")
    assert all(s["size"] * s["size"] * 16 <= 2**16 for s in problem.shapes("smoke_shapes"))


@pytest.mark.parametrize("name, solution, theirs, expected", CASES, ids=[f"{c[0]}/{c[1]}" for c in CASES])
def test_kbsweep_and_their_eval_agree(roofline, tmp_path, name, solution, theirs, expected):
    problem = load_problem(gpumode.materialize_all(SAMPLE, [name])[0], "gpumode")
    result = graded(
        problem, problem.solutions()[solution], CPU, roofline, mode="check", timeout_s=300, log_dir=tmp_path
    )
    assert result["outcome"] == expected, json.dumps(result, default=str)[:2000]
    task = gpumode.read_task(SAMPLE / name)
    folder = tmp_path / "theirs"  # their eval's folder: the files task.yml lists, the submission as submission.py
    folder.mkdir()
    for file_name, source in task["files"].items():
        shutil.copy2(source, folder / file_name)
    shutil.copy2(SAMPLE / name / (theirs or "submission.py"), folder / "submission.py")
    kernel = load_modules(folder, ("submission",))["submission"].custom_kernel
    if theirs is None:  # kbsweep's generated wrong solution: their submission's output plus one
        kernel = lambda data, right=kernel: right(data) + 1  # noqa: E731
    verdict = own_verdict(folder, kernel, task["tests"], "cpu")
    assert verdict["verdict"] == ("correct" if expected == "pass" else "incorrect"), verdict


def test_a_wrong_checker_verdict_is_the_grades_message(roofline, tmp_path):
    """The problem's own check_implementation decides: its message is the grade's."""
    problem = load_problem(gpumode.materialize_all(SAMPLE, ["grayscale_py"])[0], "gpumode")
    result = graded(problem, problem.solutions()["wrong"], CPU, roofline, mode="check", timeout_s=300, log_dir=tmp_path)
    assert result["outcome"] == "incorrect" and "mismatch found" in result["message"], result["message"]


def broken(tmp_path: Path, edit) -> Path:
    folder = tmp_path / "deck"
    shutil.copytree(SAMPLE, folder)
    task = folder / "vectoradd_py/task.yml"
    task.write_text(edit(task.read_text()))
    return folder


@pytest.mark.parametrize(
    "edit, expected",
    [
        (
            lambda t: t.replace('"../utils.py"', '"../missing.py"'),
            "task.yml: key 'files[2].source': ../missing.py not found",
        ),
        (
            lambda t: t.replace('{"size": 128, "seed": 5236}', '{"size": "big", "seed": 5236}'),
            "key 'tests[1].size': must be an integer >= 1",
        ),
        (lambda t: t.replace("benchmarks:", "benchmarks_gone:"), "key 'benchmarks': a non-empty list"),
        (
            lambda t: t.replace('{"size": 1024, "seed": 31232}', '{"n": 1024, "seed": 31232}'),
            "key 'benchmarks[0]': keys ['n'] differ",
        ),
        (lambda t: t.replace("tests:", "tests: {"), "task.yml: not valid YAML"),
    ],
)
def test_a_malformed_folder_is_one_line_naming_the_file_and_key(tmp_path, edit, expected):
    folder = broken(tmp_path, edit)
    with pytest.raises(KbsweepError) as caught:
        gpumode.materialize_all(folder, ["vectoradd_py"])
    message = str(caught.value)
    assert expected in message and "\n" not in message and str(folder / "vectoradd_py/task.yml") in message


def test_a_generator_that_raises_is_one_line(tmp_path):
    folder = tmp_path / "deck"
    shutil.copytree(SAMPLE, folder)
    reference = folder / "vectoradd_py/reference.py"
    reference.write_text(reference.read_text().replace("gen.manual_seed(seed)", "raise ValueError('no generator')"))
    with pytest.raises(
        KbsweepError, match=r"reference.py: key 'generate_input': fails on the task's shapes: ValueError: no generator$"
    ):
        gpumode.materialize_all(folder, ["vectoradd_py"])


def test_data_that_is_one_tensor_is_the_one_input(roofline, tmp_path, monkeypatch):
    """A generator returning one tensor (their pmpp grayscale's layout): no buffers, ``ModelNew(None)``, the tensor
    passed as the data itself."""
    monkeypatch.setattr(gpumode, "cache_root", lambda: tmp_path / "cache")
    folder = tmp_path / "deck" / "double_py"
    folder.mkdir(parents=True)
    shutil.copy2(SAMPLE / "utils.py", folder.parent / "utils.py")
    (folder / "task.py").write_text("import torch\ninput_t = torch.Tensor\noutput_t = torch.Tensor\n")
    (folder / "reference.py").write_text(
        "import torch\nfrom task import input_t, output_t\nfrom utils import make_match_reference\n\n\n"
        "def ref_kernel(data: input_t) -> output_t:\n    return data * 2\n\n\n"
        "def generate_input(size: int, seed: int) -> input_t:\n    gen = torch.Generator(device='cuda')\n"
        "    gen.manual_seed(seed)\n    return torch.randn(size, device='cuda', generator=gen)\n\n\n"
        "check_implementation = make_match_reference(ref_kernel)\n"
    )
    (folder / "submission.py").write_text(
        "from task import input_t, output_t\n\n\ndef custom_kernel(data: input_t) -> output_t:\n"
        "    return data + data\n"
    )
    (folder / "task.yml").write_text(
        'files:\n  - {"name": "submission.py", "source": "@SUBMISSION@"}\n  - {"name": "task.py", "source": "task.py"}\n'
        '  - {"name": "utils.py", "source": "../utils.py"}\n  - {"name": "reference.py", "source": "reference.py"}\n'
        'lang: "py"\ntests:\n  - {"size": 100, "seed": 1}\n  - {"size": 200, "seed": 2}\n  - {"size": 300, "seed": 3}\n'
        'benchmarks:\n  - {"size": 4096, "seed": 4}\n'
    )
    problem = load_problem(gpumode.materialize_all(folder.parent, ["double_py"])[0], "gpumode")
    for solution, expected in (("submission", "pass"), ("wrong", "incorrect")):
        result = graded(
            problem,
            problem.solutions()[solution],
            CPU,
            roofline,
            mode="check",
            timeout_s=300,
            log_dir=tmp_path / solution,
        )
        assert result["outcome"] == expected, result.get("message")


def test_a_scored_grade_carries_their_leaderboard_figure(roofline, tmp_path):
    """A full grade of their vectoradd Triton submission: beside kbsweep's score (none on CPU, where no baseline is timed
    for its speedup), the geometric mean (their default ``ranking_by``) of the benchmark shapes' times (held-out
    shapes, which their leaderboard never times, are left out: :func:`test_their_ranking_criteria`)."""
    problem = load_problem(gpumode.materialize_all(SAMPLE, ["vectoradd_py"])[0], "gpumode")
    result = graded(
        problem, problem.solutions()["correct_submission_triton"], CPU, roofline, timeout_s=600, log_dir=tmp_path
    )
    assert result["outcome"] == "pass", result.get("message")
    benchmarks = [s["ms"] for s in result["shapes"] if not s.get("held_out")]
    assert len(benchmarks) >= 2
    figure = result["gpumode"]
    assert figure["ranking_by"] == "geom" and figure["benchmarks"] == len(benchmarks)
    assert figure["ms"] == pytest.approx(math.prod(benchmarks) ** (1 / len(benchmarks)))


def test_their_ranking_criteria():
    from kbsweep.score.roofline import ShapeScore, gpumode_ranking

    shapes = [ShapeScore({"n": n}, ms, None, None, None, None, None) for n, ms in ((1, 2.0), (2, 8.0), (3, 1.0))]
    shapes[2].held_out = True
    assert gpumode_ranking(shapes, None)["ms"] == pytest.approx(4.0)
    assert gpumode_ranking(shapes, "mean")["ms"] == pytest.approx(5.0)
    assert gpumode_ranking(shapes, "LAST")["ms"] == pytest.approx(8.0)
    unknown = gpumode_ranking(shapes, "median")
    assert unknown["ms"] is None and "'median'" in unknown["note"]
