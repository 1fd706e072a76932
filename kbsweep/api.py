"""The Python API: the CLI's verbs as functions returning typed records.

    import kbsweep
    p = kbsweep.plan("model=scripted,scripted-lazy", "gpu=cpu")      # Plan: cells, estimate, missing keys
    r = kbsweep.run("model=scripted", "gpu=cpu", "launcher=inline")  # Run: the sweep, its unfinished cells, its report
    g = kbsweep.grade("demo/scale_shift", "my.py", "gpu=cpu")        # Grade: outcome, score, the grader's whole result
    b = kbsweep.report()                                              # Report: boards and the files written

Arguments are the CLI's overrides; a comma list sweeps (no ``-m`` needed); ``config_dir`` is the CLI's ``-cd``.
Errors are the CLI's: :class:`~kbsweep.KbsweepError` (a config or input error, one line) and
:class:`~kbsweep.InfraError`. Output goes where the CLI sends it (progress and the board to the terminal).
"""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig, open_dict

from kbsweep import REPO_ROOT, ExitCode


@dataclass
class PlannedCell:
    key: str
    label: str
    model: str
    harness: str
    problem: str
    gpu: str
    repeat: int


@dataclass
class Plan:
    """What a sweep would run and cost; ``expected_tokens`` is the per-cell assumption behind ``model_usd``."""

    cells: List[PlannedCell]
    model_usd: float
    unpriced_models: List[str]
    gpu_hours_cap: float
    rent_usd_cap: float
    expected_tokens: Dict[str, Dict[str, int]]
    harnesses: List[str]
    missing_keys: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    boards: List[Dict[str, Any]]
    files: Dict[str, str]


@dataclass
class Run:
    """A finished invocation: ``unfinished`` holds the keys of cells left without a finished record (infra faults)."""

    sweep: str
    cells: List[PlannedCell]
    unfinished: List[str]
    report: Report

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.INFRA if self.unfinished else ExitCode.OK


@dataclass
class Grade:
    outcome: str
    score: Optional[float]
    exit_code: ExitCode
    result: Dict[str, Any]


def planned(cell: Any) -> PlannedCell:
    return PlannedCell(cell.key, cell.label, cell.model["name"], cell.harness["name"], cell.problem, cell.gpu["name"], cell.repeat)


def plan_of(cells: List[Any]) -> Plan:
    """The :class:`Plan` of built cells (``kbsweep plan`` prints it)."""
    from kbsweep.harness import runner_for
    from kbsweep.matrix import estimate
    from kbsweep.preflight import missing_keys

    est = estimate(cells)
    harnesses = {cell.harness["name"]: cell.harness for cell in cells}
    return Plan(
        cells=[planned(c) for c in cells], model_usd=est["model_usd"], unpriced_models=est["unpriced_models"], gpu_hours_cap=est["gpu_hours_cap"],
        rent_usd_cap=est["rent_usd_cap"], expected_tokens=est["expected_tokens"], harnesses=[runner_for(h).describe() for h in harnesses.values()],
        missing_keys=[check.line() for check in missing_keys(cells)],
    )


def compose(overrides: Sequence[str], verb: str, config_dir: Optional[str] = None) -> List[DictConfig]:
    """Every config of the sweep the overrides describe, checked and prepared as the CLI's are."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from kbsweep.cli import check_overrides, prepare

    argv = check_overrides([*overrides, *(["-cd", str(config_dir)] if config_dir else [])])
    argv = [a for a in argv if a not in ("-cd", str(config_dir))]
    axes = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.input_line]
            for o in OverridesParser.create().parse_overrides(argv)]
    extra = [f"verb={verb}"] + ([f"hydra.searchpath=[file://{Path(config_dir).resolve()}]"] if config_dir else [])
    cfgs = []
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "conf")):
        for combo in itertools.product(*axes):
            cfg = hydra_compose(config_name="config", overrides=[*combo, *extra], return_hydra_config=True)
            hydra_cfg = cfg.hydra
            with open_dict(cfg):
                del cfg["hydra"]
            cfgs.append(prepare(cfg, hydra_cfg))
    return cfgs


def plan(*overrides: str, config_dir: Optional[str] = None) -> Plan:
    from kbsweep.matrix import build_matrix

    return plan_of(build_matrix(compose(overrides, "plan", config_dir)))


def report(*overrides: str, config_dir: Optional[str] = None) -> Report:
    from kbsweep.cli import write_boards

    boards, files = write_boards(compose(overrides, "report", config_dir)[0])
    return Report(boards, {k: str(v) for k, v in files.items()})


def run(*overrides: str, config_dir: Optional[str] = None) -> Run:
    """Run (resume) the sweep, preflight first, then write its report."""
    from kbsweep.cli import sweep_cells, write_boards

    cfgs = compose(overrides, "run", config_dir)
    cells, left = sweep_cells(cfgs)
    boards, files = write_boards(cfgs[0])
    return Run(cells[0].sweep if cells else "", [planned(c) for c in cells], [c.key for c in left], Report(boards, {k: str(v) for k, v in files.items()}))


def grade(problem: str, solution: str, *overrides: str, config_dir: Optional[str] = None) -> Grade:
    """Grade one file (``problem``: ``<track>/<name>``)."""
    from kbsweep.cli import grade_file

    result, code = grade_file(compose([f"problem={problem}", f"solution={solution}", *overrides], "grade", config_dir)[0])
    return Grade(result["outcome"], result.get("score"), code, result)
