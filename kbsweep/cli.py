"""The command line: ``kbsweep [verb] [hydra overrides]``. Hydra composes, the verb acts on the composed configs.

With ``-m``, the kbsweep Hydra launcher (hydra_plugins/kbsweep_launcher) collects every job's config and calls
the verb once with all of them, so a sweep sees its whole matrix. Adding a verb is one decorated function.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, NoReturn, Sequence

from omegaconf import DictConfig, OmegaConf

from kbsweep.compose import prepare
from kbsweep.config.overrides import check_overrides, check_yaml, hydra_error, split_options
from kbsweep.config.schema import as_dict
from kbsweep.errors import ExitCode, InfraError, KbsweepError
from kbsweep.paths import REPO_ROOT, remove_orphans
from kbsweep.reporting.verify import take_source  # `kbsweep verify SOURCE`: its verb and its argument
from kbsweep.tracking.mlflow_store import mlflow_defaults

VERBS: Dict[str, Callable[[List[DictConfig]], int]] = {}
USAGE = """usage: kbsweep [VERB] [--force] [--json] [--mode MODE] [--no-audit] [-m] [key=value ...]

verbs:
{verbs}

Overrides are Hydra's: model=opus-4.8 gpu=h100 track=hard problem=topk repeat=0,1,2 (with -m for sweeps).
Add a user folder of YAML with -cd DIR. Hydra's own help: kbsweep --hydra-help.
"""


def verb(name: str):
    """Register a verb: ``fn(cfgs) -> exit code``."""

    def register(fn: Callable[[List[DictConfig]], int]):
        VERBS[name] = fn
        return fn

    return register


def fail(code: ExitCode, error: object) -> NoReturn:
    """Print ``error`` as kbsweep's one line (one per line of it) and exit with ``code``."""
    for line in str(error).splitlines():
        print(f"kbsweep: error: {line}", file=sys.stderr)
    sys.exit(code)


def dispatch(cfgs: List[DictConfig]) -> None:
    """Run the verb the configs name and exit with its code (Hydra would drop a returned one); user errors and
    infrastructure failures become one line and their exit codes."""
    name = cfgs[0].verb
    try:
        if name not in VERBS:
            raise KbsweepError(f"unknown verb '{name}' ({', '.join(sorted(VERBS))})")
        code = VERBS[name](cfgs)
    except KbsweepError as exc:
        fail(ExitCode.CONFIG, exc)
    except InfraError as exc:
        fail(ExitCode.INFRA, exc)
    except KeyboardInterrupt:
        print("kbsweep: interrupted", file=sys.stderr)
        sys.exit(ExitCode.INTERRUPTED)
    sys.exit(code)


def sweep_cells(cfgs: Sequence[DictConfig]) -> tuple:
    """Run (resume) the sweep of ``cfgs`` after its preflight; returns (its cells, those left unfinished, those its
    budget did not start)."""
    from kbsweep.launch.budget import Budget, Ledger
    from kbsweep.launch.sweep import run_sweep
    from kbsweep.planner.budget import sweep_budget
    from kbsweep.planner.matrix import build_matrix
    from kbsweep.planner.preflight import refuse_on_failure

    cells = build_matrix(cfgs)
    cfg = cfgs[0]
    mode = str(cfg.preflight)  # one of PREFLIGHT_MODES: checked with every config (kbsweep.config.schema.RULES)
    limits = sweep_budget(cfgs, cells)
    budget = Ledger(limits) if limits else Budget()
    left = run_sweep(
        cells,
        as_dict(cfg.tracking),
        as_dict(cfg.launcher),
        bool(cfg.sweep.force),
        lambda todo: refuse_on_failure(todo, mode),
        budget,
    )
    return cells, left, budget.held


@verb("run")
def run_verb(cfgs: List[DictConfig]) -> int:
    """Run a sweep (resuming it), then print its own leaderboards (the report files keep every sweep's)."""
    from kbsweep.reporting.render import render_terminal
    from kbsweep.tracking.mlflow_store import runs_link

    cells, left, _ = sweep_cells(cfgs)  # cells the budget did not start are no fault: run_sweep said so in one line
    sweeps = {cell.sweep for cell in cells}
    boards, _ = write_boards(cfgs[0])
    print(render_terminal([board for board in boards if board["sweep"] in sweeps]))
    known = {name: id_ for board in boards for name, id_ in board.get("experiment_ids", {}).items()}
    for sweep in sorted(sweeps):
        print(
            f"[kbsweep] runs of '{sweep}': {runs_link(str(cfgs[0].tracking.uri), sweep, known.get(sweep))}",
            file=sys.stderr,
        )
    if left:
        print(
            f"[kbsweep] {len(left)} of {len(cells)} cells are not finished (infrastructure faults); run the sweep again",
            file=sys.stderr,
        )
        return ExitCode.INFRA
    return ExitCode.OK


@verb("preflight")
def preflight_verb(cfgs: List[DictConfig]) -> int:
    """Check each model's key and route with one tiny request (preflight=keys: the keys only); runs nothing else.
    The models that pass are listed on stdout, each failure is a sweep's preflight error."""
    from kbsweep.planner.matrix import build_matrix
    from kbsweep.planner.preflight import preflight, refuse_failed

    checks = preflight(build_matrix(cfgs), "keys" if cfgs[0].preflight == "keys" else "live")
    for check in checks:
        if check.status == "ok":
            print(f"{check.status:<11} {check.line()}")
    if not checks:
        print("no model calls a provider (scripted or replay models only)")
    refuse_failed(checks)
    return ExitCode.OK


@verb("plan")
def plan_verb(cfgs: List[DictConfig]) -> int:
    """Print the cells, the harnesses (with the CLIs' versions), the count, a cost estimate and missing keys (--json: as JSON); run nothing."""
    from kbsweep.planner.budget import plan_line
    from kbsweep.planner.planning import plan_sweep

    plan = plan_sweep(cfgs)
    if cfgs[0].json:
        print(json.dumps(plan.to_dict(), indent=1))
        return 0
    for cell in plan.cells:
        print(f"{cell.key}  {cell.label}")
    print("harnesses: " + "; ".join(plan.harnesses))
    usd = f"${plan.model_usd:.2f}" + (f" + unpriced: {', '.join(plan.unpriced_models)}" if plan.unpriced_models else "")
    print(
        f"{len(plan.cells)} cells; model spend ≈ {usd}; GPU time cap {plan.gpu_hours_cap:.1f} GPU-h (≤ ${plan.rent_usd_cap:.2f} rent)"
    )
    for name, tokens in plan.expected_tokens.items():
        print(
            f"  {name}: assumes {tokens['input']:,} input / {tokens['output']:,} output tokens per cell (model.expected_tokens)"
        )
    if plan.judge:
        judge = plan.judge
        usd = "unpriced" if judge["usd"] is None else f"${judge['usd']:.2f}"
        print(
            f"judge: {', '.join(f'{m} ({n} cells)' for m, n in judge['models'].items())}; ≈ {usd}, "
            f"{judge['expected_tokens']['input']:,} input / {judge['expected_tokens']['output']:,} output tokens a call (audit.judge)"
        )
    if plan.budget:
        print(plan_line(plan.budget))
    for line in plan.missing_keys:
        print(f"missing key: {line}")
    return 0


@verb("grade")
def grade_verb(cfgs: List[DictConfig]) -> int:
    """Grade one solution file: ``kbsweep grade problem=<track>/<name> solution=<file> gpu=<name>``; JSON on stdout, its
    ``audit`` a cell's (``--no-audit``: none; ``--mode profile``: the agent's run_profile summary as text)."""
    from kbsweep.agent.tools import format_profile
    from kbsweep.launch.regrade import audit_line

    result, code = grade_file(cfgs[0], audit=not NO_AUDIT)
    profile = result["mode"] == "profile" and not cfgs[0].json
    print(format_profile(result) if profile else json.dumps(result, indent=1, default=str))
    if result.get("score_note"):
        print(f"[kbsweep] {result['outcome']}, no score: {result['score_note']}", file=sys.stderr)
    if "audit" in result:  # a profile is neither scored nor audited
        print(f"[kbsweep] audit: {audit_line(result['audit'])}", file=sys.stderr)
    return code


def grade_file(cfg: DictConfig, audit: bool = True) -> tuple:
    """(the grader's result, the exit code it means) for ``cfg.solution`` on ``cfg.problem``; the result's ``audit``
    is the audit a cell would give it (None with ``audit`` false; none for a profile)."""
    from kbsweep.cell import configured_grader
    from kbsweep.config.gpus import GpuSpec, require_card
    from kbsweep.config.problem_folders import find_problem_dir
    from kbsweep.config.problems import load_problem
    from kbsweep.grader.processes import referee_prober
    from kbsweep.grader.request import MODES
    from kbsweep.outcomes import Outcome
    from kbsweep.planner.validate import check_problem, check_references, reference_probe
    from kbsweep.sandbox.confine import SandboxPolicy
    from kbsweep.score.roofline import load_roofline, score_note

    if not cfg.problem or "/" not in str(cfg.problem) or not cfg.solution:
        raise KbsweepError("grade needs problem=<track>/<name> and solution=<file>")
    mode = str(cfg.grade_mode)
    if mode not in MODES:
        raise KbsweepError(f"conf/config.yaml: key 'grade_mode': '{mode}' is not one of {', '.join(MODES)}")
    track, name = str(cfg.problem).split("/", 1)
    solution = Path(cfg.solution)
    if not solution.is_file():
        raise KbsweepError(f"solution file {solution} does not exist")
    conf = as_dict(cfg)
    gpu = GpuSpec(**conf["gpu"])
    require_card(gpu)
    folder, fmt = (cfg.track.problems_dir, cfg.track.format) if track == cfg.track.name else (track, "kbsweep")
    problem = load_problem(
        find_problem_dir(list(cfg.paths.problems), folder, name, fmt, cfg.track.kernelbench_version), track
    )
    roofline = load_roofline(list(cfg.paths.roofline_specs), cfg.gpu.roofline)
    # the grading zygotes start here (torch imported in each) and the checks below run meanwhile
    run = configured_grader(
        problem, roofline, Path(cfg.paths.outputs), gpu, conf["track"], conf["grade"], conf["paths"]
    )
    check_problem(problem, cfg.gpu.shape_set, roofline, cfg.gpu.roofline)
    prober = referee_prober(
        problem,
        gpu.device,
        int(conf["track"].get("world_size", 1)),
        (),
        SandboxPolicy.of(conf["track"]),
        (Path(cfg.paths.outputs) / "zygotes").resolve(),
    )
    check_references([reference_probe(problem)], prober)  # in the referee's zygote: one torch import fewer
    result = run(mode, solution, f"{track}-{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    note = score_note(result) if mode != "profile" else None  # a profile is never scored
    if note:
        result["score_note"] = note
    if mode != "profile":
        from kbsweep.launch.regrade import audit_file

        result["audit"] = audit_file(problem, solution, result) if audit else None
    outcome = Outcome(result["outcome"])
    return result, ExitCode.OK if outcome == Outcome.PASS else ExitCode.INFRA if outcome.is_infra else ExitCode.MODEL


@verb("report")
def report_verb(cfgs: List[DictConfig]) -> int:
    """Leaderboards per (track, GPU) from the tracking store; Markdown, JSON and HTML with plots in outputs/reports."""
    from kbsweep.reporting.render import render_terminal

    boards, paths = write_boards(cfgs[0])
    print(render_terminal(boards))
    if paths:
        print(
            f"[kbsweep] report: {paths['html']} (also report.md, report.json; logged to each sweep's latest run)",
            file=sys.stderr,
        )
    return 0


@verb("regrade")
def regrade_verb(cfgs: List[DictConfig]) -> int:
    """Grade a sweep's stored final solutions again under gpu= and track= (sweep.name=; --force: regraded ones too)."""
    from kbsweep.launch.regrade import regrade_sweep

    cfg = cfgs[0]
    done = regrade_sweep(as_dict(cfg), bool(cfg.sweep.force))
    print(f"[kbsweep] {len(done)} solutions of sweep '{cfg.sweep.name}' regraded on {cfg.gpu.name}", file=sys.stderr)
    report_verb(cfgs)
    return 0


def write_boards(cfg: DictConfig) -> tuple:
    """(the boards of the tracking store, the report files written and logged to each sweep's latest run); read
    back from the reports folder's snapshot while nothing was logged since it was written (:mod:`kbsweep.tracking.snapshot`)."""
    from kbsweep.reporting.render import write_report
    from kbsweep.reporting.report import attach_regrades, build_boards
    from kbsweep.tracking import snapshot
    from kbsweep.tracking.mlflow_store import log_report, make_client, require_server, runs_frame

    folder = Path(cfg.paths.outputs) / "reports"
    saved = snapshot.load(folder / ".boards.json", cfg.tracking.uri)
    if saved is not None and (folder / "report.html").exists():
        return saved["boards"], saved.get("paths") or {}
    require_server(cfg.tracking.uri)  # asked again: a server may have gone since this process's client was made
    taken = snapshot.stamp(cfg.tracking.uri)
    boards = attach_regrades(build_boards(runs_frame(cfg.tracking.uri)), runs_frame(cfg.tracking.uri, kind="regrade"))
    paths: Dict[str, Any] = {}
    if boards:
        ids = {
            experiment.name: experiment.experiment_id
            for experiment in make_client(cfg.tracking.uri).search_experiments()
        }
        for board in boards:
            board["experiment_ids"] = {name: ids[name] for name in board["experiments"] if name in ids}
        paths = write_report(boards, folder)
        log_report(cfg.tracking.uri, sorted({name for board in boards for name in board["experiments"]}), folder)
    snapshot.save(
        folder / ".boards.json",
        cfg.tracking.uri,
        taken,
        {"boards": json.loads(json.dumps(boards, default=str)), "paths": {k: str(v) for k, v in paths.items()}},
    )
    return boards, paths


@verb("calibrate")
def calibrate_verb(cfgs: List[DictConfig]) -> int:
    """Measure attainable peaks here; store them in outputs/ (and in the roofline spec with calibrate.write_spec=true)."""
    from kbsweep.score.calibrate import calibrate
    from kbsweep.score.roofline import find_roofline

    cfg = cfgs[0]
    measured = calibrate(as_dict(cfg.gpu))
    out = Path(cfg.paths.outputs) / "calibration" / f"{cfg.gpu.name}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(measured), out)
    if cfg.calibrate.write_spec:
        path = find_roofline(list(cfg.paths.roofline_specs), cfg.gpu.roofline)
        spec = OmegaConf.load(path)
        spec.measured = measured
        OmegaConf.save(spec, path)
    print(OmegaConf.to_yaml(OmegaConf.create(measured)))
    return 0


@verb("export")
def export_verb(cfgs: List[DictConfig]) -> int:
    """Write a Hugging Face dataset folder (a trace-viewer JSONL per run, index.jsonl) to outputs/export or +out=DIR
    (a relative DIR under outputs/)."""
    from kbsweep.reporting.export import export_dataset

    cfg = cfgs[0]
    out = Path(cfg.paths.outputs) / str(cfg.get("out") or "export")  # an absolute out stands as given
    summary = export_dataset(cfg.tracking.uri, out)
    print(f"exported {summary['runs']} runs ({summary['traces']} traces) to {summary['out']}")
    return 0


OVERRIDE: Dict[str, str] = {}  # `kbsweep audit override RUN --verdict V --reason R`, parsed before Hydra sees argv
NO_AUDIT: List[bool] = []  # `kbsweep grade --no-audit`, taken out of argv before Hydra sees it


def take_override(argv: List[str]) -> List[str]:
    """Parse ``RUN --verdict V --reason R`` into OVERRIDE; returns the remaining (Hydra) arguments."""
    import argparse

    parser = argparse.ArgumentParser(prog="kbsweep audit override")
    parser.add_argument("run")
    parser.add_argument("--verdict", required=True)
    parser.add_argument("--reason", required=True)
    args, rest = parser.parse_known_args(argv)
    OVERRIDE.update(run=args.run, verdict=args.verdict, reason=args.reason)
    return rest


@verb("audit")
def audit_verb(cfgs: List[DictConfig]) -> int:
    """Re-audit stored runs (audit.runs, else every cell of sweep.name); `audit override RUN --verdict V --reason R`."""
    from kbsweep.audit import store
    from kbsweep.planner import judging

    cfg = cfgs[0]
    if OVERRIDE:
        entry = store.override(cfg.tracking.uri, OVERRIDE["run"], OVERRIDE["verdict"], OVERRIDE["reason"])
        print(f"{entry['run_id']}: {entry['previous']} -> {entry['board']} ({entry['by']}: {entry['reason']})")
        return 0
    judge = (
        judge_model(str(cfg.audit.judge))
        if cfg.audit.judge and str(cfg.audit.judge).lower() not in judging.OFF
        else None
    )
    for done in store.reaudit(cfg.tracking.uri, cfg.sweep.name, list(cfg.audit.runs), list(cfg.paths.problems), judge):
        kinds = f" ({', '.join(done['kinds'])})" if done["kinds"] else ""
        print(f"{done['run_id']} {done['problem']} {done['model']}: {done['previous']} -> {done['verdict']}{kinds}")
    return 0


def judge_model(name: str):
    """The judge: a model YAML of the ``model`` group, validated like any cell's model (the same loader the cells
    of a sweep use)."""
    from kbsweep.agent.providers import model_conf
    from kbsweep.audit.judge import LazyModel

    return LazyModel(model_conf(name))


def main() -> None:
    remove_orphans()  # what a kbsweep process killed by SIGKILL left in the system's temporary folder
    argv = sys.argv[1:]
    name = argv.pop(0) if argv and not argv[0].startswith("-") and "=" not in argv[0] else "run"
    argv = take_source(name, argv, VERBS)
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE.format(verbs="\n".join(f"  {n:<8} {(f.__doc__ or '').splitlines()[0]}" for n, f in VERBS.items())))
        return
    if name == "audit" and argv[:1] == ["override"]:
        argv = take_override(argv[1:])
    if "--no-audit" in argv:  # grade's: the file is graded, not audited
        if name != "grade":
            fail(ExitCode.CONFIG, f"--no-audit is an option of grade, not of {name}")
        argv.remove("--no-audit")
        NO_AUDIT.append(True)
    for flag, override in (("--force", "sweep.force=true"), ("--json", "json=true")):
        if flag in argv:
            argv.remove(flag)
            argv.append(override)
    if "--mode" in argv[:-1]:  # --mode profile: grade_mode=profile
        at = argv.index("--mode")
        argv[at : at + 2] = [f"grade_mode={argv[at + 1]}"]
    argv = ["--help" if a == "--hydra-help" else a for a in argv]
    mlflow_defaults()
    try:
        check_yaml(argv)
        argv = check_overrides(argv, sweeps=bool({"-m", "--multirun"} & set(argv)))
    except KbsweepError as exc:
        fail(ExitCode.CONFIG, exc)
    options, overrides = split_options(argv)
    sys.argv = [sys.argv[0], *options, *overrides, f"verb={name}"]
    os.environ["HYDRA_FULL_ERROR"] = (
        "1"  # Hydra raises rather than printing its report: a composition error becomes one line
    )
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        hydra_main()
    except (HydraException, OmegaConfBaseException) as exc:
        if COMPOSED:  # raised by kbsweep's own code, past composition: a bug
            raise
        fail(ExitCode.CONFIG, hydra_error(exc))


COMPOSED: List[bool] = []  # set once Hydra has composed a config and kbsweep's own code runs


def prepare_or_fail(cfg: DictConfig, hydra_cfg) -> DictConfig:
    """:func:`prepare`, a user error becoming one line and exit code CONFIG."""
    COMPOSED.append(True)
    try:
        return prepare(cfg, hydra_cfg)
    except KbsweepError as exc:
        fail(ExitCode.CONFIG, exc)


def hydra_main() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    @hydra.main(version_base="1.3", config_path=str(REPO_ROOT / "conf"), config_name="config")
    def single(cfg: DictConfig) -> None:
        prepare_or_fail(cfg, HydraConfig.get())
        dispatch([cfg])

    single()


if __name__ == "__main__":
    main()
