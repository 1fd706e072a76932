"""What the grade hands its trusted referee: :class:`RefereeRequest` (secret seed included; the candidate's runner
gets :meth:`RefereeRequest.for_runner` of it, nothing more).

The candidate's runner never imports this module (not even the field names reach it: tests/test_trust.py,
tests/test_layout.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional


@dataclass
class RefereeRequest:
    """What the referee gets (as JSON on its stdin, or a file only the referee ranks see): the problem's spec and
    reference, the staged solution and its folder, the shapes, what to time and how, and the secret seed."""

    spec: Dict[str, Any]
    reference: str
    solution: str
    workdir: str
    device: str  # "cuda:0" or "cpu" (a rank: its own device)
    shapes: List[Dict[str, Any]]
    mode: str
    baselines: List[str]  # the ones to time now (the cache holds the others)
    compile_mode: Optional[str]
    l2_bytes: int
    timing: Dict[str, Any]  # kbsweep.grader.shared.timing.TimingConfig's fields
    baseline_budget_s: float
    secret_seed: Optional[int]  # never sent to the runner; the referee keeps it out of its request once read
    world_size: int
    timers: List[str]
    own_kernels: bool = (
        True  # calls that launch no kernel of the candidate's own are a finding (GradeRequest.own_kernels)
    )

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)

    def for_runner(self) -> Dict[str, Any]:
        """The runner's whole share of the request: where it runs, its folder, and the L2 size it flushes."""
        return {"device": self.device, "workdir": self.workdir, "l2_bytes": self.l2_bytes}
