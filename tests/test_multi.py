"""The multi track on CPU: grades under torchrun with gloo at 2 and 4 ranks (docs/multi.md).

Each grade starts torchrun and a Python per rank, so grades that belong together run concurrently.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, Optional, Tuple

import pytest

from kbsweep.audit.static import analyze
from kbsweep.grader import grade
from kbsweep.grader.distributed import COMM_FINDINGS
from kbsweep.problems import load_problem
from kbsweep.score import load_roofline

REPO = Path(__file__).resolve().parent.parent
PROBLEMS = ["allreduce_residual", "gemm_allreduce", "allgather_gemm", "ring_attention", "moe_dispatch_combine"]
CPU = SimpleNamespace(name="cpu", device="cpu", shape_set="smoke_shapes")
ROOFLINE = load_roofline([str(REPO / "roofline_specs")], "cpu")
SHORT_TIMING = {"min_runs": 3, "max_runs": 8, "max_time_s": 1.0, "warmup_runs": 1}


def problem(name: str):
    return load_problem(REPO / "problems/multi" / name, "multi")


def grade_many(name: str, jobs: Dict[str, Tuple[Path, int]], folder: Path, **kwargs) -> Dict[str, dict]:
    """Grade {label: (solution, world size)} concurrently; check mode unless kwargs say otherwise."""
    prob = problem(name)
    kwargs = {"mode": "check", "timeout_s": 300, **kwargs}

    def one(label: str) -> dict:
        solution, world = jobs[label]
        return grade(prob, solution, CPU, ROOFLINE, world_size=world, log_dir=folder / label, **kwargs)

    with ThreadPoolExecutor(len(jobs)) as pool:
        return dict(zip(jobs, pool.map(one, jobs)))


def candidate(folder: Path, source: str, helpers: Optional[Dict[str, Path]] = None) -> Path:
    """A solution.py (and helper modules beside it) in a folder of its own."""
    folder.mkdir(parents=True)
    for module, path in (helpers or {}).items():
        (folder / f"{module}.py").write_text(path.read_text())
    (folder / "solution.py").write_text(source)
    return folder / "solution.py"


@pytest.mark.parametrize("name", PROBLEMS)
def test_reference_and_example_pass_at_2_and_4_ranks_and_the_shortcut_fails(name, tmp_path):
    prob = problem(name)
    reference = candidate(tmp_path / "reference", prob.reference.read_text() + "\n\nModelNew = Model\n")
    example, shortcut = prob.root / "solutions/p2p.py", prob.root / "solutions/wrong.py"
    jobs = {f"{label}@{world}": (path, world) for world in (2, 4) for label, path in (("reference", reference), ("p2p", example))}
    results = grade_many(name, {**jobs, "wrong@2": (shortcut, 2)}, tmp_path / "grades")
    for world in (2, 4):
        for label in ("reference", "p2p"):
            result = results[f"{label}@{world}"]
            assert result["outcome"] == "pass", (label, world, result.get("message"))
            assert result["correctness"]["world_size"] == world
            assert result["evidence"]["devices"] == ["cpu"] * world  # what the device gate compared
        assert not [f for f in results[f"p2p@{world}"]["findings"] if f["kind"] in COMM_FINDINGS]
        # the profiler pass sees the reference's own collective on every rank
        seen = {f["rank"] for f in results[f"reference@{world}"]["findings"] if f["kind"] == "c10d_collective"}
        assert seen == set(range(world))
    wrong = results["wrong@2"]
    assert wrong["outcome"] == "incorrect", wrong.get("message")
    assert "rank " in wrong["message"] and wrong["score"] is None


def test_c10d_collectives_are_flagged_statically_and_point_to_point_is_not():
    source = (
        "import torch.distributed as dist\n"
        "from torch.distributed import all_gather_into_tensor\n"
        "def f(x, out):\n"
        "    dist.all_reduce(x)\n"
        "    all_gather_into_tensor(out, x)\n"
        "    dist.group.WORLD.allreduce([x])\n"
    )
    for name in PROBLEMS:
        prob = problem(name)
        flagged = {f["line"] for f in analyze(source, prob.spec.forbidden) if f["kind"] == "forbidden_name"}
        assert {4, 5, 6} <= flagged, (name, flagged)
        example = analyze((prob.root / "solutions/p2p.py").read_text(), prob.spec.forbidden)
        assert not [f for f in example if f["kind"] == "forbidden_name"], (name, example)


PATCHER = '''
import torch
import torch.distributed as dist

dist.all_reduce = lambda tensor, *args, **kwargs: None  # the reference's sum becomes this rank's own x


class ModelNew(torch.nn.Module):
    def forward(self, x, residual):
        return x + residual
'''

SLOW_RANK = '''
import time

import torch.distributed as dist
from example import ModelNew as Example


class ModelNew(Example):
    def forward(self, x, residual):
        out = super().forward(x, residual)
        if dist.get_rank() == 1:
            time.sleep(0.03)  # after the exchange: rank 0 is done long before rank 1
        return out
'''

CRASH = '''
import ctypes

import torch
import torch.distributed as dist


class ModelNew(torch.nn.Module):
    def forward(self, x, residual):
        if dist.get_rank() == 1:
            ctypes.string_at(0)
        return x + residual
'''

HOG = '''
import time

import torch
import torch.distributed as dist


class ModelNew(torch.nn.Module):
    def forward(self, x, residual):
        if dist.get_rank() == 1:
            self.held = [torch.ones(1 << 28) for _ in range(3)]  # 3 GiB on one rank
            time.sleep(60)
        return x + residual
'''


@pytest.fixture(scope="module")
def adversarial(tmp_path_factory):
    """The monkey-patching, crashing, memory-hogging and slow-rank candidates on allreduce_residual at 2 ranks,
    graded together (with a 1500 MiB cap per rank)."""
    folder = tmp_path_factory.mktemp("multi-adversarial")
    example = REPO / "problems/multi/allreduce_residual/solutions/p2p.py"
    jobs = {
        "patch": (candidate(folder / "patch", PATCHER), 2),
        "crash": (candidate(folder / "crash", CRASH), 2),
        "hog": (candidate(folder / "hog", HOG), 2),
        "slow": (candidate(folder / "slow", SLOW_RANK, {"example": example}), 2),
    }
    return grade_many(
        "allreduce_residual", jobs, folder / "grades", mode="bench", baselines=["eager"], timing=SHORT_TIMING, memory_mib=1500
    )


def test_monkeypatched_reference_collective_is_disqualified(adversarial):
    result = adversarial["patch"]
    assert result["outcome"] == "disqualified", result.get("message")
    assert "torch.distributed.all_reduce was replaced" in result["message"]
    assert {"kind": "grader_tamper", "detail": "torch.distributed.all_reduce was replaced"} in result["findings"]
    assert result["score"] is None


def test_a_crashed_rank_is_the_cause_not_its_peers_broken_connection(adversarial):
    result = adversarial["crash"]
    assert result["outcome"] == "runtime_error"
    assert result["message"].startswith("rank 1: grading process died") and "SIGSEGV" in result["message"]


def test_a_rank_over_the_memory_cap_ends_the_grade(adversarial):
    result = adversarial["hog"]
    assert result["outcome"] == "grade_oom" and "1500 MiB" in result["message"]
    assert result["grade_s"] < 50  # killed when seen, not at the end of its 60 s sleep


def test_the_slowest_rank_is_what_is_reported(adversarial):
    result = adversarial["slow"]
    assert result["outcome"] == "pass", result.get("message")
    for entry, shape in zip(result["timings"], result["shapes"]):
        timed = entry["candidate"]
        fast, slow = timed["per_rank_median_ms"]
        assert slow >= 30 and fast < slow - 20, timed
        assert timed["slowest_rank"] == 1 and timed["median_ms"] >= slow * 0.9
        assert shape["ms"] == timed["median_ms"] and shape["speedup"]["eager"] < 1
    assert result["basis"] == "speedup" and result["score"] == pytest.approx(result["speedup"]["eager"])


def test_cli_grades_at_the_track_world_size(cli, outputs):
    example = REPO / "problems/multi/allreduce_residual/solutions/p2p.py"
    run = cli("grade", "problem=multi/allreduce_residual", f"solution={example}", "gpu=cpu", "track=multi", "track.world_size=2")
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert result["outcome"] == "pass" and result["world_size"] == 2
    assert [s["busbw_gbps"] > 0 for s in result["shapes"]] == [True, True]
