"""A sweep's plan: its cells, harnesses, cost estimate, budget and missing keys, before anything runs (``kbsweep plan``,
:func:`kbsweep.plan`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

if TYPE_CHECKING:
    from kbsweep.planner.budget import SweepBudget


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
    """What a sweep would run and cost; ``expected_tokens`` is the per-cell assumption behind ``model_usd`` (which
    holds the judge's calls too: ``judge``, :func:`kbsweep.planner.judging.estimate`);
    ``budget``: the sweep's limits, the worst case of its cells (every one at its caps) and whether the budget may
    stop the sweep (:meth:`kbsweep.planner.budget.SweepBudget.to_dict`), or None."""

    cells: List[PlannedCell]
    model_usd: float
    unpriced_models: List[str]
    gpu_hours_cap: float
    rent_usd_cap: float
    expected_tokens: Dict[str, Dict[str, int]]
    harnesses: List[str]
    missing_keys: List[str] = field(default_factory=list)
    budget: Optional[Dict[str, Any]] = None
    judge: Optional[Dict[str, Any]] = None  # the LLM judge's models, cells, dollars and tokens (in model_usd), or None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def planned(cell: Any) -> PlannedCell:
    return PlannedCell(
        cell.key, cell.label, cell.model["name"], cell.harness["name"], cell.problem, cell.gpu.name, cell.repeat
    )


def plan_sweep(cfgs: Sequence[Any]) -> Plan:
    """The :class:`Plan` of a sweep's configs (``kbsweep plan`` prints it); a budget some cell has no cap for is refused."""
    from kbsweep.planner.budget import sweep_budget
    from kbsweep.planner.matrix import build_matrix

    cells = build_matrix(cfgs)
    return plan_of(cells, sweep_budget(cfgs, cells))


def plan_of(cells: List[Any], budget: Optional[SweepBudget] = None) -> Plan:
    """The :class:`Plan` of built cells under the sweep's ``budget``, if any."""
    from kbsweep.harness import runner_for
    from kbsweep.planner.matrix import estimate
    from kbsweep.planner.preflight import missing_keys

    est = estimate(cells)
    harnesses = {cell.harness["name"]: cell.harness for cell in cells}
    return Plan(
        cells=[planned(c) for c in cells],
        model_usd=est["model_usd"],
        unpriced_models=est["unpriced_models"],
        gpu_hours_cap=est["gpu_hours_cap"],
        rent_usd_cap=est["rent_usd_cap"],
        expected_tokens=est["expected_tokens"],
        harnesses=[runner_for(h).describe() for h in harnesses.values()],
        missing_keys=[check.line() for check in missing_keys(cells)],
        budget=budget.to_dict(cells) if budget else None,
        judge=est["judge"],
    )
