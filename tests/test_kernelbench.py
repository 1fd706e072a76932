"""KernelBench single-file problems run through the same matrix, grader and tracking; scored as speedups."""
from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "problems/kernelbench_sample"


def test_plan_lists_the_folder(cli, outputs):
    proc = cli("plan", "track=kernelbench")
    assert proc.returncode == 0, proc.stderr
    for name in ("1_relu", "2_matmul_bias", "3_row_sum"):
        assert f"kernelbench/{name} · cpu" in proc.stdout


def test_grade_scores_speedup_only(cli, outputs):
    proc = cli("grade", "track=kernelbench", "problem=kernelbench/3_row_sum", f"solution={SAMPLE}/solutions/3_row_sum/triton.py", "gpu=cpu")
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


def test_sweep_over_an_outside_folder(cli, outputs, tmp_path):
    deck = tmp_path / "level0"
    deck.mkdir()
    (deck / "7_relu.py").write_text((SAMPLE / "1_relu.py").read_text())
    (deck / "solutions/7_relu").mkdir(parents=True)
    (deck / "solutions/7_relu/triton.py").write_text((SAMPLE / "solutions/1_relu/triton.py").read_text())
    (deck / "solutions/7_relu/wrong.py").write_text("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n")
    proc = cli("track=kernelbench", f"track.problems_dir={deck}", "launcher=inline")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(next((outputs / "sweeps/kernelbench").glob("*/result.json")).read_text())
    assert result["outcome"] == "pass" and result["basis"] == "speedup"
