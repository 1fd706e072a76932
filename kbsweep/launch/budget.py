"""The orchestrator's account of a sweep's budget (:class:`kbsweep.planner.budget.SweepBudget`): what the sweep
has spent, what its running cells reserve, and whether the next cell may start.

A cell starts only while ``spent + the running cells' caps + its own cap`` stays within every limit; when it does
not, the launcher waits for running cells (they spend less than their caps, as a rule) and asks again, and once
nothing runs and the next cell still does not fit, the sweep starts no more cells. ``spent`` is what the sweep's
finished cells recorded (their ``result.json``, earlier runs of the sweep included) plus, in this run, every attempt
that ended: an attempt that ended without a record (a killed or lost job) counts at its caps, its spend unknown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

from kbsweep.outcomes import Outcome
from kbsweep.planner.budget import SweepBudget, amount
from kbsweep.planner.matrix import Cell


class Budget:
    """What a launcher asks before it starts a cell and tells when one ends; this base is no budget at all (every
    cell may start), :class:`Ledger` keeps a real one."""

    held: List[Cell] = []

    def count(self, folder: Path, redone: Set[str]) -> None:
        """Count what the finished cells whose journals are in ``folder`` spent, but those of the cells about to be
        redone (``redone``: their keys)."""

    def fits(self, cell: Cell) -> bool:
        """Whether ``cell`` may start now (reserving nothing)."""
        return True

    def admit(self, cell: Cell) -> bool:
        """Reserve ``cell``'s caps and say True if it may start now, else False."""
        return True

    def ended(self, cell: Cell, result: Dict[str, Any]) -> None:
        """An attempt of ``cell`` ended with ``result``: its reservation is freed, its spend counted."""

    def hold(self, cells: List[Cell]) -> Optional[str]:
        """Of ``cells``, keep those never admitted as :attr:`held`; the line that says so, or None."""
        return None

    def status(self) -> str:
        """Spent and reserved of each limit, for the sweep's progress line."""
        return ""


def spend_of(result: Dict[str, Any]) -> Dict[str, float]:
    """The dollars and tokens a result recorded: the agent's and the judge's."""
    tokens = sum(
        int((result.get(key) or {}).get(kind, 0))
        for key in ("usage", "judge_usage")
        for kind in ("input_tokens", "output_tokens")
    )
    return {"usd": float(result.get("cost_usd") or 0.0), "tokens": float(tokens)}


class Ledger(Budget):
    """A sweep's budget as its cells start and end (from the launcher's thread)."""

    def __init__(self, budget: SweepBudget):
        self.budget = budget
        self.spent = {currency: 0.0 for currency in budget.limits}
        self.reserved: Dict[str, Dict[str, float]] = {}  # running cell's key -> its caps
        self.admitted: Set[str] = set()
        self.refused: Dict[str, float] = {}  # the caps of the last cell that did not fit
        self.held: List[Cell] = []

    def count(self, folder: Path, redone: Set[str]) -> None:
        for path in sorted(folder.glob("*/result.json")):
            if path.parent.name in redone:
                continue
            result = json.loads(path.read_text())
            if not Outcome(result["outcome"]).is_infra:  # an infra cell is run again from an empty folder
                self.charge(spend_of(result))

    def charge(self, spend: Dict[str, float]) -> None:
        for currency in self.spent:
            self.spent[currency] += spend[currency]

    def in_flight(self, currency: str) -> float:
        return sum(
            caps[currency] for caps in list(self.reserved.values())
        )  # a copy: the progress bar reads it from its own thread

    def fits(self, cell: Cell) -> bool:
        caps = self.budget.caps(cell)
        if all(self.spent[c] + self.in_flight(c) + caps[c] <= limit for c, limit in self.budget.limits.items()):
            return True
        self.refused = caps
        return False

    def admit(self, cell: Cell) -> bool:
        if not self.fits(cell):
            return False
        self.reserved[cell.key] = self.budget.caps(cell)
        self.admitted.add(cell.key)
        return True

    def ended(self, cell: Cell, result: Dict[str, Any]) -> None:
        caps = self.reserved.pop(cell.key)
        self.charge(spend_of(result) if "started" in result else caps)  # a launcher's result for a job that left none

    def hold(self, cells: List[Cell]) -> Optional[str]:
        self.held = [cell for cell in cells if cell.key not in self.admitted]
        if not self.held:
            return None
        short = [
            c for c, cap in self.refused.items() if self.spent[c] + self.in_flight(c) + cap > self.budget.limits[c]
        ] or list(self.budget.limits)
        account = "; ".join(
            f"{self.account(c)}, the next cell's cap {amount(c, self.refused.get(c, 0.0))}" for c in short
        )
        return f"sweep budget: {account}; {len(self.held)} cells not started (raise {' and '.join(f'sweep.max_{c}' for c in short)} to continue)"

    def status(self) -> str:
        return "; sweep budget: " + ", ".join(self.account(c) for c in self.budget.limits)

    def account(self, currency: str) -> str:
        """Spent, in flight (only while running cells reserve some) and the limit of ``currency``."""
        flight = self.in_flight(currency)
        reserved = f" + {amount(currency, flight)} in flight" if flight else ""
        return f"{amount(currency, self.spent[currency])} spent{reserved} of {amount(currency, self.budget.limits[currency])}"
