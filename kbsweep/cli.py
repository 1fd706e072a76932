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
from typing import Callable, Dict, List

from omegaconf import DictConfig, OmegaConf, open_dict

from kbsweep import REPO_ROOT, KbsweepError
from kbsweep.config import group_source, validate

VERBS: Dict[str, Callable[[List[DictConfig]], int]] = {}
USAGE = """usage: kbsweep [VERB] [--force] [-m] [key=value ...]

verbs:
{verbs}

Overrides are Hydra's: model=opus-4.8 gpu=h100 track=hard problem=topk repeat=0,1,2 (with -m for sweeps).
Add a user folder of YAML with -cd DIR. Hydra's own help: kbsweep --hydra-help.
"""

if not OmegaConf.has_resolver("kbsweep_root"):
    OmegaConf.register_new_resolver("kbsweep_root", lambda: str(REPO_ROOT))
    OmegaConf.register_new_resolver("kbsweep_cwd", os.getcwd)


def verb(name: str):
    """Register a verb: ``fn(cfgs) -> exit code``."""

    def register(fn: Callable[[List[DictConfig]], int]):
        VERBS[name] = fn
        return fn

    return register


def resolve_gpu(cfg: DictConfig, hydra_cfg) -> None:
    """gpu=auto: the gpu YAML whose nvml_names match the local GPU, else cpu."""
    from kbsweep import gpus

    found = gpus.list_gpus()
    name = "cpu"
    if found:
        for source in hydra_cfg.runtime.config_sources:
            folder = Path(source.path) / "gpu"
            if source.schema != "file" or not folder.is_dir():
                continue
            for path in sorted(folder.glob("*.yaml")):
                if found[0]["name"] in (OmegaConf.load(path).get("nvml_names") or []):
                    name = path.stem
        if name == "cpu":
            raise KbsweepError(f"gpu=auto: no gpu/*.yaml lists '{found[0]['name']}' in nvml_names; add one")
    path = Path(group_source(hydra_cfg, "gpu", name))
    with open_dict(cfg):
        cfg.gpu = OmegaConf.load(path)


def prepare(cfg: DictConfig, hydra_cfg) -> DictConfig:
    """Validate every group against its schema (one line naming file and key on error), resolve gpu=auto."""
    sources = {g: group_source(hydra_cfg, g, str(hydra_cfg.runtime.choices.get(g))) for g in ("model", "gpu", "track", "harness", "launcher", "tracking")}
    if cfg.gpu.get("name") == "auto":
        resolve_gpu(cfg, hydra_cfg)
        sources["gpu"] = f"gpu/{cfg.gpu.name}.yaml"
    return validate(cfg, sources)


def dispatch(cfgs: List[DictConfig]) -> int:
    """Run the verb the configs name; user errors become one line and exit code 2."""
    name = cfgs[0].verb
    try:
        if name not in VERBS:
            raise KbsweepError(f"unknown verb '{name}' ({', '.join(sorted(VERBS))})")
        return VERBS[name](cfgs)
    except KbsweepError as exc:
        print(f"kbsweep: error: {exc}", file=sys.stderr)
        sys.exit(2)


@verb("run")
def run_verb(cfgs: List[DictConfig]) -> int:
    """Run a sweep (resuming it), then print its leaderboard."""
    from kbsweep.matrix import build_matrix
    from kbsweep.sweep import run_sweep

    cells = build_matrix(cfgs)
    cfg = cfgs[0]
    run_sweep(cells, OmegaConf.to_container(cfg.tracking, resolve=True), OmegaConf.to_container(cfg.launcher, resolve=True), bool(cfg.sweep.force))
    return report_verb(cfgs)


@verb("plan")
def plan_verb(cfgs: List[DictConfig]) -> int:
    """Print the cells, the harnesses (with the CLIs' versions), the count and a cost estimate; run nothing."""
    from kbsweep.harness import runner_for
    from kbsweep.matrix import build_matrix, estimate

    cells = build_matrix(cfgs)
    for cell in cells:
        print(f"{cell.key}  {cell.label}")
    harnesses = {cell.harness["name"]: cell.harness for cell in cells}
    print("harnesses: " + "; ".join(runner_for(conf).describe() for conf in harnesses.values()))
    est = estimate(cells)
    usd = f"${est['model_usd']:.2f}" + (f" + unpriced: {', '.join(est['unpriced_models'])}" if est["unpriced_models"] else "")
    print(f"{est['cells']} cells; model spend ≈ {usd}; GPU time cap {est['gpu_hours_cap']:.1f} GPU-h (≤ ${est['rent_usd_cap']:.2f} rent)")
    return 0


@verb("grade")
def grade_verb(cfgs: List[DictConfig]) -> int:
    """Grade one solution file: ``kbsweep grade problem=<track>/<name> solution=<file> gpu=<name>``; JSON on stdout."""
    from types import SimpleNamespace

    from kbsweep.grader import grade
    from kbsweep.problems import find_problem_dir, load_problem
    from kbsweep.sandbox import SandboxPolicy
    from kbsweep.score import load_roofline

    cfg = cfgs[0]
    if not cfg.problem or "/" not in str(cfg.problem) or not cfg.solution:
        raise KbsweepError("grade needs problem=<track>/<name> and solution=<file>")
    track, name = str(cfg.problem).split("/", 1)
    solution = Path(cfg.solution)
    if not solution.is_file():
        raise KbsweepError(f"solution file {solution} does not exist")
    folder, fmt = (cfg.track.problems_dir, cfg.track.format) if track == cfg.track.name else (track, "kbsweep")
    problem = load_problem(find_problem_dir(list(cfg.paths.problems), folder, name, fmt), track)
    roofline = load_roofline(list(cfg.paths.roofline_specs), cfg.gpu.roofline)
    gpu = SimpleNamespace(**OmegaConf.to_container(cfg.gpu, resolve=True))
    result = grade(
        problem,
        solution,
        gpu,
        roofline,
        baselines=list(cfg.gpu.baselines or cfg.grade.baselines),
        timeout_s=cfg.track.grade_timeout_s,
        memory_mib=cfg.grade.memory_mib,
        timing=OmegaConf.to_container(cfg.grade.timing, resolve=True),
        compile_mode=cfg.grade.compile_mode,
        log_dir=Path(cfg.paths.outputs) / "grades" / f"{track}-{name}-{time.strftime('%Y%m%d-%H%M%S')}",
        world_size=cfg.track.world_size,
        sandbox=SandboxPolicy.of(OmegaConf.to_container(cfg.track, resolve=True)),
    )
    print(json.dumps(result, indent=1, default=str))
    return 0 if result["outcome"] == "pass" else 1


@verb("report")
def report_verb(cfgs: List[DictConfig]) -> int:
    """Leaderboards per (track, GPU) from the tracking store; Markdown, JSON and HTML with plots in outputs/reports."""
    from kbsweep.report import build_boards, render_terminal, write_report
    from kbsweep.tracking import log_report, runs_frame

    cfg = cfgs[0]
    boards = build_boards(runs_frame(cfg.tracking.uri))
    print(render_terminal(boards))
    if boards:
        folder = Path(cfg.paths.outputs) / "reports"
        paths = write_report(boards, folder)
        log_report(cfg.tracking.uri, sorted({name for board in boards for name in board["experiments"]}), folder)
        print(f"[kbsweep] report: {paths['html']} (also report.md, report.json; logged to each sweep's latest run)", file=sys.stderr)
    return 0


@verb("calibrate")
def calibrate_verb(cfgs: List[DictConfig]) -> int:
    """Measure attainable peaks here; store them in outputs/ (and in the roofline spec with calibrate.write_spec=true)."""
    from kbsweep.calibrate import calibrate
    from kbsweep.score import find_roofline

    cfg = cfgs[0]
    measured = calibrate(cfg.gpu.device)
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
    """Write a Hugging Face dataset folder (a trace-viewer JSONL per run, index.jsonl) to outputs/export or +out=DIR."""
    from kbsweep.export import export_dataset

    cfg = cfgs[0]
    out = Path(cfg.get("out") or Path(cfg.paths.outputs) / "export")
    summary = export_dataset(cfg.tracking.uri, out)
    print(f"exported {summary['runs']} runs ({summary['traces']} traces) to {summary['out']}")
    return 0


OVERRIDE: Dict[str, str] = {}  # `kbsweep audit override RUN --verdict V --reason R`, parsed before Hydra sees argv


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

    cfg = cfgs[0]
    if OVERRIDE:
        entry = store.override(cfg.tracking.uri, OVERRIDE["run"], OVERRIDE["verdict"], OVERRIDE["reason"])
        print(f"{entry['run_id']}: {entry['previous']} -> {entry['board']} ({entry['by']}: {entry['reason']})")
        return 0
    judge = judge_model(str(cfg.audit.judge)) if cfg.audit.judge else None
    for done in store.reaudit(cfg.tracking.uri, cfg.sweep.name, list(cfg.audit.runs), list(cfg.paths.problems), judge):
        kinds = f" ({', '.join(done['kinds'])})" if done["kinds"] else ""
        print(f"{done['run_id']} {done['problem']} {done['model']}: {done['previous']} -> {done['verdict']}{kinds}")
    return 0


def judge_model(name: str):
    """The judge: a model YAML of the ``model`` group, validated like any cell's model (the same loader the cells
    of a sweep use)."""
    from kbsweep.audit.judge import LazyModel, model_conf

    return LazyModel(model_conf(name))


def check_yaml(argv: List[str]) -> None:
    """Parse every YAML of the config search path first: a broken file is one line, not a traceback."""
    import yaml
    from omegaconf.errors import OmegaConfBaseException

    folders = [REPO_ROOT / "conf"]
    for i, arg in enumerate(argv):
        if arg in ("-cd", "--config-dir") and i + 1 < len(argv):
            folders.append(Path(argv[i + 1]))
        elif arg.startswith("--config-dir="):
            folders.append(Path(arg.split("=", 1)[1]))
    for folder in folders:
        for path in sorted(folder.rglob("*.yaml")):
            try:
                OmegaConf.load(path)
            except (yaml.YAMLError, OmegaConfBaseException) as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f"{path}:{mark.line + 1}" if mark else str(path)
                print(f"kbsweep: error: {where}: broken YAML ({getattr(exc, 'problem', None) or exc})", file=sys.stderr)
                sys.exit(2)


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE.format(verbs="\n".join(f"  {n:<8} {(f.__doc__ or '').splitlines()[0]}" for n, f in VERBS.items())))
        return
    name = argv.pop(0) if argv and not argv[0].startswith("-") and "=" not in argv[0] else "run"
    if name == "audit" and argv[:1] == ["override"]:
        argv = take_override(argv[1:])
    if "--force" in argv:
        argv.remove("--force")
        argv.append("sweep.force=true")
    argv = ["--help" if a == "--hydra-help" else a for a in argv]
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    check_yaml(argv)
    sys.argv = [sys.argv[0], *argv, f"verb={name}"]
    hydra_main()


def hydra_main() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    @hydra.main(version_base="1.3", config_path=str(REPO_ROOT / "conf"), config_name="config")
    def single(cfg: DictConfig) -> int:
        try:
            prepare(cfg, HydraConfig.get())
        except KbsweepError as exc:
            print(f"kbsweep: error: {exc}", file=sys.stderr)
            sys.exit(2)
        return dispatch([cfg])

    single()


if __name__ == "__main__":
    main()
