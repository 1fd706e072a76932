"""The one outcome enum every stage uses, and what each outcome means for scoring and resume."""

from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    """How a cell (or a grade) ended."""

    # graded outcomes: the model's own result
    PASS = "pass"
    INCORRECT = "incorrect"
    NO_SOLUTION = "no_solution"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    GRADE_TIMEOUT = "grade_timeout"
    GRADE_OOM = "grade_oom"
    BUDGET_EXHAUSTED = "budget_exhausted"
    # infra outcomes: never a score, retried by a later run of the same sweep
    RATE_LIMITED = "rate_limited"
    CREDITS_EXHAUSTED = "credits_exhausted"
    MODEL_NOT_FOUND = "model_not_found"
    AUTHENTICATION = "authentication"
    PROVIDER_ERROR = "provider_error"
    NODE_FAILURE = "node_failure"
    HARNESS_ERROR = "harness_error"
    GPU_MISMATCH = "gpu_mismatch"  # the GPU where the cell grades is not the card its gpu= names (gpus.gpu_mismatch)
    # audit outcomes
    DISQUALIFIED = "disqualified"
    NEEDS_HUMAN = "needs_human"

    @property
    def is_infra(self) -> bool:
        return self in INFRA_OUTCOMES

    @property
    def is_graded(self) -> bool:
        """True when the outcome is the model's own doing (it counts on the board, maybe as 0)."""
        return not self.is_infra


INFRA_OUTCOMES = frozenset(
    {
        Outcome.RATE_LIMITED,
        Outcome.CREDITS_EXHAUSTED,
        Outcome.MODEL_NOT_FOUND,
        Outcome.AUTHENTICATION,
        Outcome.PROVIDER_ERROR,
        Outcome.NODE_FAILURE,
        Outcome.HARNESS_ERROR,
        Outcome.GPU_MISMATCH,
    }
)


class StopReason(str, Enum):
    """Why the agent loop ended."""

    SUBMITTED = "submitted"
    MODEL_STOPPED = "model_stopped"
    MAX_TURNS = "max_turns"
    WALL_CLOCK = "wall_clock"
    TOKEN_BUDGET = "token_budget"
    DOLLAR_BUDGET = "dollar_budget"
    PROVIDER_FAULT = "provider_fault"


class Verdict(str, Enum):
    """The audit's verdict on a cell."""

    CLEAN = "clean"
    RUBRIC_LEAK = "rubric_leak"
    REWARD_HACK = "reward_hack"
    CONTAMINATED = "contaminated"
    NEEDS_HUMAN = "needs_human"
