"""What a grade returns: :class:`GradeResult`, stored as today's JSON (``grade.json``, a cell's journal, the API's
``Grade.result``) by :meth:`GradeResult.to_json` and read back, stored results of earlier versions included, by
:meth:`GradeResult.from_json`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from kbsweep.outcomes import Outcome
from kbsweep.score.roofline import ShapeScore
from kbsweep.score.stored import from_stored, to_stored

# The keys of a result by when they are written: every grade's, a passed grade's, a failed grade's, a timed pass's
# scores (absent when nothing was timed), a KernelBench problem's two verdicts, and a profile grade's summary.
COMMON = (
    "problem",
    "deck_version",
    "solution",
    "mode",
    "gpu",
    "device",
    "shape_set",
    "world_size",
    "grade_s",
    "timeout_s",
    "env",
    "outcome",
)
PASSED = ("startup_s", "correctness", "timings", "evidence", "findings", "score")
FAILED = ("message", "stage", "findings", "evidence", "score")
SCORED = ("basis", "shapes", "speedup")
HELD_OUT = ("score_public", "score_held_out")  # a grade that graded held-out shapes: the score of each part
VERDICTS = ("kernelbench", "verdicts")
PROFILED = ("profile",)  # a passed profile grade's summary for the agent
GPUMODE = ("gpumode",)  # a scored GPU MODE problem's leaderboard figure


@dataclass
class GradeResult:
    """One grade: where and how it ran, its outcome, and for a pass the correctness record, per-shape timings,
    scores and speedups; for a failure the message and the stage it failed in. Findings and evidence either way."""

    problem: str
    deck_version: str
    solution: str
    mode: str
    gpu: str
    device: str
    shape_set: str
    world_size: int
    grade_s: float
    timeout_s: float
    env: Dict[str, Any]
    outcome: Outcome
    message: Optional[str] = None
    stage: Optional[str] = None
    findings: List[Dict[str, Any]] = field(default_factory=list)
    evidence: Dict[str, Any] = field(default_factory=dict)
    score: Optional[float] = None
    startup_s: Optional[float] = None
    correctness: Optional[Dict[str, Any]] = None
    timings: List[Dict[str, Any]] = field(default_factory=list)
    basis: Optional[str] = None  # "roofline" or "speedup"; None: nothing was scored
    shapes: List[ShapeScore] = field(default_factory=list)
    speedup: Dict[str, Any] = field(default_factory=dict)
    kernelbench: Optional[Dict[str, Any]] = None  # KernelBench's own verdict, with ``verdicts`` beside kbsweep's
    gpumode: Optional[Dict[str, Any]] = None  # a GPU MODE problem's leaderboard figure (score.roofline.gpumode_ranking)
    verdicts: Optional[Dict[str, str]] = None
    profile: Optional[Dict[str, Any]] = (
        None  # mode profile: {"summary": text, "ncu": ...} (kbsweep.grader.profile_summary)
    )
    score_public: Optional[float] = None  # over the public shapes alone, where held-out shapes were graded too
    score_held_out: Optional[float] = None
    extra: Dict[str, Any] = field(default_factory=dict)  # keys of a stored result this version does not write

    @property
    def passed(self) -> bool:
        return self.outcome == Outcome.PASS

    def to_json(self) -> Dict[str, Any]:
        """The stored form, key for key as the grader has always written it (outcomes as their strings)."""
        keys = COMMON + (PASSED + (SCORED if self.basis is not None else ()) if self.passed else FAILED)
        keys += HELD_OUT if any(shape.held_out for shape in self.shapes) else ()
        return to_stored(
            self,
            keys
            + (VERDICTS if self.verdicts is not None else ())
            + (PROFILED if self.profile is not None else ())
            + (GPUMODE if self.gpumode is not None else ()),
        )

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "GradeResult":
        """A stored result; keys it lacks take their defaults (None where every grade writes one)."""
        return from_stored(cls, data, COMMON)
