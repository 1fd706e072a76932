"""The Python API: the CLI's verbs as functions returning typed records.

    import kbsweep
    p = kbsweep.plan("model=scripted,scripted-lazy", "gpu=cpu")      # Plan: cells, estimate, budget, missing keys
    r = kbsweep.run("model=scripted", "gpu=cpu", "launcher=inline")  # Run: the sweep, its unfinished cells, its report
    g = kbsweep.grade("demo/scale_shift", "problems/demo/scale_shift/solutions/triton.py", "gpu=cpu")  # Grade: outcome, score, the grader's whole result
    b = kbsweep.report()                                              # Report: boards and the files written

Arguments are the CLI's overrides; a comma list sweeps (no ``-m`` needed); ``config_dir`` is the CLI's ``-cd``.
Errors are the CLI's: :class:`~kbsweep.KbsweepError` (a config or input error, one line) and
:class:`~kbsweep.InfraError`. Output goes where the CLI sends it (progress and the board to the terminal).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig

from kbsweep.errors import ExitCode
from kbsweep.paths import REPO_ROOT
from kbsweep.planner.planning import Plan, PlannedCell, plan_sweep, planned


@dataclass
class Report:
    boards: List[Dict[str, Any]]
    files: Dict[str, str]


@dataclass
class Run:
    """A finished invocation: ``unfinished`` holds the keys of cells left without a finished record (infra faults),
    ``not_started`` those the sweep's budget did not start (``sweep.max_usd``/``max_tokens``: no fault; a rerun with
    a raised budget runs them)."""

    sweep: str
    cells: List[PlannedCell]
    unfinished: List[str]
    report: Report
    not_started: List[str] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.INFRA if self.unfinished else ExitCode.OK


@dataclass
class Grade:
    """``score_note``: why a pass has no score (the result's ``score_note``), else None; ``verdict``: the audit's verdict a
    cell would get (the result's ``audit``: static and dynamic layers), None where no audit ran (``audit=False``)."""

    outcome: str
    score: Optional[float]
    exit_code: ExitCode
    result: Dict[str, Any]
    score_note: Optional[str] = None
    verdict: Optional[str] = None


def compose(overrides: Sequence[str], verb: str, config_dir: Optional[str] = None) -> Sequence[DictConfig]:
    """Every config of the sweep the overrides describe, checked and prepared as the CLI's are."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from kbsweep.compose import prepare
    from kbsweep.config.jobs import prepared_configs
    from kbsweep.config.overrides import check_overrides, hydra_error

    argv = check_overrides([*overrides, *(["-cd", str(config_dir)] if config_dir else [])])
    argv = [a for a in argv if a not in ("-cd", str(config_dir))]
    axes = [
        [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [line]
        for line, o in zip(argv, OverridesParser.create().parse_overrides(argv))  # an override per line, in order
    ]
    extra = [f"verb={verb}"] + ([f"hydra.searchpath=[file://{Path(config_dir).resolve()}]"] if config_dir else [])
    GlobalHydra.instance().clear()

    def composed(job: List[str]) -> DictConfig:
        try:
            return hydra_compose(config_name="config", overrides=job, return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as exc:
            raise hydra_error(exc) from None

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "conf")):
        return prepared_configs([[*combo, *extra] for combo in itertools.product(*axes)], composed, prepare)


def plan(*overrides: str, config_dir: Optional[str] = None) -> Plan:
    return plan_sweep(compose(overrides, "plan", config_dir))


def report(*overrides: str, config_dir: Optional[str] = None) -> Report:
    from kbsweep.cli import write_boards

    boards, files = write_boards(compose(overrides, "report", config_dir)[0])
    return Report(boards, {k: str(v) for k, v in files.items()})


def run(*overrides: str, config_dir: Optional[str] = None) -> Run:
    """Run (resume) the sweep, preflight first, then write its report."""
    from kbsweep.cli import sweep_cells, write_boards

    cfgs = compose(overrides, "run", config_dir)
    cells, left, held = sweep_cells(cfgs)
    boards, files = write_boards(cfgs[0])
    return Run(
        cells[0].sweep if cells else "",
        [planned(c) for c in cells],
        [c.key for c in left],
        Report(boards, {k: str(v) for k, v in files.items()}),
        [c.key for c in held],
    )


def grade(problem: str, solution: str, *overrides: str, config_dir: Optional[str] = None, audit: bool = True) -> Grade:
    """Grade one file (``problem``: ``<track>/<name>``) and audit it as a cell's solution is (``audit=False``: not)."""
    from kbsweep.cli import grade_file

    result, code = grade_file(
        compose([f"problem={problem}", f"solution={solution}", *overrides], "grade", config_dir)[0], audit
    )
    return Grade(
        result["outcome"],
        result.get("score"),
        code,
        result,
        result.get("score_note"),
        (result.get("audit") or {}).get("verdict"),
    )
