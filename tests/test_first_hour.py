"""A new user's first hour, as typed: Hydra's override forms through the installed `kbsweep`, unknown keys and comma
lists as one line, the README's set-up of its commands and its Python API block run verbatim, broken YAML named by
line and column, calibrating a GPU this machine lacks, and why a passing grade has no score."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kbsweep.score.roofline import score_note

REPO = Path(__file__).resolve().parent.parent
KBSWEEP = Path(sys.executable).parent / "kbsweep"  # the installed command
DEMO = REPO / "problems" / "demo" / "scale_shift"
TORCH_ONLY = """import torch


class ModelNew(torch.nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cols))
        self.bias = torch.nn.Parameter(torch.empty(cols))

    def forward(self, x):
        return torch.addcmul(self.bias, x, self.weight)
"""


def typed(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`kbsweep ARGS` in a shell's environment without API keys, from ``cwd``."""
    base = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return subprocess.run(
        [str(KBSWEEP), *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("kbsweep: error: "), proc.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize(
    "override, hours",
    [
        ("track.time_cap_s=3600", 2.0),  # key=v
        ("+track.world_size=2", 2 * 600 / 3600 * 2),  # +key=v: demo.yaml has no world_size
        ("++track.time_cap_s=1800", 1.0),  # ++key=v: set (demo.yaml has it)
        ("++track.world_size=3", 2 * 600 / 3600 * 3),  # ++key=v: add
        ("~track.time_cap_s", 2 * 3.0),  # ~key: the schema's default, 10 800 s
        ("~track.time_cap_s=600", 2 * 3.0),  # ~key=v: deleted where it holds v
    ],
)
def test_every_hydra_override_form_reaches_the_plan(override, hours, outputs, tmp_path):
    """Two demo cells, each capped at track.time_cap_s × track.world_size: the plan's GPU-hour cap shows the value."""
    proc = typed("plan", "--json", "gpu=cpu", override, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads(proc.stdout)
    assert len(plan["cells"]) == 2 and plan["gpu_hours_cap"] == pytest.approx(hours)


@pytest.mark.parametrize(
    "override, needles",
    [
        ("+track.max_turns=5", ["already at 'track.max_turns'", "++track.max_turns=5"]),  # + where the YAML has the key
        ("~track.time_cap_s=601", ["'track.time_cap_s' is 600 and not 601"]),
        ("~grade.compile_mode", ["key 'grade.compile_mode'", "grade.compile_mode=..."]),  # no default to fall back on
    ],
)
def test_a_refused_hydra_form_is_one_line(override, needles, outputs, tmp_path):
    line = one_error_line(typed("plan", "gpu=cpu", override, cwd=tmp_path))
    assert all(needle in line for needle in needles), line


@pytest.mark.parametrize(
    "override", ["grade.timeout_s=10", "+grade.timeout_s=10", "++grade.timeout_s=10", "~grade.timeout_s"]
)
def test_an_unknown_key_names_the_real_one_in_every_form(override, outputs, tmp_path):
    line = one_error_line(typed("plan", "gpu=cpu", override, cwd=tmp_path))
    assert "key 'grade.timeout_s'" in line and "did you mean 'track.grade_timeout_s" in line, line


@pytest.mark.parametrize("override", ["+foo=1", "++sweep.owner=me", "+model.prices.input_cached=1"])
def test_adding_a_key_kbsweep_never_reads_is_refused(override, outputs, tmp_path):
    key = override.lstrip("+").split("=")[0]
    assert f"key '{key}'" in one_error_line(typed("plan", "gpu=cpu", override, cwd=tmp_path))


@pytest.mark.parametrize(
    "override",
    ["+model.options.temperature=0.2", "model.options.top_p=0.9", "+launcher.slurm.additional_parameters.gres=gpu:1"],
)
def test_free_form_sections_take_new_keys(override, outputs, tmp_path):
    proc = typed("plan", "gpu=cpu", override, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(
    "override, cells",
    [
        ("model=glob(scripted*)", {("scripted", 0), ("scripted-lazy", 0)}),  # a group's files, matched
        ("model=glob([inst*,scripted*],exclude=*-lazy)", {("instant", 0), ("scripted", 0)}),
        ("repeat=range(0,3)", {("scripted", 0), ("scripted", 1), ("scripted", 2)}),
        ("model=choice(scripted,instant)", {("scripted", 0), ("instant", 0)}),
    ],
)
def test_hydras_sweep_functions_reach_the_plan(override, cells, outputs, tmp_path):
    proc = typed("plan", "--json", "-m", override, "gpu=cpu", "problem=scale_shift", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {(cell["model"], cell["repeat"]) for cell in json.loads(proc.stdout)["cells"]} == cells


def test_a_sweep_over_a_glob_and_a_range_runs_every_cell(outputs, tmp_path):
    proc = typed(
        "-m",
        "model=glob(inst*)",
        "repeat=range(0,2)",
        "track=instant",
        "problem=scale_shift",
        "gpu=cpu",
        "launcher=inline",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list((outputs / "sweeps" / "instant").glob("*/result.json"))) == 2


def test_a_comma_list_without_m_is_one_line_and_launches_nothing(outputs, tmp_path):
    line = one_error_line(typed("model=scripted,scripted-lazy", cwd=tmp_path))
    assert "model=scripted,scripted-lazy" in line and "add -m" in line, line
    assert not outputs.exists()


def readme() -> str:
    return (REPO / "README.md").read_text()


def test_the_readme_set_up_lines_stand_and_its_commands_activate_the_venv_first(outputs):
    """The first two lines make the venv; the "Using it" block's first line activates it, and in a shell whose PATH
    lacks it that line is what puts `kbsweep` there."""
    first = re.search(r"```bash\n(.*?)```", readme(), re.S).group(1).splitlines()
    assert first[0].startswith("python3 -m venv .venv && .venv/bin/pip install -e '.[cpu]' && .venv/bin/kbsweep   #")
    assert first[1].startswith("bash scripts/test.sh   ")
    using = re.search(r"## Using it\n.*?```bash\n(.*?)```", readme(), re.S).group(1).splitlines()
    activate = using[0].split("  #")[0].strip()
    assert activate == ". .venv/bin/activate"
    if not (REPO / ".venv" / "bin" / "kbsweep").exists():
        pytest.skip("this checkout's venv is elsewhere")
    path = os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if Path(p).resolve() != KBSWEEP.parent.resolve()
    )
    env = {**os.environ, "PATH": path}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(
        ["bash", "-c", "command -v kbsweep || echo absent"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.stdout.strip() == "absent"
    proc = subprocess.run(
        ["bash", "-c", f"{activate} && kbsweep plan gpu=cpu problem=scale_shift"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "1 cells" in proc.stdout, proc.stderr[-2000:]


def test_the_api_names_stay_functions_once_their_submodules_are_imported():
    code = (
        "import kbsweep, kbsweep.api, kbsweep.cli; from kbsweep.reporting.report import build_boards; import kbsweep.reporting.report; "
        "assert [getattr(kbsweep, n) for n in kbsweep.API] == [getattr(kbsweep.api, n) for n in kbsweep.API]; "
        "import sys; assert sys.modules['kbsweep.reporting.report'].build_boards is build_boards"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]


def scratch_problem(root: Path, yaml_text: str) -> Path:
    folder = root / "problems" / "demo" / "broken"
    shutil.copytree(DEMO, folder, ignore=shutil.ignore_patterns("solutions", "__pycache__"))
    (folder / "problem.yaml").write_text(yaml_text)
    return folder


@pytest.mark.parametrize(
    "text, where, key",
    [
        ("name: broken\nshapes: [\n", "problem.yaml:3:1:", "key 'shapes'"),  # a bracket left open
        (
            "name: broken\ntolerance:\n  float32: {atol: 1.0e-5, rtol: 1.0e-5}\n   bad: 3\n",
            "problem.yaml:4:4:",
            "key 'tolerance.float32'",
        ),
        ("name: broken\n\tregime: memory\n", "problem.yaml:2:1:", "key 'regime'"),  # a tab
    ],
)
def test_broken_problem_yaml_names_file_line_column_and_key(text, where, key, outputs, tmp_path):
    folder = scratch_problem(tmp_path, text)
    line = one_error_line(
        typed(
            "plan", "gpu=cpu", f"paths.problems=[{REPO}/problems,{tmp_path}/problems]", "problem=broken", cwd=tmp_path
        )
    )
    assert f"{folder}/{where}" in line and key in line and "broken YAML" in line, line


def test_broken_roofline_spec_names_file_line_column_and_key(outputs, tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "bad.yaml").write_text("peaks_tflops: {fp32: 0.1\ndram_gbps: 20\n")
    line = one_error_line(
        typed(
            "plan",
            "gpu=cpu",
            f"paths.roofline_specs=[{specs}]",
            "gpu.roofline=bad",
            "problem=scale_shift",
            cwd=tmp_path,
        )
    )
    assert f"{specs}/bad.yaml:2:10:" in line and "key 'peaks_tflops'" in line and "flow mapping at 1:15" in line, line


def test_calibrating_a_gpu_this_machine_lacks_is_one_line(outputs, tmp_path):
    """No GPU visible (CUDA_VISIBLE_DEVICES empty, so on any machine)."""
    line = one_error_line(typed("calibrate", "gpu=h200", cwd=tmp_path, env={"CUDA_VISIBLE_DEVICES": ""}))
    assert "gpu=h200" in line and "no GPU is visible here; use gpu=cpu" in line, line  # as a grade's refusal says
    assert not (outputs / "calibration").exists()


@pytest.mark.parametrize(
    "result, note",
    [
        ({"outcome": "pass", "score": 0.5}, None),
        ({"outcome": "incorrect", "score": None}, None),
        ({"outcome": "pass", "score": None, "timings": []}, "nothing was timed"),
        (
            {"outcome": "pass", "score": None, "timings": [{}], "basis": "speedup", "speedup": {}},
            "no baseline was timed",
        ),
        (
            {
                "outcome": "pass",
                "score": None,
                "timings": [{}],
                "basis": "roofline",
                "speedup": {"eager": 2.0},
                "findings": [{"kind": "no_kernel", "detail": "no kernel of the candidate's own in /timing/0"}],
            },
            "no_kernel (no kernel of the candidate's own",
        ),
    ],
)
def test_score_note_says_why_a_pass_has_no_score(result, note):
    said = score_note(result)
    assert said == note if note is None else note in said


def test_a_torch_only_grade_says_why_it_has_no_score(outputs, tmp_path):
    """Correct, but every kernel it launches is torch's: a pass whose figures are void (no_kernel), said on stderr."""
    (tmp_path / "mine.py").write_text(TORCH_ONLY)
    proc = typed("grade", "problem=demo/scale_shift", "solution=mine.py", "gpu=cpu", cwd=tmp_path)
    result = json.loads(proc.stdout)
    assert proc.returncode == 0 and result["outcome"] == "pass", proc.stderr[-2000:]
    assert result["score"] is None and "no_kernel" in {f["kind"] for f in result["findings"]}, result["findings"]
    assert "no_kernel" in result["score_note"] and f"[kbsweep] pass, no score: {result['score_note']}" in proc.stderr
    assert result["gpu"] == "cpu" and result["env"]["graded_on"] == []  # graded on no GPU, as gpu=cpu says


def test_grading_on_a_gpu_that_is_not_here_is_one_line_before_any_grade(outputs, tmp_path):
    """gpu=h100 where no GPU is visible (CUDA_VISIBLE_DEVICES empty, so on any machine): refused with gpu=cpu."""
    (tmp_path / "mine.py").write_text(TORCH_ONLY)
    proc = typed(
        "grade",
        "problem=demo/scale_shift",
        "solution=mine.py",
        "gpu=h100",
        cwd=tmp_path,
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    line = one_error_line(proc)
    assert "gpu=h100" in line and "'NVIDIA H100 80GB HBM3'" in line and "no GPU is visible here; use gpu=cpu" in line, (
        line
    )
    assert proc.stdout == ""  # no grade's result


def up(url: str, within_s: float) -> None:
    """Wait for a server to answer ``url``."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def test_a_sweep_prints_the_mlflow_address_that_opens_on_its_runs(outputs, tmp_path):
    """The sweep's experiment is tagged a model-training one holding kbsweep's runs view, and the address the sweep
    prints opens MLflow's UI (as the README starts it) on the experiment's runs table in that view (the cells'
    score and outcome among its columns), not its GenAI overview."""
    from kbsweep.tracking.mlflow_store import make_client
    from tests.test_tracking_server import free_port

    proc = typed("gpu=cpu", "problem=scale_shift", "launcher=inline", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    uri = f"sqlite:///{outputs}/mlflow.db"
    experiment = make_client(uri).get_experiment_by_name("demo")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert "mlflow.sharedViewState.kbsweep-cells" in experiment.tags
    address = f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs?viewStateShareKey=kbsweep-cells&workflowType=machine_learning"
    assert f"[kbsweep] runs of 'demo': mlflow ui --backend-store-uri {uri}, then {address}" in proc.stderr
    resumed = typed(
        "gpu=cpu", "problem=scale_shift", "launcher=inline", cwd=tmp_path, env={"PYTHONPROFILEIMPORTTIME": "1"}
    )
    assert resumed.returncode == 0 and f"then {address}" in resumed.stderr, resumed.stderr[-2000:]
    # every cell finished and the store untouched: the address comes from the snapshot, MLflow is never imported
    assert not re.search(r"^import time:.*\|\s+mlflow\b", resumed.stderr, re.M)
    if not (Path("/usr/bin/chromium").exists() and Path("/usr/bin/chromedriver").exists()):
        pytest.skip("no Chromium to open the address in")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.test_browser_mlflow_ui import CHROMEDRIVER, CHROMIUM, FLAGS

    port = free_port()
    server = subprocess.Popen(
        [str(KBSWEEP.parent / "mlflow"), "ui", "--backend-store-uri", uri, "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        up(f"http://127.0.0.1:{port}/health", 120)
        driver.get(address.replace(":5000", f":{port}"))
        WebDriverWait(driver, 90).until(lambda d: "/runs" in d.current_url or "/overview" in d.current_url)
        assert f"/experiments/{experiment.experiment_id}/runs" in driver.current_url, driver.current_url
        columns = lambda d: {h.get_attribute("col-id") for h in d.find_elements(By.CSS_SELECTOR, ".ag-header-cell")}  # noqa: E731
        WebDriverWait(driver, 90).until(lambda d: {"metrics.`score`", "tags.`outcome`"} <= columns(d))
    finally:
        driver.quit()
        server.terminate()
        server.wait(timeout=60)
