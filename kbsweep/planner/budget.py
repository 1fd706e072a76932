"""A sweep's budget at plan time: ``sweep.max_usd`` and ``sweep.max_tokens``, each cell's caps (the per-cell
``track.max_usd`` / ``track.max_tokens`` it reserves while it runs), the worst case of a plan, and the refusal of a
budget some cell has no cap for. The orchestrator's account of it is :mod:`kbsweep.launch.budget`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from kbsweep.config.schema import CONFIG_YAML
from kbsweep.errors import KbsweepError

if TYPE_CHECKING:  # a type only: the matrix is this package's, built before the budget is read
    from kbsweep.planner.matrix import Cell

CURRENCIES = ("usd", "tokens")  # each: the sweep's sweep.max_<currency>, a cell's track.max_<currency>


def amount(currency: str, value: float) -> str:
    return f"${value:,.2f}" if currency == "usd" else f"{value:,.0f} tokens"


@dataclass(frozen=True)
class SweepBudget:
    """The sweep's limits, by currency (only those set)."""

    limits: Dict[str, float]

    def caps(self, cell: Cell) -> Dict[str, float]:
        """What ``cell`` may spend of each limited currency: its track's cap."""
        return {currency: float(cell.track[f"max_{currency}"]) for currency in self.limits}

    def worst_case(self, cells: Sequence[Cell]) -> Dict[str, float]:
        """Every cell at its caps."""
        return {currency: sum(self.caps(cell)[currency] for cell in cells) for currency in self.limits}

    def to_dict(self, cells: Sequence[Cell]) -> Dict[str, Any]:
        """What a plan shows: the limits, the worst case of ``cells``, and whether the budget may stop them (before
        what earlier runs of the sweep spent)."""
        worst = self.worst_case(cells)
        return {
            "limits": dict(self.limits),
            "worst_case": worst,
            "may_stop": any(worst[c] > self.limits[c] for c in self.limits),
        }


def plan_line(summary: Dict[str, Any]) -> str:
    """A plan's budget (:meth:`SweepBudget.to_dict`) as one line."""
    each = [
        f"{amount(c, limit)} (sweep.max_{c}), worst case {amount(c, summary['worst_case'][c])}"
        for c, limit in summary["limits"].items()
    ]
    verdict = "the budget may stop it (cells not started)" if summary["may_stop"] else "within the budget"
    return f"sweep budget: {'; '.join(each)} (every cell at its track caps): {verdict}"


def sweep_budget(cfgs: Sequence[DictConfig], cells: List[Cell]) -> Optional[SweepBudget]:
    """The budget the sweep's configs set, or None; a KbsweepError (one line) where its jobs set different budgets
    or a cell has no cap in a limited currency: the budget reserves each running cell's cap, so a cell without one
    could spend it all."""
    from kbsweep.config.jobs import as_jobs

    budgets = {tuple(OmegaConf.select(cfg, f"sweep.max_{c}") for c in CURRENCIES) for cfg, _ in as_jobs(cfgs).units}
    if len(budgets) > 1:
        raise KbsweepError(
            f"{CONFIG_YAML}: key 'sweep.max_usd': a sweep has one budget; its jobs set {sorted(budgets, key=str)} (usd, tokens)"
        )
    limits = {c: float(v) for c, v in zip(CURRENCIES, budgets.pop()) if v is not None}
    if not limits:
        return None
    for cell in cells:
        for currency, limit in limits.items():
            if cell.track.get(f"max_{currency}") is None:
                raise KbsweepError(
                    f"track/{cell.track['name']}.yaml: key 'max_{currency}': not set, and sweep.max_{currency}={limit:g} needs a cap per "
                    f"cell (e.g. {cell.label}; or track.max_{currency}=... on the command line)"
                )
    return SweepBudget(limits)
