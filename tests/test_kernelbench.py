"""KernelBench single-file problems run through the same matrix, grader and tracking; scored as speedups."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "problems/kernelbench_sample"


def test_plan_lists_the_folder(cli, outputs):
    proc = cli("plan", "track=kernelbench")
    assert proc.returncode == 0, proc.stderr
    for name in ("1_relu", "2_matmul_bias", "3_row_sum"):
        assert f"kernelbench/{name} · cpu" in proc.stdout


def test_grade_scores_speedup_only(cli, outputs):
    proc = cli(
        "grade",
        "track=kernelbench",
        "problem=kernelbench/3_row_sum",
        f"solution={SAMPLE}/solutions/3_row_sum/triton.py",
        "gpu=cpu",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["outcome"] == "pass" and result["basis"] == "speedup"
    assert result["score"] == result["speedup"]["eager"] > 0
    assert all(s["fraction"] is None for s in result["shapes"])


def test_wrong_kernelbench_solution_fails(cli, outputs, tmp_path):
    wrong = tmp_path / "wrong.py"
    wrong.write_text((SAMPLE / "solutions/1_relu/triton.py").read_text().replace("tl.maximum(x, 0.0)", "x"))
    proc = cli("grade", "track=kernelbench", "problem=kernelbench/1_relu", f"solution={wrong}", "gpu=cpu")
    assert json.loads(proc.stdout)["outcome"] == "incorrect"


def test_relative_outputs_folder(cli, outputs, tmp_path):
    """KBSWEEP_OUTPUTS relative to the caller's folder: the zygotes fork elsewhere, and every grade was a harness_error."""
    proc = cli(
        "grade",
        "track=kernelbench",
        "problem=kernelbench/1_relu",
        f"solution={SAMPLE}/solutions/1_relu/triton.py",
        "gpu=cpu",
        cwd=tmp_path,
        env={"KBSWEEP_OUTPUTS": "relative-outputs"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "relative-outputs/grades").is_dir()


def test_sweep_over_an_outside_folder(cli, outputs, tmp_path):
    deck = tmp_path / "level0"
    deck.mkdir()
    (deck / "7_relu.py").write_text((SAMPLE / "1_relu.py").read_text())
    (deck / "solutions/7_relu").mkdir(parents=True)
    (deck / "solutions/7_relu/triton.py").write_text((SAMPLE / "solutions/1_relu/triton.py").read_text())
    (deck / "solutions/7_relu/wrong.py").write_text(
        "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    )
    proc = cli("track=kernelbench", f"track.problems_dir={deck}", "launcher=inline")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(next((outputs / "sweeps/kernelbench").glob("*/result.json")).read_text())
    assert result["outcome"] == "pass" and result["basis"] == "speedup"


def test_gpu_timing_script_cpu_path(tmp_path):
    """scripts/kernelbench_gpu_timing.py on a KernelBench-format checkout, on CPU: both timers' figures for a good
    problem, the broken problem's error on its own line, and a spent budget skips (and says so)."""
    level1 = tmp_path / "KB/KernelBench/level1"
    level1.mkdir(parents=True)
    relu = (REPO / "tests/kernelbench_cases/6_relu.py").read_text()
    (level1 / "1_relu.py").write_text(relu)
    (level1 / "2_broken.py").write_text(relu.replace("return torch.relu(x)", "raise RuntimeError('broken forward')"))
    script = [sys.executable, str(REPO / "scripts/kernelbench_gpu_timing.py"), str(tmp_path / "KB")]
    out = tmp_path / "timing.json"
    proc = subprocess.run(
        [*script, str(out), "--ids", "1", "2", "--device", "cpu"], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr
    problems = json.loads(out.read_text())["problems"]
    good = problems["1_relu"]
    assert good["outcome"] == "pass" and good["kernelbench"]["num_trials"] == 100 and good["kbsweep"]["median_ms"] > 0
    assert good["kernelbench_mean_over_kbsweep_median"] == good["kernelbench"]["mean_ms"] / good["kbsweep"]["median_ms"]
    assert "broken forward" in problems["2_broken"]["error"]
    proc = subprocess.run(
        [*script, str(out), "--ids", "1", "--device", "cpu", "--budget-s", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert json.loads(out.read_text())["problems"]["1_relu"] == {"skipped": "the 1 s budget was spent"}


def test_missing_optional_package_is_one_line(cli, outputs, tmp_path):
    """A file importing a package that is not installed (einops for level3's Mamba2) stops the plan with one line
    naming the file and the package; no traceback."""
    (tmp_path / "1_relu.py").write_text((SAMPLE / "1_relu.py").read_text())
    (tmp_path / "2_mamba.py").write_text("import kbsweep_absent_package.layers\n" + (SAMPLE / "1_relu.py").read_text())
    proc = cli("plan", "track=kernelbench", f"track.problems_dir={tmp_path}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"kbsweep: error: {tmp_path}/2_mamba.py: needs the Python package 'kbsweep_absent_package', "
        "which is not installed (pip install kbsweep_absent_package, or leave the problem out with track.problems)"
    ]


def test_unknown_timer_in_config_is_one_line(cli, outputs):
    proc = cli("plan", "track=kernelbench", "grade.timers=[do_bench]")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"kbsweep: error: {REPO}/conf/config.yaml: key 'grade.timers': must be a list of kernelbench "
        "(null: kernelbench for KernelBench problems on GPUs), got ['do_bench']"
    ]


def test_reference_probe_cache_merges_concurrent_writers(tmp_path, monkeypatch):
    """A grade's probe adds its reference to what other processes wrote meanwhile, never overwriting it (four
    concurrent KernelBench grades lost entries, and a wrong solution's grade probed its reference again)."""
    from kbsweep.planner import validate

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = validate.cache_file()
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps(["before"]))
    reference = tmp_path / "reference.py"
    reference.write_text("x = 1\n")

    def probe(*args, **kwargs):  # another process records its own probe while this one runs
        cache.write_text(json.dumps(["before", "meanwhile"]))
        return subprocess.CompletedProcess(args, 0, stdout=json.dumps([None]), stderr="")

    monkeypatch.setattr(validate.subprocess, "run", probe)
    validate.check_references([(reference, {}, False)])
    assert set(json.loads(cache.read_text())) == {"before", "meanwhile", validate.digest(reference, {})}
