"""A sweep's plan: its cells, harnesses, cost estimate and missing keys, before anything runs (``kbsweep plan``,
:func:`kbsweep.plan`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List


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


def planned(cell: Any) -> PlannedCell:
    return PlannedCell(cell.key, cell.label, cell.model["name"], cell.harness["name"], cell.problem, cell.gpu.name, cell.repeat)


def plan_of(cells: List[Any]) -> Plan:
    """The :class:`Plan` of built cells (``kbsweep plan`` prints it)."""
    from kbsweep.harness import runner_for
    from kbsweep.planner.matrix import estimate
    from kbsweep.planner.preflight import missing_keys

    est = estimate(cells)
    harnesses = {cell.harness["name"]: cell.harness for cell in cells}
    return Plan(
        cells=[planned(c) for c in cells], model_usd=est["model_usd"], unpriced_models=est["unpriced_models"], gpu_hours_cap=est["gpu_hours_cap"],
        rent_usd_cap=est["rent_usd_cap"], expected_tokens=est["expected_tokens"], harnesses=[runner_for(h).describe() for h in harnesses.values()],
        missing_keys=[check.line() for check in missing_keys(cells)],
    )
