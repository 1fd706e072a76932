"""KernelBench's own correctness verdict, as its ``eval_kernel_against_ref`` decides it, pinned per version.

kbsweep grades a KernelBench problem twice over the same candidate process: this module's pass reproduces
KernelBench's eval (both models built in training mode from the same seed, no weight copying; ``trials`` input
sets whose seeds KernelBench derives from its seed; inputs cast to the eval precision; one ``torch.allclose`` per
trial at the precision's tolerance; the candidate's output may alias its input), and kbsweep's own checks (secret
seed, poison, pointer-cache probe, aliasing, timed-call checks) run after it as the separate ``kbsweep`` verdict.
Neither changes the other. The facts below were measured against ScalingIntelligence/KernelBench
``src/kernelbench/eval.py`` (docs/kernelbench.md cites the commits).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from kbsweep.config.kernelbench import PRECISIONS, Semantics
from kbsweep.grader.shared.arena import encode
from kbsweep.grader.shared.failures import GradeFailure

if TYPE_CHECKING:
    import torch

    from kbsweep.grader.referee.candidate import CandidateContext


def trial_seeds(seed: int, trials: int) -> List[int]:
    """KernelBench's per-trial seeds: drawn one by one from torch's generator seeded with ``seed``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return [int(torch.randint(0, 2**32 - 1, (1,), generator=generator).item()) for _ in range(trials)]


def cast(values: List[Any], sem: Semantics) -> List[Any]:
    """Inputs as KernelBench hands them over: every tensor cast to the eval precision (integers included)."""
    if not sem.cast_inputs:
        return values
    import torch

    dtype = getattr(torch, PRECISIONS[sem.precision])
    return [v.to(dtype) if isinstance(v, torch.Tensor) else v for v in values]


@dataclass
class Verdict:
    """KernelBench's result fields for one candidate, plus what kbsweep saw of the failing trial."""

    semantics: Dict[str, Any]
    compiled: bool = True
    correctness: bool = False
    trials: str = ""  # "(passed / trials)", as KernelBench's metadata writes it
    max_difference: List[float] = field(default_factory=list)  # per failing trial
    issue: Optional[str] = None  # output mismatch, shape mismatch, or the runtime error's message

    def record(self) -> Dict[str, Any]:
        return asdict(self)


def not_compiled(sem: Semantics, message: str) -> Dict[str, Any]:
    return Verdict(sem.record(), compiled=False, issue=message[:500]).record()


def call(referee: "CandidateContext", model: int, inputs: List[Any], expected: torch.Tensor) -> torch.Tensor:
    """One call of the candidate, no poison, its output one tensor that may alias an input (as KernelBench takes it)."""
    slots = referee.output_slots(expected)
    referee.ask("call", model=model, inputs=encode(inputs, referee.arena), outputs=slots, kernelbench=True)
    referee.count_work(referee.shape, 1)
    return referee.read(slots, expected)


def run(referee: "CandidateContext", sem: Semantics) -> Dict[str, Any]:
    """KernelBench's correctness pass over the referee's candidate process (first shape: a KernelBench file has
    one). A trial that runs but mismatches is counted and the next runs; an exception ends the pass, as in
    KernelBench's ``run_and_check_correctness``."""
    import torch

    shape = referee.req.shapes[0]
    referee.shape, referee.tag = shape, "/kernelbench"
    referee.open_arena(referee.arena_size(shape))
    verdict = Verdict(sem.record())
    passed = 0
    try:
        ref_model = referee.build(shape, sem.seed)  # seeded after its init inputs, as KernelBench does
        model = referee.send_model(ref_model, shape, sem.seed)
        for seed in trial_seeds(sem.seed, sem.trials):
            mark = referee.arena.used
            torch.manual_seed(seed)
            inputs = cast(list(referee.ref.get_inputs(dict(shape), referee.device)), sem)
            expected = ref_model(*inputs)  # on the very tensors the candidate then gets, as KernelBench does
            if not isinstance(expected, torch.Tensor):  # KernelBench reads output.shape: a tuple fails every candidate
                raise RuntimeError(f"the reference returned {type(expected).__name__}, not a tensor")
            out = call(referee, model, inputs, expected)
            if out.shape != expected.shape:
                verdict.issue = f"Output shape mismatch: Expected {tuple(expected.shape)}, got {tuple(out.shape)}"
                break
            if torch.allclose(expected, out, atol=sem.atol, rtol=sem.atol):
                passed += 1
            else:
                verdict.max_difference.append(float((expected - out).abs().max()))
                verdict.issue = "Output mismatch"
            referee.arena.used = mark
    except GradeFailure as exc:
        verdict.issue = str(exc)[:500]
    except RuntimeError as exc:  # allclose across dtypes raises, as it does in KernelBench's eval
        verdict.issue = str(exc).splitlines()[0][:500]
    verdict.trials = f"({passed} / {sem.trials})"
    verdict.correctness = passed == sem.trials
    return verdict.record()
