"""Held-out shapes: graded and scored by full grades only, never shown to the agent nor reachable from its
workspace, its shell or the candidate's runner during a check or benchmark."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from kbsweep.agent.tools import Toolbox, format_grade
from kbsweep.cell import prepare_workspace
from kbsweep.config.problems import asdict_spec, load_problem
from kbsweep.errors import KbsweepError
from kbsweep.grader import grade
from kbsweep.grader.request import GradeRequest
from kbsweep.grader.result import GradeResult
from kbsweep.outcomes import Outcome
from kbsweep.reporting.render import board_table
from kbsweep.reporting.report import build_boards
from kbsweep.sandbox.confine import Sandbox, SandboxPolicy, grading_view
from kbsweep.score.roofline import ShapeScore, geomean
from kbsweep.tracking.cell_result import CellResult
from kbsweep.tracking.tracker import cell_metrics
from tests.support.grading import CPU, ZYGOTE_HOME
from tests.test_report import row

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "problems/demo/scale_shift"
# sizes found nowhere else in the demo problem, so finding one in what the agent sees is a leak
HELD = {"rows": 5003, "cols": 7919}
HELD_SMOKE = {"rows": 37, "cols": 9173}
NEEDLES = ("7919", "9173", "5003")
HELD_YAML = "held_out_shapes:\n  - {rows: 5003, cols: 7919}\nheld_out_smoke_shapes:\n  - {rows: 37, cols: 9173}\n"

# A candidate that, besides a correct forward, hunts for held-out shapes wherever a check's runner could reach them:
# problem.yaml by every path it can guess, the environment, its command line and every process's, what the
# interpreter holds, and the sizes the referee sends it. It prints all it finds (the grade's stdout log) and raises
# on anything that names held-out shapes (the message is what a check shows the agent).
EXPLOIT = r"""
import gc, os, sys, time
from pathlib import Path
import torch

SKIP = ("/proc", "/sys", "/dev", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc")
found, sizes = [], []


def look(path):
    try:
        text = Path(path).read_text(errors="replace")
    except (OSError, ValueError):
        return
    found.append(f"{path}: {text[:4000]}")


def hunt():
    guesses = {Path(__file__).resolve().parent, Path.cwd(), *Path.cwd().parents, *Path(__file__).resolve().parents}
    for folder in guesses:
        for name in ("problem.yaml", "prompt.md", "reference.py", "../problem.yaml"):
            look(folder / name)
    deadline = time.time() + 10
    for root, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in SKIP and "site-packages" not in root]
        if time.time() > deadline:
            break
        for name in files:
            if name.endswith((".yaml", ".md", ".json", ".log")):
                look(os.path.join(root, name))
    found.append("env: " + repr(dict(os.environ)))
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            look(f"/proc/{pid}/cmdline")
            look(f"/proc/{pid}/environ")
    for module in list(sys.modules.values()):
        found.append(f"module {getattr(module, '__name__', '?')}: " + repr({k: v for k, v in vars(module).items()
                     if isinstance(v, (dict, list, str)) and ("shape" in k.lower() or "spec" in k.lower())})[:2000])
    for obj in gc.get_objects():
        if isinstance(obj, dict) and ("held_out_shapes" in obj or "shapes" in obj):
            found.append("object: " + repr(obj)[:2000])
    print("HUNTED", len(found), flush=True)
    for entry in found:
        print(entry, flush=True)
    leaks = [entry for entry in found if "held_out" in entry]
    if leaks:
        raise RuntimeError("LEAK " + " | ".join(leaks)[:3000])


hunt()


class ModelNew(torch.nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(cols))
        self.bias = torch.nn.Parameter(torch.randn(cols))

    def forward(self, x):
        sizes.append(tuple(x.shape))
        print("SIZE", tuple(x.shape), flush=True)
        return x * self.weight + self.bias
"""


def problem_copy(folder: Path, extra: str = HELD_YAML) -> Path:
    """The demo problem under ``folder``, its own held-out shapes left out, with ``extra`` appended to its
    problem.yaml."""
    root = folder / "scale_shift"
    shutil.copytree(DEMO, root)
    text = re.sub(r"^held_out\w*:\n(?:[ #].*\n)*", "", (root / "problem.yaml").read_text(), flags=re.M)
    (root / "problem.yaml").write_text(text + extra)
    return root


@pytest.fixture(scope="module")
def held_problem(tmp_path_factory):
    return load_problem(problem_copy(tmp_path_factory.mktemp("held")), "demo")


def leaked(text: str) -> list:
    """The held-out sizes in ``text`` as whole numbers (never digits inside a timing's float)."""
    return [needle for needle in NEEDLES if re.search(rf"(?<![\d.]){needle}(?![\d.])", text)]


@pytest.mark.fast
@pytest.mark.parametrize(
    "extra, key, needle",
    [
        ("held_out_shapes:\n  - {rows: 5, width: 9}\n", "held_out_shapes[0]", "differ from the shapes' keys"),
        ("held_out_shapes:\n  - {rows: 1000, cols: 1537}\n", "held_out_shapes[0]", "also a public shape (shapes)"),
        (
            "held_out_smoke_shapes:\n  - {rows: 9, cols: 9}\n  - {rows: 33, cols: 70}\n",
            "held_out_smoke_shapes[1]",
            "also a public shape (smoke_shapes)",
        ),
        (
            "kernelbench: {version: v1}\nheld_out_shapes:\n  - {rows: 5, cols: 9}\n",
            "held_out_shapes[0]",
            "a KernelBench held-out shape overrides sizes its file assigns",
        ),
    ],
)
def test_bad_held_out_shapes_are_one_line_naming_file_and_key(tmp_path, extra, key, needle):
    root = problem_copy(tmp_path, extra)
    with pytest.raises(KbsweepError) as err:
        load_problem(root, "demo")
    message = str(err.value)
    assert "\n" not in message and str(root / "problem.yaml") in message and f"'{key}'" in message and needle in message


@pytest.mark.fast
@pytest.mark.parametrize(
    "shape_set, extra, key",
    [
        ("shapes", "held_out_shapes:\n  - {rows: 0, cols: 9}\n", "held_out_shapes[0].rows"),
        ("smoke_shapes", "held_out_smoke_shapes:\n  - {rows: 2, cols: 0}\n", "held_out_smoke_shapes[0].cols"),
    ],
)
def test_plan_checks_the_held_out_sizes_of_the_shape_set_graded(tmp_path, roofline, shape_set, extra, key):
    from kbsweep.planner.validate import check_problem

    root = problem_copy(tmp_path, extra)
    with pytest.raises(KbsweepError) as err:
        check_problem(load_problem(root, "demo"), shape_set, roofline, "cpu")
    assert "\n" not in str(err.value) and str(root / "problem.yaml") in str(err.value) and f"'{key}'" in str(err.value)


@pytest.mark.fast
def test_public_views_hold_no_held_out_shape(held_problem, tmp_path):
    """The prompt, the accessors a check uses, the spec a grade sends, the workspace and the grading view."""
    assert held_problem.held_out_shapes("smoke_shapes") == [HELD_SMOKE]
    assert held_problem.held_out_shapes("shapes") == [HELD]
    public = held_problem.shapes("shapes") + held_problem.shapes("smoke_shapes")
    assert HELD not in public and HELD_SMOKE not in public
    for shape_set in ("shapes", "smoke_shapes"):
        prompt = held_problem.render_prompt(CPU, shape_set)
        assert "rows=1000" in prompt or "rows=33" in prompt  # the public shapes are there
        assert not leaked(prompt)
    assert not leaked(json.dumps(asdict_spec(held_problem.spec)))
    workspace = prepare_workspace(tmp_path / "workspace", held_problem.root)
    for path in workspace.rglob("*"):
        assert not leaked(path.read_text()), path
    view = grading_view(held_problem.root)
    assert held_problem.reference in view
    assert not [p for p in view if p.is_file() and leaked(p.read_text())]
    request = GradeRequest(held_problem, Path(), CPU, {})
    assert request.of("check", Path("s.py"), tmp_path).held_out_shapes == []
    assert request.of("bench", Path("s.py"), tmp_path).held_out_shapes == []
    assert request.of("full", Path("s.py"), tmp_path).held_out_shapes == [HELD_SMOKE]
    on_gpu = GradeRequest(held_problem, Path(), replace(CPU, shape_set="shapes"), {})
    assert on_gpu.of("full", Path("s.py"), tmp_path).held_out_shapes == [HELD]


def test_check_and_bench_show_no_held_out_shape_and_the_full_grade_tags_them(held_problem, roofline, tmp_path):
    solution = tmp_path / "workspace" / "solution.py"
    solution.parent.mkdir()
    solution.write_text((DEMO / "solutions/triton.py").read_text())
    request = GradeRequest(held_problem, Path(), CPU, roofline, zygote_home=ZYGOTE_HOME)
    for mode in ("check", "bench"):
        seen = grade(request.of(mode, solution, tmp_path / mode)).to_json()
        assert seen["outcome"] == "pass", seen.get("message")
        assert not leaked(json.dumps(seen)) and not leaked(format_grade(seen))
        assert "score_public" not in seen and not any(s.get("held_out") for s in seen.get("shapes", []))
    full = grade(request.of("full", solution, tmp_path / "full")).to_json()
    assert full["outcome"] == "pass", full.get("message")
    tagged = {json.dumps(s["shape"]): s.get("held_out", False) for s in full["shapes"]}
    assert tagged == {
        **{json.dumps(s): False for s in held_problem.shapes("smoke_shapes")},
        json.dumps(HELD_SMOKE): True,
    }
    assert [t["shape"] for t in full["timings"] if t.get("held_out")] == [HELD_SMOKE]
    fractions = {
        part: [s["fraction"] for s in full["shapes"] if s.get("held_out", False) is part] for part in (False, True)
    }
    assert full["score"] == pytest.approx(geomean(fractions[False] + fractions[True]))
    assert full["score_public"] == pytest.approx(geomean(fractions[False]))
    assert full["score_held_out"] == pytest.approx(geomean(fractions[True]))
    metrics = cell_metrics({**full, "outcome": "pass"})
    assert metrics["score_public"] == full["score_public"] and metrics["score_held_out"] == full["score_held_out"]


def log_text(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(folder.rglob("*")) if p.is_file())


def test_an_exploit_finds_no_held_out_shape_during_a_check(held_problem, roofline, tmp_path):
    """The hunt runs (its report is in the grade's log) and finds nothing: not in the check's result, not in the
    text the agent gets, not in any log of the grade. The full grade, run after the agent stops, sends the runner
    the held-out sizes, so the same hunt reports them there."""
    solution = tmp_path / "workspace" / "solution.py"
    solution.parent.mkdir()
    solution.write_text(EXPLOIT)
    request = GradeRequest(held_problem, Path(), CPU, roofline, zygote_home=ZYGOTE_HOME)
    for mode in ("check", "bench"):
        seen = grade(request.of(mode, solution, tmp_path / mode)).to_json()
        logs = log_text(tmp_path / mode)
        assert "HUNTED" in logs and "SIZE (33, 70)" in logs  # it searched and was called on the public shapes
        assert seen["outcome"] == "pass", seen.get("message")
        assert not leaked(json.dumps(seen)) and not leaked(format_grade(seen)) and not leaked(logs)
    full = grade(request.of("full", solution, tmp_path / "full")).to_json()
    assert full["outcome"] == "pass", full.get("message")
    assert "SIZE (37, 9173)" in log_text(tmp_path / "full")


def test_run_shell_finds_no_held_out_shape(held_problem, tmp_path):
    workspace = prepare_workspace(tmp_path / "workspace", held_problem.root)
    box = Toolbox(workspace=workspace, grade=lambda mode: {}, sandbox=Sandbox(SandboxPolicy()))
    hunt = (
        "cat /workspace/*; env; cat /proc/*/cmdline; "
        "find / -xdev \\( -path /proc -o -path /sys -o -path /usr -o -name site-packages \\) -prune -o "
        "\\( -name '*.yaml' -o -name '*.md' -o -name '*.json' \\) -print 2>/dev/null | head -2000 | xargs -r cat 2>/dev/null; echo HUNTED"
    )
    output = box.tool_run_shell(hunt)
    assert "HUNTED" in output and "get_init_inputs" in output  # it ran, and read the workspace's reference
    assert not leaked(output)
    listing = box.tool_list_files() + box.tool_read_file("prompt.md")
    assert not leaked(listing)


@pytest.mark.fast
def test_records_store_the_parts_scores_only_where_held_out_shapes_were_graded():
    shapes = [
        ShapeScore({"rows": 33, "cols": 70}, 1.0, None, 1.0, None, 0.1, 0.1),
        ShapeScore(HELD_SMOKE, 2.0, None, 1.0, None, 0.2, 0.2, held_out=True),
    ]
    result = GradeResult(
        "demo/x",
        "v",
        "s.py",
        "full",
        "cpu",
        "cpu",
        "smoke_shapes",
        1,
        1.0,
        60.0,
        {},
        Outcome.PASS,
        score=0.14,
        basis="roofline",
        shapes=shapes,
        score_public=0.1,
        score_held_out=0.2,
    )
    stored = result.to_json()
    assert (stored["score_public"], stored["score_held_out"]) == (0.1, 0.2)
    assert [s.get("held_out", False) for s in stored["shapes"]] == [False, True]
    assert GradeResult.from_json(stored).to_json() == stored
    public_only = GradeResult.from_json({**stored, "shapes": stored["shapes"][:1]})  # no held-out shape graded
    assert not {"score_public", "score_held_out"} & set(public_only.to_json())
    cell = CellResult(Outcome.PASS, score=0.14, stop_reason="submitted", score_public=0.1, score_held_out=0.2)
    assert CellResult.from_json(cell.to_json()).score_held_out == 0.2
    assert "score_public" not in CellResult(Outcome.PASS, score=0.14, stop_reason="submitted").to_json()


@pytest.mark.fast
def test_the_board_shows_public_and_held_out_means_and_their_gap():
    rows = [
        row("alpha", "hard/p1", 0, score=0.5),
        row("alpha", "hard/p2", 0, score=0.4),
        row("beta", "hard/p1", 0, score=0.3),
    ]
    for found, (public, held) in zip(rows, ((0.6, 0.4), (0.5, 0.3), (None, None))):
        if public is not None:
            found.update(score_public=public, score_held_out=held)
    [board] = build_boards(rows)
    alpha, beta = sorted(board["models"], key=lambda e: e["entrant"])
    assert alpha["public_mean"] == pytest.approx(0.55) and alpha["held_out_mean"] == pytest.approx(0.35)
    assert alpha["held_out_gap"] == pytest.approx(0.2) and alpha["held_out_cells"] == 2
    assert beta["held_out_gap"] is None and beta["held_out_cells"] == 0
    header, table = board_table(board)
    columns = [header.index(name) for name in ("public mean", "held-out mean", "held-out gap")]
    by_model = {line[1]: [line[i] for i in columns] for line in table}
    assert by_model == {"alpha": ["0.55", "0.35", "0.2"], "beta": ["–", "–", "–"]}
    [plain] = build_boards([row("alpha", "hard/p1", 0)])
    assert "held-out gap" not in board_table(plain)[0]  # boards without held-out grades keep their columns


def test_a_sweeps_cell_never_shows_the_agent_a_held_out_shape_and_records_both_parts(tmp_path):
    """A real sweep (the fake provider's model writes, checks, fixes, benchmarks and submits) over the demo problem
    with held-out shapes: the prompt and every tool result in the transcript, and the workspace, hold none; the final
    grade scores them, and result.json, the MLflow run and the board carry the parts' scores."""
    from kbsweep.tracking.mlflow_store import runs_frame
    from tests.support.fake_provider import FakeProvider
    from tests.support.scripts import multi_turn_fix
    from tests.support.sweeps import cell_runs, model_yaml, results, sweep

    problems = tmp_path / "problems" / "demo"
    problems.mkdir(parents=True)
    problem_copy(problems)
    with FakeProvider(multi_turn_fix()) as fp:
        model_yaml(tmp_path / "conf", "fake-openai", "openai/fake-openai", fp.base_url)
        proc = sweep(
            tmp_path / "conf",
            tmp_path / "outputs",
            "model=fake-openai",
            f"paths.problems=[{REPO / 'problems'},{tmp_path / 'problems'}]",
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = results(tmp_path / "outputs")["fake-openai"]
    assert result["outcome"] == "pass", result.get("message")
    folder = Path(result["folder"])
    transcript = (folder / "transcript.jsonl").read_text()
    assert "rows=33, cols=70" in transcript and "run_benchmark" in transcript  # the prompt's shapes, the tools' results
    assert not leaked(transcript) and not leaked(log_text(folder / "workspace"))
    grade_record = json.loads((folder / "grade.json").read_text())
    assert [s["shape"] for s in grade_record["shapes"] if s.get("held_out")] == [HELD_SMOKE]
    assert (result["score_public"], result["score_held_out"]) == (
        grade_record["score_public"],
        grade_record["score_held_out"],
    )
    [run] = cell_runs(tmp_path / "outputs")
    assert run.data.metrics["score_held_out"] == pytest.approx(result["score_held_out"])
    [board] = build_boards(runs_frame(f"sqlite:///{tmp_path / 'outputs'}/mlflow.db"))
    [entry] = board["models"]
    assert entry["held_out_cells"] == 1 and entry["held_out_gap"] == pytest.approx(
        result["score_public"] - result["score_held_out"]
    )


@pytest.mark.fast
def test_every_bundled_problem_holds_out_shapes():
    """Every problem under problems/ (demo, hard, mega, multi, proof) holds out a GPU shape and a smoke shape: an
    exact-shape fast path for the sizes the agent saw meets a size it never did."""
    folders = sorted(p.parent for p in (REPO / "problems").glob("*/*/problem.yaml"))
    problems = [load_problem(folder, folder.parent.name) for folder in folders]
    assert {p.track for p in problems} >= {"demo", "hard", "mega", "multi", "proof"}
    missing = [
        p.id
        for p in problems
        if not (p.held_out_shapes("shapes") and p.held_out_shapes("smoke_shapes") and p.spec.held_out_smoke_shapes)
    ]
    assert not missing, f"no held-out shapes: {missing}"


def kernelbench_file(folder: Path, name: str, sizes: str, inputs: str, forward: str = "return a * 2") -> Path:
    path = folder / f"{name}.py"
    path.write_text(
        f"import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, *args):\n        a = args[0]\n        {forward}\n\n\n"
        f"{sizes}\n\n\ndef get_inputs():\n    return [{inputs}]\n\n\ndef get_init_inputs():\n    return []\n"
    )
    return path


def test_kernelbench_problems_hold_out_a_scaled_batch_or_say_why_not(tmp_path):
    """A KernelBench file becomes a problem holding out its batch scaled (on the GPU's sizes and on the smoke
    sizes), checked to run; sizes tied to the batch move with it; a file with no batch to scale, or one too small,
    says so in ``no_held_out``. The bundled sample's files all hold one out."""
    from kbsweep.config.kernelbench import kernelbench_names, materialize_all

    sample = REPO / "problems/kernelbench_sample"
    for root in materialize_all(sample, kernelbench_names(sample)):
        problem = load_problem(root, "kernelbench")
        [gpu], [smoke] = problem.held_out_shapes("shapes"), problem.held_out_shapes("smoke_shapes")
        assert (
            set(gpu) == {"batch_size"}
            and gpu not in problem.shapes("shapes")
            and smoke not in problem.shapes("smoke_shapes")
        )
    kernelbench_file(tmp_path, "1_plain", "batch_size = 16\ndim = 64", "torch.randn(batch_size, dim)")
    kernelbench_file(
        tmp_path,
        "2_tied",
        "batch_size = 32\ninput_shape = (32,)",
        "torch.randn(batch_size, 8), torch.randn(*input_shape, 8)",
        "return a + args[1]",
    )
    kernelbench_file(tmp_path, "3_no_batch", "rows = 16\ndim = 64", "torch.randn(rows, dim)")
    kernelbench_file(tmp_path, "4_single", "batch_size = 2\ndim = 64", "torch.randn(batch_size, dim)")
    specs = {
        root.name: load_problem(root, "kernelbench").spec
        for root in materialize_all(tmp_path, kernelbench_names(tmp_path))
    }
    assert specs["1_plain"].held_out_shapes == specs["1_plain"].held_out_smoke_shapes == [{"batch_size": 11}]
    assert specs["2_tied"].held_out_shapes == [{"batch_size": 23, "input_shape[0]": 23}]
    assert specs["3_no_batch"].no_held_out == "no module-level batch size (batch_size, batch, bs) to scale"
    assert specs["4_single"].no_held_out == "batch_size = 2 leaves no smaller batch to hold out"
    assert not specs["3_no_batch"].held_out_shapes and not specs["4_single"].held_out_smoke_shapes
