"""run_profile: the grader's profile mode on the demo problem on CPU (one public shape checked and timed, the
candidate process's per-op view, the referee's time per call against the roofline), the tool's output through the
built-in loop's toolbox, ``kbsweep-check --profile`` and the MCP tool list through the real model proxy, its count
in the loop's budgets, and the harnesses' setup records."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from kbsweep.agent.loop import Budgets
from kbsweep.agent.tools import MAX_TOOL_OUTPUT, Toolbox
from kbsweep.grader import ncu
from kbsweep.grader.processes import grading_env
from kbsweep.grader.profile_summary import CPU_LABEL, OUTSIDE_OPS, TOP, summary
from kbsweep.grader.referee.profile_view import profile_view
from kbsweep.grader.shared.profiling import OpTimes
from kbsweep.harness import runner_for
from kbsweep.harness.cli_agent import TOOL_SERVER
from kbsweep.harness.proxy import SERVED, ModelProxy
from kbsweep.outcomes import StopReason
from kbsweep.paths import REPO_ROOT as REPO
from kbsweep.reporting.render import render_markdown
from kbsweep.reporting.report import build_boards, setup_differences
from kbsweep.sandbox.confine import Sandbox, SandboxPolicy, grading_view
from kbsweep.score.roofline import shape_score
from kbsweep.tracking.tracker import cell_params
from tests.support.fake_provider import FakeProvider
from tests.support.grading import CPU, graded
from tests.support.scripts import call, kernel
from tests.test_agent_loop import Run
from tests.test_report import PARAMS
from tests.test_report import row as report_row
from tests.test_tracking import make_cell

SEED = 1_234_567_891  # the grade's secret seed, fixed here so the output can be searched for it
ROW = re.compile(r"^\s+(\d+\.\d)% ", re.M)  # a table row's share
STAGES = ("/timing", "/correctness", "/audit", "/import", "ghost", "probe", "kbsweep::call", "secret")


@pytest.fixture
def workspace(tmp_path, problem, roofline, monkeypatch):
    """A workspace whose toolbox grades through the real grader on this CPU (the seed fixed to :data:`SEED`)."""
    monkeypatch.setattr("kbsweep.grader.grading.secrets.randbits", lambda bits: SEED)
    folder = tmp_path / "workspace"
    folder.mkdir()
    counter = iter(range(1, 100))

    def grade(mode):
        return graded(
            problem,
            folder / "solution.py",
            CPU,
            roofline,
            mode=mode,
            timeout_s=180,
            log_dir=tmp_path / "grades" / f"{mode}-{next(counter)}",
        )

    return Toolbox(workspace=folder, grade=grade)


def profile_of(toolbox: Toolbox, solution: str) -> str:
    (toolbox.workspace / "solution.py").write_text(kernel(solution))
    return toolbox.call("run_profile", "{}")


def test_a_passing_kernel_gets_a_bounded_cpu_profile_that_names_nothing_of_the_referee(workspace, problem):
    text = profile_of(workspace, "triton")
    assert text.startswith("outcome: pass\n") and len(text) < MAX_TOOL_OUTPUT // 3, text
    first = problem.shapes(CPU.shape_set)[0]
    assert f"on shape {first}" in text  # the first public shape of the CPU's set, the only one
    assert CPU_LABEL in text and "never scored" in text and "ncu: not available (CPU grade)" in text
    assert re.search(r"memory: +[\d.e+-]+ GB/s = [\d.e+-]+% of peak", text) and re.search(
        r"compute: [\d.e+-]+ TFLOP/s", text
    )
    assert re.search(r"time per call: [\d.e+-]+ ms \(the grader's clock", text)
    shares = [float(share) for share in ROW.findall(text)]
    assert 2 <= len(shares) <= TOP + 1 and sum(shares) == pytest.approx(100, abs=0.1 * len(shares))
    assert OUTSIDE_OPS in text and re.search(r"\d+\.\d%.* aten::\w+", text)  # the interpreter's time and torch's ops
    assert str(SEED) not in text and not re.search(r"\b[0-9a-f]{12}\b", text)  # no seed, no command id
    assert not [stage for stage in STAGES if stage in text]
    assert workspace.last_grade["score"] is None and workspace.last_grade["mode"] == "profile"


def test_a_wrong_kernel_gets_its_check_outcome_and_no_profile(workspace):
    text = profile_of(workspace, "wrong")
    (workspace.workspace / "solution.py").write_text(kernel("wrong"))
    check = workspace.call("run_check", "{}")
    assert text.startswith("outcome: incorrect\nmessage: shape ") and "profile of" not in text and "%" not in text
    assert text.splitlines()[:1] == check.splitlines()[:1] and "seed 42" in text and str(SEED) not in text


def tools_json(folder: Path, proxy: ModelProxy, toolbox: Toolbox) -> Path:
    """kbsweep-check beside its tools.json, as a CLI harness's sandbox holds them (cli_agent.CliRunner)."""
    folder.mkdir()
    check = folder / "kbsweep-check"
    shutil.copy(TOOL_SERVER, check)
    served = [t["function"] for t in toolbox.schemas() if t["function"]["name"] in SERVED]
    url = "http://%s:%d" % proxy.address
    (folder / "tools.json").write_text(json.dumps({"url": url, "token": proxy.token, "tools": served}))
    return check


def test_kbsweep_check_profile_runs_the_tool_through_the_real_proxy(workspace, tmp_path):
    (workspace.workspace / "solution.py").write_text(kernel("triton"))
    with ModelProxy(None, "none", Budgets(), workspace) as proxy:
        check = tools_json(tmp_path / "bin", proxy, workspace)
        done = subprocess.run([sys.executable, str(check), "--profile"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("outcome: pass\nprofile of solution.py") and CPU_LABEL in done.stdout
    assert len(proxy.result.steps) == 1 and proxy.result.steps[0]["best_score"] is None  # counted, never a score


@pytest.mark.fast
def test_the_mcp_tool_list_offers_run_profile(tmp_path):
    toolbox = Toolbox(workspace=tmp_path, grade=lambda mode: {}, allow_shell=False)
    with ModelProxy(None, "none", Budgets(), toolbox) as proxy:
        check = tools_json(tmp_path / "bin", proxy, toolbox)
        requests = [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        ]
        done = subprocess.run(
            [sys.executable, str(check), "--mcp"],
            input="".join(json.dumps(r) + "\n" for r in requests),
            capture_output=True,
            text=True,
            timeout=60,
        )
    tools = [t["name"] for t in json.loads(done.stdout.splitlines()[1])["result"]["tools"]]
    assert tools == ["write_file", "read_file", "list_files", "run_check", "run_benchmark", "run_profile"]


@pytest.mark.fast
def test_profile_calls_count_in_the_loops_budgets_and_transcript(tmp_path):
    with FakeProvider(
        [
            call("write_file", path="solution.py", content="x"),
            call("run_profile"),
            call("run_profile"),
            call("run_profile"),
        ]
    ) as fp:
        run = Run(tmp_path, fp)
        run.grade = lambda mode: (
            run.grades.append(mode)
            or {"outcome": "pass", "score": None, "profile": {"summary": "profile of solution.py"}}
        )
        run.toolbox.grade = run.grade
        result = run(Budgets(max_turns=3))
    assert result.stop_reason is StopReason.MAX_TURNS and run.grades == ["profile", "profile"]
    tools = run.events("tool")
    assert [e["name"] for e in tools] == ["write_file", "run_profile", "run_profile"]
    assert tools[1]["content"] == "outcome: pass\nprofile of solution.py"
    assert [s["turn"] for s in run.events("step")] == [2, 3]


@pytest.mark.fast
def test_op_times_count_outermost_ops_and_leave_the_rest_to_the_call():
    times = OpTimes()
    # one call of 100 ns: an op of 40 ns holding a nested one, and a second op of 10 ns
    times.add(0, 100, [(10, 50, "aten::linear"), (20, 30, "aten::addmm"), (60, 70, "aten::relu")])
    summary = times.summary()
    assert summary == {"range_ns": 100, "ops": {"aten::linear": [1, 40], "aten::relu": [1, 10]}}


CLAUDE = {"name": "claude-code", "runner": "claude-code", "bin": "claude", "package": "", "version": None}


@pytest.mark.fast
@pytest.mark.parametrize("allow_shell", [True, False])
def test_harness_setups_list_only_their_differences_from_the_builtin_loop(allow_shell):
    def row(conf):
        setup = {**runner_for(conf).setup(allow_shell), "budgets": "time_cap_s=600 max_turns=40"}
        return {"harness": conf["name"], "params": {f"setup.{key}": value for key, value in setup.items()}}

    builtin = {"name": "builtin", "runner": "builtin"}
    for rows in ([row(builtin), row(CLAUDE)], [row(CLAUDE)]):  # with the loop's cells in the sweep, and without
        found = {d["setting"]: d for d in setup_differences(rows)}
        assert {d["harness"] for d in found.values()} == {"claude-code"} and "budgets" not in found
        assert set(found) == {"tools", "kbsweep_tools", "instructions", "ends", "budgets_checked"} | (
            {"shell"} if allow_shell else set()
        )
        assert "run_profile" in found["tools"]["builtin"] and "run_profile" in found["tools"]["value"]
    changed = row(CLAUDE)
    changed["params"]["setup.budgets"] = "time_cap_s=60 max_turns=40"
    assert "budgets" in {d["setting"] for d in setup_differences([row(builtin), changed])}
    cells = [
        {**report_row("alpha", "hard/p1", 0), "harness": "claude-code", "params": {**PARAMS, **row(CLAUDE)["params"]}}
    ]
    [board] = build_boards(cells)
    text = render_markdown([board])
    assert (
        "### Harness setups" in text
        and f"| claude-code | kbsweep_tools | function calls | {found['kbsweep_tools']['value']} |" in text
    )


NCU_CSV = """==PROF== Connected to process 123
"ID","Process ID","Kernel Name","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","sm__warps_active.avg.pct_of_peak_sustained_active"
"","","","%","nsecond","%","%"
"0","123","void at::native::fill_kernel","10.0","1,000","5.0","50.0"
"1","123","scale_shift_kernel","85.1","4,096","20.5","70.2"
"2","123","scale_shift_kernel","84.9","4,104","20.1","69.8"
==PROF== Disconnected from process 123
"""  # noqa: E501 (ncu's CSV header is one line, as ncu writes it)


@pytest.mark.fast
def test_ncu_rows_are_averaged_per_kernel_most_time_first():
    lines = ncu.table(ncu.parse(NCU_CSV))
    assert "3 launches, top 2 kernels" in lines[0] and "occupancy %" in lines[1]
    assert lines[2].split() == ["4100", "20.3", "85", "70", "scale_shift_kernel"]
    assert lines[3].split()[:4] == ["1000", "5", "10", "50"]


def test_ncu_runs_the_candidate_staged_in_a_folder_of_its_own_in_the_sandbox(tmp_path, monkeypatch):
    """Through a stand-in ``ncu`` (reached by a symlink, as /usr/local/cuda/bin/ncu is on GPU hosts): the candidate
    file is staged where the profiled program runs, ncu's own folder is readable in the sandbox, its CSV becomes the
    table, and the staged folder is gone afterwards."""
    home, path = tmp_path / "nsight" / "2025.3", tmp_path / "bin"
    home.mkdir(parents=True), path.mkdir()
    (home / "rows.csv").write_text(NCU_CSV)
    stand_in = home / "ncu"
    stand_in.write_text(
        '#!/bin/bash\nfolder="${@: -3:1}"\n'
        'grep -q MARKER "$folder/solution.py" || { echo "no candidate in $folder"; exit 1; }\n'
        'cat "$(dirname "$0")/rows.csv"\n'
    )
    stand_in.chmod(0o755)
    (path / "ncu").symlink_to(stand_in)
    monkeypatch.setenv("PATH", f"{path}:{os.environ['PATH']}")
    candidate = tmp_path / "mine.py"
    candidate.write_text("# MARKER\n")
    problem_root = REPO / "problems" / "demo" / "scale_shift"
    request = SimpleNamespace(
        gpu=SimpleNamespace(device="cuda"),
        timeout_s=60,
        problem=SimpleNamespace(grader_reference=problem_root / "reference.py"),
    )
    lines = ncu.speed_of_light(
        request, {"n": 8}, candidate, Sandbox(SandboxPolicy()), grading_env((), "cpu"), grading_view(problem_root)
    )
    assert lines[0].startswith("ncu (Nsight Compute") and "scale_shift_kernel" in lines[2], lines
    assert not list(Path(tempfile.gettempdir()).glob("kbsweep-ncu-*/solution.py"))


@pytest.mark.fast
def test_a_failed_ncu_run_names_the_programs_error_and_ncus():
    out = (
        '==PROF== Connected to process 7\nTraceback (most recent call last):\n  File "solution.py", line 3\n'
        "RuntimeError: CUDA error: an illegal memory access\n==PROF== Disconnected\n"
        "==ERROR== The application returned an error code (1).\n"
    )
    assert ncu.parse(out) == []
    assert (
        ncu.why(out)
        == "RuntimeError: CUDA error: an illegal memory access; ==ERROR== The application returned an error code (1)."
    )
    assert ncu.why("") == "no output"


@pytest.mark.fast
def test_a_gpu_summary_lists_kernels_top_first_with_the_rest_as_others():
    kernels = {f"kernel_{i:02d}": 1.0 for i in range(20)}
    times = {name: (i + 1) * 100_000 for i, name in enumerate(kernels)}  # 0.1 ms … 2 ms over the 10 calls
    profiles = {
        "/timing/0": {"launches_per_call": 24.0, "median_launches": 20.0, "kernels": kernels, "kernel_ns": times},
        "/timing/1": {},
    }
    view = profile_view({"profiles": profiles, "ranges": {"/timing/0": 10}}, "/timing/0", 10, [], "cuda")
    shape = shape_score(
        2.5,
        {"flops": 2e9, "bytes": 4e9},
        "memory",
        "bf16",
        {"peaks_tflops": {"bf16": 989.0}, "dram_gbps": 3350.0},
        {"n": 1},
    )
    result = SimpleNamespace(timings=[{"candidate": {"median_ms": 2.5}}], shapes=[shape], device="cuda", gpu="h100")
    text = summary(result, view, {"dram_gbps": 3350.0}, "memory", ["ncu: not available"])["summary"]
    assert "time per call: 2.5 ms" in text and "1600 GB/s = 47.8% of peak" in text and "0.8 TFLOP/s" in text
    assert "kernels launched per call: 20" in text and "GPU time per call: 2.1 ms" in text and CPU_LABEL not in text
    shares = [float(share) for share in ROW.findall(text)]
    assert len(shares) == TOP + 1 and sum(shares) == pytest.approx(100, abs=0.1 * len(shares))
    assert (
        re.search(r"9\.5% +2 +0\.2 +10  kernel_19", text)
        and "others (5)" in text
        and text.endswith("ncu: not available")
    )


@pytest.mark.fast
def test_a_cells_params_hold_its_harness_setup_and_budgets(tmp_path):
    cell = make_cell(tmp_path)
    params = cell_params(cell)
    setup = {key: value for key, value in params.items() if key.startswith("setup.")}
    assert setup["setup.kbsweep_tools"] == "function calls" and "run_profile" in setup["setup.tools"]
    assert setup["setup.shell"] == ("none" if not cell.track["allow_shell"] else "run_shell, in kbsweep's sandbox")
    assert (
        f"time_cap_s={cell.track['time_cap_s']}" in setup["setup.budgets"]
        and f"max_turns={cell.track['max_turns']}" in setup["setup.budgets"]
    )


@pytest.mark.fast
def test_a_gpu_views_means_are_over_the_ranges_the_session_holds():
    """The batches' shaping calls run in the group's ranges but are not counted by the referee: the means divide by
    the ranges, the kernels' counts stay the launches seen, and launches per call are the median call's."""
    profile = {"launches_per_call": 1.5, "median_launches": 1.0, "kernels": {"k": 1.5}, "kernel_ns": {"k": 3_000_000}}
    view = profile_view({"profiles": {"/timing/0": profile}, "ranges": {"/timing/0": 15}}, "/timing/0", 10, [], "cuda")
    assert view["calls"] == 15 and view["kernels"] == [("k", 15, 3.0)] and view["launches_per_call"] == 1.0
    assert profile_view({"profiles": {}}, "/timing/0", 10, [], "cuda") is None
