"""Malformed inputs, as a careless user writes them: each is one line naming the file (or the override) and the
key, exit code 2, never a traceback, and nothing launched; exit codes of grade and of a refused Slurm job."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Callable, List, NamedTuple, Optional

import pytest

from kbsweep import ExitCode, cli
from tests.conftest import kbsweep

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "problems" / "demo" / "scale_shift"
CONFIG = "conf/config.yaml"


class Case(NamedTuple):
    args: List[
        str
    ]  # overrides (a verb first, else the run verb); {user} is the user's config folder, {problems} and {specs} the user's roots
    needles: List[str]  # each must be in the one error line: the file (or override) and the key
    files: dict = {}  # user files: path under tmp → text, or a function of the demo problem's file text


def problem(
    name: str, yaml: Optional[Callable[[str], str]] = None, reference: Optional[Callable[[str], str]] = None
) -> dict:
    """A copy of demo/scale_shift as the user's demo/<name>, its problem.yaml and reference.py edited."""
    return {
        f"problems/demo/{name}/problem.yaml": yaml or (lambda text: text),
        f"problems/demo/{name}/reference.py": reference or (lambda text: text),
        f"problems/demo/{name}/prompt.md": lambda text: text,
    }


def roofline(text: str) -> dict:
    return {"specs/bad.yaml": text}


SPEC = "peaks_tflops: {fp32: 0.1}\ndram_gbps: 20\n"
ON_PROBLEM = ["paths.problems=[{repo}/problems,{problems}]", "gpu=cpu"]
ON_SPEC = ["paths.roofline_specs=[{specs}]", "gpu=cpu", "gpu.roofline=bad", "problem=scale_shift"]

CASES = {
    # overrides: unknown choices and keys, syntax
    "unknown model": Case(["model=nope-9"], ["model=nope-9", "Could not find 'model/nope-9'"]),
    "unknown gpu": Case(["gpu=tpu-v9"], ["gpu=tpu-v9", "key 'gpu'"]),
    "unknown track": Case(["track=easy"], ["track=easy", "key 'track'"]),
    "unknown launcher": Case(["launcher=k8s"], ["launcher=k8s", "key 'launcher'"]),
    "unknown tracking": Case(["tracking=wandb"], ["tracking=wandb", "key 'tracking'"]),
    "unknown model in a sweep": Case(
        ["-m", "model=scripted,nope"], ["model=scripted,nope", "Could not find 'model/nope'"]
    ),
    "unknown root key": Case(["foo=1"], ["foo=1", "key 'foo'"]),
    "unknown grade key": Case(["grade.nope=1"], ["grade.nope=1", "key 'grade.nope'"]),
    "unknown model key": Case(["model.temprature=1"], ["model.temprature=1", "key 'model.temprature'"]),
    "unknown track key": Case(["track.max_turn=3"], ["track.max_turn=3", "key 'track.max_turn'"]),
    "override syntax": Case(["problem=[a,b"], ["problem=[a,b"]),
    "space after a comma": Case(
        ["-m", "model=scripted,", "scripted-lazy"], ["'model=scripted,'", "write 'model=scripted,scripted-lazy'"]
    ),
    "space before a comma": Case(
        ["-m", "model=scripted", ",scripted-lazy"], ["',scripted-lazy'", "write 'model=scripted,scripted-lazy'"]
    ),
    "space for a comma": Case(
        ["-m", "model=scripted", "scripted-lazy"], ["'scripted-lazy'", "write 'model=scripted,scripted-lazy'"]
    ),
    "interval over a group": Case(["-m", "model=interval(0,1)"], ["model=interval(0,1)", "cannot enumerate", "glob()"]),
    "interval over a number": Case(
        ["-m", "repeat=interval(0,3)"], ["repeat=interval(0,3)", "cannot enumerate", "range()"]
    ),
    "glob over a number": Case(["-m", "repeat=glob(*)"], ["repeat=glob(*)", "'repeat' is no group"]),
    "glob matching no file": Case(["-m", "model=glob(nope*)"], ["model=glob(nope*)", "matches none of"]),
    "unknown problem": Case(["problem=nope"], ["problem nope is not in track 'demo'"]),
    # numbers and choices out of range
    "repeat not a number": Case(["repeat=abc"], [CONFIG, "key 'repeat'"]),
    "negative repeat": Case(["repeat=-1"], [CONFIG, "key 'repeat'"]),
    "device tpu": Case(["gpu=cpu", "gpu.device=tpu"], ["gpu/cpu.yaml", "key 'device'"]),
    "unknown shape set": Case(["gpu=cpu", "gpu.shape_set=huge_shapes"], ["gpu/cpu.yaml", "key 'shape_set'"]),
    "negative hourly price": Case(["gpu=h100", "gpu.hourly_usd=-1"], ["gpu/h100.yaml", "key 'hourly_usd'"]),
    "baseline unknown on a gpu": Case(["gpu=cpu", "gpu.baselines=[eager,magic]"], ["gpu/cpu.yaml", "key 'baselines'"]),
    "model concurrency 0": Case(["model.concurrency=0"], ["model/scripted.yaml", "key 'concurrency'"]),
    "negative model timeout": Case(["model.timeout_s=-1"], ["model/scripted.yaml", "key 'timeout_s'"]),
    "unknown provider": Case(["model.provider=openai"], ["model/scripted.yaml", "key 'provider'"]),
    "zero context window": Case(["model.context_window=0"], ["model/scripted.yaml", "key 'context_window'"]),
    "zero retry attempts": Case(["model.retry.max_attempts=0"], ["model/scripted.yaml", "key 'retry.max_attempts'"]),
    "negative price": Case(["model.prices.input=-1"], ["model/scripted.yaml", "key 'prices.input'"]),
    "context window a word": Case(["model.context_window=lots"], ["model/scripted.yaml", "key 'context_window'"]),
    "zero time cap": Case(["track.time_cap_s=0"], ["track/demo.yaml", "key 'time_cap_s'"]),
    "negative grade timeout": Case(["track.grade_timeout_s=-5"], ["track/demo.yaml", "key 'grade_timeout_s'"]),
    "zero turns": Case(["track.max_turns=0"], ["track/demo.yaml", "key 'max_turns'"]),
    "turns a word": Case(["track.max_turns=abc"], ["track/demo.yaml", "key 'max_turns'"]),
    "zero world size": Case(["track.world_size=0"], ["track/demo.yaml", "key 'world_size'"]),
    "negative dollar budget": Case(["track.max_usd=-3"], ["track/demo.yaml", "key 'max_usd'"]),
    "unknown problem format": Case(["track.format=zip"], ["track/demo.yaml", "key 'format'"]),
    "launcher concurrency 0": Case(["launcher.concurrency=0"], ["launcher/local.yaml", "key 'concurrency'"]),
    "unknown span location": Case(["tracking.trace_spans=s3"], ["tracking/sqlite.yaml", "key 'trace_spans'"]),
    "unknown launcher kind": Case(["launcher.kind=k8s"], ["launcher/local.yaml", "key 'kind'"]),
    "negative requeue": Case(["launcher.requeue_infra=-1"], ["launcher/local.yaml", "key 'requeue_infra'"]),
    "zero slurm memory": Case(
        ["launcher=slurm", "launcher.slurm.mem_gb=0"], ["launcher/slurm.yaml", "key 'slurm.mem_gb'"]
    ),
    "unknown sandbox mode": Case(["sandbox.mode=docker"], ["sandbox.mode must be one of"]),
    "zero sandbox memory": Case(["sandbox.memory_mib=0"], [CONFIG, "key 'sandbox.memory_mib'"]),
    "negative disk quota": Case(["sandbox.disk_mib=-1"], [CONFIG, "key 'sandbox.disk_mib'"]),
    "zero grade memory": Case(["grade.memory_mib=0"], [CONFIG, "key 'grade.memory_mib'"]),
    "zero timing runs": Case(["grade.timing.min_runs=0"], [CONFIG, "key 'grade.timing.min_runs'"]),
    "fractional timing runs": Case(
        ["plan", "grade.timing.min_runs=1.5"], [CONFIG, "key 'grade.timing.min_runs'", "an integer"]
    ),
    "timing runs a float": Case(
        ["plan", "grade.timing.max_runs=100.0"], [CONFIG, "key 'grade.timing.max_runs'", "an integer"]
    ),
    "unknown preflight mode, planned": Case(
        ["plan", "preflight=maybe"], [CONFIG, "key 'preflight'", "one of live, keys, off"]
    ),
    "negative timing error": Case(["grade.timing.rel_err=-1"], [CONFIG, "key 'grade.timing.rel_err'"]),
    "replay not a boolean": Case(["grade.timing.replay=often"], [CONFIG, "key 'grade.timing.replay'"]),
    "negative quiet CPUs": Case(["grade.timing.quiet_cpus=-1"], [CONFIG, "key 'grade.timing.quiet_cpus'"]),
    "quiet wait not a number": Case(["grade.timing.quiet_wait_s=forever"], [CONFIG, "key 'grade.timing.quiet_wait_s'"]),
    "zero baseline precision": Case(["grade.timing.ci_rel=0"], [CONFIG, "key 'grade.timing.ci_rel'"]),
    "fresh baselines not a boolean": Case(["grade.fresh_baselines=sometimes"], [CONFIG, "key 'grade.fresh_baselines'"]),
    "unknown baseline": Case(["grade.baselines=[eager,magic]"], [CONFIG, "key 'grade.baselines'"]),
    # config files of the user's folder
    "gpu yaml syntax error": Case(
        ["-cd", "{user}", "gpu=broken"], ["gpu/broken.yaml:2", "broken YAML"], {"user/gpu/broken.yaml": "name: [x\n"}
    ),
    "gpu yaml device tpu": Case(
        ["-cd", "{user}", "gpu=tpu"],
        ["gpu/tpu.yaml", "key 'device'"],
        {"user/gpu/tpu.yaml": "name: tpu\ndescription: a TPU\nroofline: cpu\ndevice: tpu\n"},
    ),
    "gpu yaml missing roofline spec": Case(
        ["-cd", "{user}", "gpu=ghost"],
        ["gpu.roofline", "no roofline spec 'ghost'"],
        {"user/gpu/ghost.yaml": "name: ghost\ndescription: x\nroofline: ghost\ndevice: cpu\n"},
    ),
    "model yaml typo": Case(
        ["-cd", "{user}", "model=typo"],
        ["model/typo.yaml", "key 'pricez'"],
        {"user/model/typo.yaml": "name: typo\nprovider: scripted\npricez: {}\n"},
    ),
    # roofline specs
    "roofline yaml syntax error": Case(ON_SPEC, ["specs/bad.yaml"], roofline("peaks_tflops: {fp32: 0.1\n")),
    "roofline peaks a word": Case(
        ON_SPEC, ["specs/bad.yaml", "key 'peaks_tflops'"], roofline("peaks_tflops: fast\ndram_gbps: 20\n")
    ),
    "roofline peak a word": Case(
        ON_SPEC, ["specs/bad.yaml", "key 'peaks_tflops.fp32'"], roofline("peaks_tflops: {fp32: fast}\ndram_gbps: 20\n")
    ),
    "roofline zero peak": Case(
        ON_SPEC, ["specs/bad.yaml", "key 'peaks_tflops.fp32'"], roofline("peaks_tflops: {fp32: 0}\ndram_gbps: 20\n")
    ),
    "roofline no peaks": Case(ON_SPEC, ["specs/bad.yaml", "key 'peaks_tflops'"], roofline("dram_gbps: 20\n")),
    "roofline negative bandwidth": Case(
        ON_SPEC, ["specs/bad.yaml", "key 'dram_gbps'"], roofline("peaks_tflops: {fp32: 0.1}\ndram_gbps: -20\n")
    ),
    "roofline bandwidth a word": Case(
        ON_SPEC, ["specs/bad.yaml", "key 'dram_gbps'"], roofline("peaks_tflops: {fp32: 0.1}\ndram_gbps: fast\n")
    ),
    "roofline negative l2": Case(ON_SPEC, ["specs/bad.yaml", "key 'l2_mib'"], roofline(SPEC + "l2_mib: -2\n")),
    "roofline a list": Case(ON_SPEC, ["specs/bad.yaml"], roofline("- 1\n- 2\n")),
    "roofline without the problem's peak": Case(
        ON_SPEC, ["scale_shift/problem.yaml", "key 'peak'"], roofline("peaks_tflops: {bf16: 1}\ndram_gbps: 20\n")
    ),
    # problem folders
    "problem yaml syntax error": Case(
        ON_PROBLEM + ["problem=p1"], ["p1/problem.yaml"], problem("p1", yaml=lambda t: t + "shapes: [\n")
    ),
    "problem yaml unknown key": Case(
        ON_PROBLEM + ["problem=p2"],
        ["p2/problem.yaml", "key 'tolerence'"],
        problem("p2", yaml=lambda t: t + "tolerence: {}\n"),
    ),
    "no shapes": Case(
        ON_PROBLEM + ["problem=p3"],
        ["p3/problem.yaml", "key 'shapes'"],
        problem("p3", yaml=lambda t: t.split("shapes:")[0] + "shapes: []\n"),
    ),
    "negative shape": Case(
        ON_PROBLEM + ["problem=p4"],
        ["p4/problem.yaml", "key 'smoke_shapes[0].rows'"],
        problem("p4", yaml=lambda t: t.replace("{rows: 64", "{rows: -64")),
    ),
    "zero shape": Case(
        ON_PROBLEM + ["problem=p5", "gpu=h100"],
        ["p5/problem.yaml", "key 'shapes[2].cols'"],
        problem("p5", yaml=lambda t: t.replace("cols: 1537", "cols: 0")),
    ),
    "tolerance key not a dtype": Case(
        ON_PROBLEM + ["problem=p6"],
        ["p6/problem.yaml", "key 'tolerance.float33'"],
        problem("p6", yaml=lambda t: t.replace("  float32: {atol: 1.0e-5", "  float33: {atol: 1.0e-5")),
    ),
    "negative atol": Case(
        ON_PROBLEM + ["problem=p7"],
        ["p7/problem.yaml", "key 'tolerance.float32.atol'"],
        problem("p7", yaml=lambda t: t.replace("{atol: 1.0e-5, rtol: 1.0e-5}", "{atol: -1.0, rtol: 1.0e-5}")),
    ),
    "unknown tolerance key": Case(
        ON_PROBLEM + ["problem=p8"],
        ["p8/problem.yaml", "key 'tolerance.float32.abstol'"],
        problem("p8", yaml=lambda t: t.replace("{atol: 1.0e-5, rtol", "{abstol: 1.0e-5, rtol")),
    ),
    "cosine over 1": Case(
        ON_PROBLEM + ["problem=p9"],
        ["p9/problem.yaml", "key 'tolerance.float32.cosine'"],
        problem("p9", yaml=lambda t: t.replace("{atol: 1.0e-5, rtol: 1.0e-5}", "{cosine: 2}")),
    ),
    "stress tolerance key not a dtype": Case(
        ON_PROBLEM + ["problem=p10"],
        ["p10/problem.yaml", "key 'stress[0].tolerance.fp32'"],
        problem("p10", yaml=lambda t: t.replace("tolerance: {float32:", "tolerance: {fp32:")),
    ),
    "negative stress scale": Case(
        ON_PROBLEM + ["problem=p11"],
        ["p11/problem.yaml", "key 'stress[0].input_scale'"],
        problem("p11", yaml=lambda t: t.replace("input_scale: 1.0e3", "input_scale: -1.0")),
    ),
    "unknown regime": Case(
        ON_PROBLEM + ["problem=p12"],
        ["p12/problem.yaml", "key 'regime'"],
        problem("p12", yaml=lambda t: t.replace("regime: memory", "regime: fast")),
    ),
    "unknown score": Case(
        ON_PROBLEM + ["problem=p13"],
        ["p13/problem.yaml", "key 'score'"],
        problem("p13", yaml=lambda t: t + "score: best\n"),
    ),
    "zero seeds": Case(
        ON_PROBLEM + ["problem=p14"],
        ["p14/problem.yaml", "key 'seeds'"],
        problem("p14", yaml=lambda t: t.replace("seeds: 2", "seeds: 0")),
    ),
    "formula with an unknown name": Case(
        ON_PROBLEM + ["problem=p15"],
        ["demo/p15", "formula '2*rows*colz'"],
        problem("p15", yaml=lambda t: t.replace('"2*rows*cols"', '"2*rows*colz"')),
    ),
    "peak the roofline lacks": Case(
        ON_PROBLEM + ["problem=p16"],
        ["p16/problem.yaml", "key 'peak'"],
        problem("p16", yaml=lambda t: t.replace("peak: fp32", "peak: fp64")),
    ),
    "seeds a word": Case(
        ON_PROBLEM + ["problem=p17"],
        ["p17/problem.yaml", "key 'seeds'"],
        problem("p17", yaml=lambda t: t.replace("seeds: 2", "seeds: many")),
    ),
    # references
    "reference syntax error": Case(
        ON_PROBLEM + ["problem=r1"],
        ["r1/reference.py", "does not import", "SyntaxError"],
        problem("r1", reference=lambda t: t + "def broken(:\n"),
    ),
    "reference import error": Case(
        ON_PROBLEM + ["problem=r2"],
        ["r2/reference.py", "does not import", "ModuleNotFoundError"],
        problem("r2", reference=lambda t: "import kbsweep_no_such_module\n" + t),
    ),
    "reference without get_inputs": Case(
        ON_PROBLEM + ["problem=r3"],
        ["r3/reference.py", "key 'get_inputs'"],
        problem("r3", reference=lambda t: t.split("def get_inputs")[0]),
    ),
    "reference without Model": Case(
        ON_PROBLEM + ["problem=r4"],
        ["r4/reference.py", "key 'Model'"],
        problem("r4", reference=lambda t: t.replace("class Model(", "class Modle(")),
    ),
    "reference inputs fail": Case(
        ON_PROBLEM + ["problem=r5"],
        ["r5/reference.py", "key 'get_inputs'", "KeyError"],
        problem("r5", reference=lambda t: t.replace('shape["rows"]', 'shape["row"]')),
    ),
    "reference forward fails": Case(
        ON_PROBLEM + ["problem=r6"],
        ["r6/reference.py", "key 'forward'"],
        problem("r6", reference=lambda t: t.replace("return x * self.weight", "return x @ self.weight.view(1, -1)")),
    ),
    "reference exits on import": Case(
        ON_PROBLEM + ["problem=r7"],
        ["r7/reference.py", "does not import", "SystemExit"],
        problem("r7", reference=lambda t: "import sys\nsys.exit(3)\n" + t),
    ),
}


def materialize(tmp_path: Path, case: Case) -> dict:
    """Write the case's files; the placeholders its arguments may use."""
    for relative, content in case.files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content((DEMO / path.name).read_text()) if callable(content) else content)
    return {"user": tmp_path / "user", "problems": tmp_path / "problems", "specs": tmp_path / "specs", "repo": REPO}


@pytest.mark.parametrize("name", list(CASES))
def test_a_malformed_input_is_one_line_naming_file_and_key_and_launches_nothing(name, tmp_path, monkeypatch, capsys):
    case = CASES[name]
    places = materialize(tmp_path, case)
    outputs = tmp_path / "outputs"
    monkeypatch.setenv("KBSWEEP_OUTPUTS", str(outputs))
    monkeypatch.setattr(sys, "argv", ["kbsweep", *(arg.format(**places) for arg in case.args)])
    monkeypatch.setattr(cli, "COMPOSED", [])
    with pytest.raises(SystemExit) as info:
        cli.main()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert info.value.code == ExitCode.CONFIG and len(lines) == 1 and lines[0].startswith("kbsweep: error: "), err
    assert all(needle in lines[0] for needle in case.needles), lines[0]
    assert not (outputs / "sweeps").exists() and not (outputs / "mlflow.db").exists()  # nothing launched


@pytest.mark.fast
def test_the_table_is_large():
    assert len(CASES) >= 60


def test_grade_exits_3_for_the_models_failure(outputs):
    """(A pass exits 0: tests/test_grader.py.)"""
    wrong = kbsweep(
        "grade",
        "problem=demo/scale_shift",
        "gpu=cpu",
        "gpu.baselines=[]",
        f"solution={DEMO / 'solutions' / 'wrong.py'}",
    )
    assert wrong.returncode == ExitCode.MODEL and '"outcome": "incorrect"' in wrong.stdout, wrong.stderr[-2000:]


def test_a_job_slurm_refuses_is_one_line_and_exit_code_4(outputs, tmp_path):
    """sbatch that fails (a bad partition, a down controller): no submitit traceback."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (
        ("sbatch", "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2; exit 1"),
        ("srun", "exit 1"),
        ("sacct", "exit 0"),
    ):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{shutil.os.environ['PATH']}"}
    proc = kbsweep("launcher=slurm", "launcher.slurm.partition=nope", "gpu=cpu", "problem=scale_shift", env=env)
    assert proc.returncode == ExitCode.INFRA, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert (
        "kbsweep: error: Slurm refused the job of scripted · demo/scale_shift · cpu · r0: "
        "sbatch: error: Batch job submission failed: Invalid partition name specified" in proc.stderr
    )
    # the cells it started are closed at once as infrastructure outcomes, never left RUNNING until the next run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{outputs}/mlflow.db")
    experiment = client.get_experiment_by_name("demo")
    runs = client.search_runs([experiment.experiment_id], "tags.`kbsweep.kind` = 'cell'")
    assert [(r.info.status, r.data.tags["outcome"]) for r in runs] == [("FAILED", "node_failure")]
    assert "Invalid partition name specified" in runs[0].data.tags["message"]
    [sweep] = client.search_runs([experiment.experiment_id], "tags.`kbsweep.kind` = 'sweep'")
    assert sweep.info.status == "FAILED" and sweep.data.metrics["cells_failed"] == 1
