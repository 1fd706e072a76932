"""The grader on CPU: every failure class is caught and classified; good kernels pass and are scored."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kbsweep.config.problems import load_problem
from kbsweep.grader.baselines import BaselineCache
from kbsweep.grader.shared import timing
from tests.support.grading import CPU, graded

REPO = Path(__file__).resolve().parent.parent
CASES = Path(__file__).parent / "grader_cases"


@pytest.mark.parametrize(
    "case, outcome, needle",
    [
        ("crash", "runtime_error", "illegal memory access"),
        ("segfault", "runtime_error", "died"),
        ("nan", "incorrect", "NaN"),
        ("wrong_dtype", "incorrect", "float64"),
        ("alias_input", "incorrect", "aliases an input"),
        ("mutate_input", "incorrect", "modified input"),
        (
            "pointer_cache",
            "incorrect",
            "elements off",
        ),  # a stale output: caught by the probe or by an earlier case on the same slots
        ("subclass_output", "incorrect", "not exactly torch.Tensor"),
        ("syntax_error", "compile_error", "SyntaxError"),
    ],
)
def test_bad_solutions_are_classified(problem, roofline, tmp_path, case, outcome, needle):
    result = graded(problem, CASES / f"{case}.py", CPU, roofline, mode="check", timeout_s=120, log_dir=tmp_path)
    assert result["outcome"] == outcome, result
    assert needle in result["message"], result["message"]
    assert result["score"] is None


def test_hang_is_killed_at_the_timeout(problem, roofline, tmp_path):
    result = graded(problem, CASES / "hang.py", CPU, roofline, mode="check", timeout_s=8, log_dir=tmp_path)
    assert result["outcome"] == "grade_timeout"
    assert result["grade_s"] < 30


def test_memory_cap_ends_a_hog(problem, roofline, tmp_path):
    result = graded(
        problem, CASES / "memory_hog.py", CPU, roofline, mode="check", timeout_s=120, memory_mib=1200, log_dir=tmp_path
    )
    assert result["outcome"] == "grade_oom", result


def test_a_grade_holds_one_shapes_models_at_a_time(problem, roofline, tmp_path):
    """Each model of this correct solution keeps a 256 MiB workspace, and a full grade builds one per shape, seed and
    stage. Kept for the whole grade they outgrow 1 500 MiB (on an 80 GB GPU a mega problem's did); let go as each
    shape's arena is, the grade stays under it."""
    result = graded(
        problem,
        CASES / "workspace_per_model.py",
        CPU,
        roofline,
        mode="full",
        timeout_s=120,
        memory_mib=1500,
        log_dir=tmp_path,
    )
    assert result["outcome"] == "pass", result
    assert len(result["shapes"]) == len(problem.spec.smoke_shapes) and result["correctness"]["passed"]


def test_a_patched_timer_gains_nothing(problem, roofline, tmp_path):
    """A kernel of its own (tests/exploits/_demo_kernels.py staged beside it) after 5 ms of host work a call, with its
    process's clock reading 100x short: the scored figure is the referee's clock's, which saw the 5 ms."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    shutil.copy2(REPO / "tests/exploits/_demo_kernels.py", workspace)
    shutil.copy2(CASES / "timer_patch.py", workspace / "solution.py")
    result = graded(
        problem, workspace / "solution.py", CPU, roofline, mode="full", timeout_s=120, log_dir=tmp_path / "grade"
    )
    assert result["outcome"] == "pass" and result["shapes"], result.get("message")
    assert all(shape["ms"] >= 0.95 * 5.0 for shape in result["shapes"]), [shape["ms"] for shape in result["shapes"]]


def test_forged_result_message_is_rejected(problem, roofline, tmp_path):
    result = graded(problem, CASES / "forged_result.py", CPU, roofline, mode="check", timeout_s=120, log_dir=tmp_path)
    assert result["outcome"] != "pass"
    assert "forged_result" in {f["kind"] for f in result["findings"]}


def test_good_solution_passes_with_scores_and_cached_baselines(problem, roofline, tmp_path):
    cache = BaselineCache(tmp_path / "baselines.json")
    solution = problem.root / "solutions/triton.py"
    first = graded(problem, solution, CPU, roofline, baselines=["eager"], log_dir=tmp_path / "a", baseline_cache=cache)
    assert first["outcome"] == "pass", first.get("message")
    assert first["correctness"]["seeds"] == problem.spec.seeds + 1  # plus the secret seed
    assert len(first["shapes"]) == len(problem.spec.smoke_shapes)
    for shape in first["shapes"]:
        assert shape["ms"] > 0 and 0 < shape["fraction"] < 1
        assert shape["gbps"] == pytest.approx(problem.work(shape["shape"])["bytes"] / shape["ms"] / 1e6)
        assert shape["speedup"]["eager"] > 0
    assert first["evidence"]["poison_deterministic"] is True
    assert first["evidence"]["pointer_cache_probe"] == "passed"
    # host figures check the plumbing: the default rule (100 runs, 0.1%) is capped on CPU, the GPU's is not
    assert all(
        t["candidate"]["runs"] <= timing.HOST_MAX_RUNS and t["baselines"]["eager"]["runs"] <= timing.HOST_MAX_RUNS
        for t in first["timings"]
    )
    assert timing.for_device(timing.TimingConfig(), "cuda") == timing.TimingConfig()
    cached = json.loads((tmp_path / "baselines.json").read_text())
    assert len(cached) == len(problem.spec.smoke_shapes)
    # the host's other work while each baseline was timed goes with it into the cache: a CPU grade is not gated on
    # it, so a timing shorter than one look at the host records none (never a tick's noise)
    assert all(entry["host_others_cpus"] is None or entry["host_others_cpus"] >= 0 for entry in cached.values())
    assert sorted(str(t["baselines"]["eager"]["host_others_cpus"]) for t in first["timings"]) == sorted(
        str(e["host_others_cpus"]) for e in cached.values()
    )
    # a second grade reuses the cached eager timings instead of timing them again, and says which record it used
    second = graded(problem, solution, CPU, roofline, baselines=["eager"], log_dir=tmp_path / "b", baseline_cache=cache)
    for a, b in zip(first["timings"], second["timings"]):
        assert a["baselines"]["eager"]["median_ms"] == b["baselines"]["eager"]["median_ms"]
        assert (
            a["baselines"]["eager"]["record"]["source"] == "timed"
            and b["baselines"]["eager"]["record"]["source"] == "cache"
        )
        assert a["baselines"]["eager"]["record"]["key"] == b["baselines"]["eager"]["record"]["key"] in cached
        assert b["baselines"]["eager"]["record"]["file"] == str(tmp_path / "baselines.json")


def test_wrong_kernel_reports_where(problem, roofline, tmp_path):
    result = graded(problem, problem.root / "solutions/wrong.py", CPU, roofline, mode="check", log_dir=tmp_path)
    assert result["outcome"] == "incorrect"
    assert "elements off" in result["message"] and "shape" in result["message"]


def test_grade_cli_prints_json(cli, outputs):
    proc = cli(
        "grade", "problem=demo/scale_shift", f"solution={REPO}/problems/demo/scale_shift/solutions/triton.py", "gpu=cpu"
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["outcome"] == "pass"
    assert result["env"]["torch"] and result["deck_version"]


def test_grade_cli_grades_under_the_problems_track_and_caches_baselines(cli, outputs):
    """A one-file grade of a proof problem gets the proof track's limits (not the default demo track's 240 s) and
    the same baseline cache a sweep's grade of the file would use."""
    solution = f"{REPO}/problems/proof/bf16_gemm/solutions/torch_mm.py"
    proc = cli("grade", "problem=proof/bf16_gemm", f"solution={solution}", "gpu=cpu")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["outcome"] == "pass" and result["timeout_s"] == 1800
    cached = json.loads((outputs / "baselines" / "cpu.json").read_text())
    assert any(key.startswith("proof/bf16_gemm|") and key.endswith("|eager") for key in cached)
    proc = cli(
        "grade", "problem=proof/bf16_gemm", f"solution={solution}", "gpu=cpu", "track=demo", "track.grade_timeout_s=99"
    )
    assert json.loads(proc.stdout)["timeout_s"] == 99  # a track the user names is the one graded under


def test_baselines_past_their_budget_are_left_for_a_later_grade(problem, roofline, tmp_path, monkeypatch):
    """Baselines are timed before the candidate is imported, within a share of the grade's time limit; one left
    untimed does not cost the candidate its grade and is not cached (a later grade times it)."""
    from kbsweep.grader import grading

    solution = problem.root / "solutions/triton.py"
    cache = BaselineCache(tmp_path / "baselines.json")
    monkeypatch.setattr(grading, "BASELINE_SHARE", 0.0)
    spent = graded(problem, solution, CPU, roofline, baselines=["eager"], log_dir=tmp_path / "a", baseline_cache=cache)
    assert spent["outcome"] == "pass" and spent["score"] is not None
    for entry in spent["timings"]:
        assert entry["baselines"]["eager"]["retry"] and "budget" in entry["baselines"]["eager"]["error"]
    assert not (tmp_path / "baselines.json").exists()
    monkeypatch.setattr(grading, "BASELINE_SHARE", 0.4)
    timed = graded(problem, solution, CPU, roofline, baselines=["eager"], log_dir=tmp_path / "b", baseline_cache=cache)
    assert all(entry["baselines"]["eager"]["median_ms"] > 0 for entry in timed["timings"])
    assert len(json.loads((tmp_path / "baselines.json").read_text())) == len(problem.spec.smoke_shapes)


@pytest.mark.parametrize("sota_body, agrees", [("x * model.weight + model.bias", True), ("x * model.weight", False)])
def test_a_baseline_that_disagrees_with_the_reference_is_flagged(roofline, tmp_path, sota_body, agrees):
    """A SOTA (or compiled) baseline whose output is outside the problem's tolerance of the reference's is still
    timed, and the grade says so beside the speedup over it."""
    import shutil

    deck = tmp_path / "scale_shift"
    shutil.copytree(REPO / "problems/demo/scale_shift", deck)
    (deck / "sota.py").write_text(
        f"def is_available():\n    return True\n\n\ndef sota_forward(model, x):\n    return {sota_body}\n"
    )
    problem = load_problem(deck, "demo")
    result = graded(
        problem, deck / "solutions/triton.py", CPU, roofline, baselines=["eager", "sota"], log_dir=tmp_path / "log"
    )
    assert result["outcome"] == "pass", result.get("message")
    for entry in result["timings"]:
        sota = entry["baselines"]["sota"]
        assert entry["baselines"]["eager"]["median_ms"] > 0
        assert sota["median_ms"] > 0  # timed either way: a library's own precision is reported, not hidden
        if agrees:
            assert sota.get("outside_tolerance") is None
        else:
            assert "elements off" in sota["outside_tolerance"], sota
    flagged = [s.get("baselines_outside_tolerance") for s in result["shapes"]]
    assert flagged == [None if agrees else ["sota"]] * len(flagged)


def test_baseline_keys_hold_what_changes_a_timing():
    """A cached baseline is served only under the conditions it was measured in."""
    from kbsweep.grader.baselines import entry_key

    env = {
        "torch": "2.11.0",
        "triton": "3.6.0",
        "cuda": "13.0",
        "runtime": "6.18.44-fc",
        "gpus": [{"driver": "580.159.04"}],
        "graded_on": [{"name": "NVIDIA H200"}],
    }

    def key(env=env, name="compile", mode="max-autotune-no-cudagraphs"):
        return entry_key("hard/x", "abc", "h200", env, {"M": 1}, name, mode)

    assert key() == key()
    for changed in (
        {"runtime": "4.4.0"},
        {"gpus": [{"driver": "575.0"}]},
        {"cuda": "12.8"},
        {"torch": "2.12.0"},
        {"triton": "3.7.0"},
        {"graded_on": [{"name": "NVIDIA H200 NVL"}]},
        {"graded_on": []},
    ):
        assert key({**env, **changed}) != key()
    assert key(mode="default") != key()
    assert key(name="eager", mode="default") == key(name="eager")  # the compile mode is the compile baseline's alone


def test_a_runner_killed_from_outside_is_infrastructure(problem, roofline, tmp_path):
    """SIGKILL from outside the grade (what the host's OOM killer sends) ends it as harness_error, never as the
    model's runtime_error; a crash of the candidate's own making stays runtime_error (test above: segfault)."""
    import sys
    import threading
    import time

    import psutil

    solution = tmp_path / "ws" / "solution.py"
    solution.parent.mkdir()
    marker = solution.parent / "importing"
    solution.write_text(
        (CASES / "nan.py")
        .read_text()
        .replace(
            "import torch",
            "import pathlib, time\nimport torch\npathlib.Path(__file__).with_name('importing').touch()\ntime.sleep(60)",
            1,
        )
    )

    def runner_zygote(proc) -> bool:
        command = proc.info["cmdline"] or []
        return command[:1] == [sys.executable] and "serve() runner" in " ".join(command)

    def kill_the_runner():  # the grade's runner: a child of the runner's zygote, in the folder that holds the marker
        deadline = time.monotonic() + 50
        while time.monotonic() < deadline:
            processes = {proc.pid: proc for proc in psutil.process_iter(["cmdline", "cwd", "ppid"])}
            for proc in processes.values():
                parent = processes.get(proc.info["ppid"])
                cwd = proc.info["cwd"] or ""
                if (
                    runner_zygote(proc)
                    and parent
                    and runner_zygote(parent)
                    and cwd.startswith(str(tmp_path))
                    and (Path(cwd) / marker.name).exists()
                ):
                    proc.kill()  # while it imports the candidate, which sleeps
                    return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_runner)
    killer.start()
    result = graded(
        problem, solution, CPU, roofline, mode="check", timeout_s=120, log_dir=tmp_path / "grade", zygote_home=tmp_path
    )
    killer.join()
    assert result["outcome"] == "harness_error", result.get("message")
    assert "killed from outside" in result["message"]
