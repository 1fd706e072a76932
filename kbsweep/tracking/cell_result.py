"""What a cell leaves: :class:`CellResult`, its ``result.json`` journal (the record sweeps resume from and tracking
logs), stored as it has always been written by :meth:`CellResult.to_json` and read back, journals of earlier
versions included, by :meth:`CellResult.from_json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from kbsweep.outcomes import Outcome
from kbsweep.score.roofline import ShapeScore
from kbsweep.score.stored import from_stored, to_stored

# The keys of a journal by when they are written: every result's; a cell whose agent ran (its final grade's
# scores, the audit's verdict, the agent's turns, spend and times); a KernelBench problem's two verdicts; the
# stamps run_cell adds (a launcher's infrastructure result has no start nor folder).
EVERY = ("outcome", "message")
WORKED = (
    "score",
    "basis",
    "speedup",
    "shapes",
    "verdict",
    "stop_reason",
    "turns",
    "usage",
    "cost_usd",
    "agent_cost_usd",
    "judge_cost_usd",
    "judge_usage",
    "agent_s",
    "grade_s",
    "steps",
    "env",
)
VERDICTS = ("verdicts", "kernelbench")
STAMPS = ("key", "cell", "started", "finished", "folder")
HELD_OUT = ("score_public", "score_held_out")  # a final grade that graded held-out shapes: each part's score


@dataclass
class CellResult:
    """One cell's end: its outcome (``message`` says why where it is not a pass); where the agent ran, the final
    grade's score, basis, speedups and per-shape scores, the audit's verdict, the agent's stop reason, turns, steps,
    tokens, dollars and times; then the cell's stamps. ``stop_reason`` is set exactly when the agent ran."""

    outcome: Outcome
    message: Optional[str] = None
    score: Optional[float] = None
    basis: Optional[str] = None
    speedup: Dict[str, Any] = field(default_factory=dict)
    shapes: List[ShapeScore] = field(default_factory=list)
    verdict: Optional[str] = None
    stop_reason: Optional[str] = None
    turns: Optional[int] = None
    usage: Optional[Dict[str, int]] = None
    cost_usd: Optional[float] = None
    agent_cost_usd: Optional[float] = None
    judge_cost_usd: Optional[float] = None
    judge_usage: Optional[Dict[str, int]] = None
    agent_s: Optional[float] = None
    grade_s: Optional[float] = None
    steps: Optional[List[Dict[str, Any]]] = None
    env: Optional[Dict[str, Any]] = None
    verdicts: Optional[Dict[str, str]] = None  # a KernelBench problem: its own eval's verdict beside kbsweep's
    kernelbench: Optional[Dict[str, Any]] = None
    score_public: Optional[float] = None  # the score over the public shapes alone, where held-out ones were graded
    score_held_out: Optional[float] = None
    key: Optional[str] = None
    cell: Optional[str] = None  # the cell's label
    started: Optional[float] = None
    finished: Optional[float] = None
    folder: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)  # keys of a stored journal this version does not write

    def to_json(self) -> Dict[str, Any]:
        """The stored form, key for key as cells have always written it (the outcome as its string)."""
        keys = (
            EVERY + (WORKED if self.stop_reason is not None else ()) + (VERDICTS if self.verdicts is not None else ())
        )
        keys += tuple(key for key in HELD_OUT if getattr(self, key) is not None)
        return to_stored(self, keys + tuple(key for key in STAMPS if getattr(self, key) is not None))

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "CellResult":
        """A stored journal; keys it lacks take their defaults."""
        return from_stored(cls, data)
