"""What a grade is asked: :class:`GradeRequest`, the one argument of :func:`kbsweep.grader.grade` (built from a
resolved config by :meth:`GradeRequest.from_config`, for a sweep's cells, ``kbsweep grade`` and ``kbsweep regrade``
alike). What the grade hands its trusted referee is :class:`kbsweep.grader.referee.request.RefereeRequest`.

It imports no torch (the orchestrator need not pay for it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from kbsweep.config.gpus import GpuSpec

if TYPE_CHECKING:
    from kbsweep.config.problems import Problem
    from kbsweep.grader.baselines import BaselineCache
    from kbsweep.sandbox.confine import SandboxPolicy


MODES = ("check", "bench", "full", "profile")


@dataclass
class GradeRequest:
    """One grade: ``solution`` on ``problem`` on ``gpu`` (its ``name``, ``device`` and ``shape_set`` matter here).

    ``mode``: check (correctness only), bench or full (correctness + timing), profile (correctness and timing of the
    first shape, with the candidate's profile: never scored; :mod:`kbsweep.grader.profile_summary`). ``baselines``: timed when the mode
    times, served from ``baseline_cache`` where it holds them. ``world_size`` > 1 (or a problem with a
    ``collective``) grades at that many ranks. ``hide_env``: names never passed to the grading processes.
    ``sandbox``: their confinement (default: :class:`~kbsweep.sandbox.confine.SandboxPolicy`'s defaults). ``timers``:
    timers of :data:`kbsweep.config.schema.BASELINE_TIMERS` that time the baselines too, beside kbsweep's scored figure
    (default: ``kernelbench`` for a KernelBench problem on a GPU). ``zygote_home``: the folder the runner's
    zygote keeps its home under (default: ``log_dir``'s parent); grades that share it share the zygote.
    ``own_kernels``: the track scores the candidate's own kernels, so counted calls that launch none of them are a
    ``no_kernel`` finding and the grade has no score (default: every track but KernelBench's format).
    ``held_out_shapes``: graded after the public shapes and tagged ``held_out``; :meth:`of` sets them for full grades
    only, so no check or benchmark (what the agent sees) grades them."""

    problem: "Problem"
    solution: Path
    gpu: GpuSpec
    roofline: Dict[str, Any]
    mode: str = "full"
    baselines: List[str] = field(default_factory=list)
    timeout_s: float = 1800.0
    memory_mib: float = 0.0
    log_dir: Optional[Path] = None
    timing: Dict[str, Any] = field(default_factory=dict)
    compile_mode: Optional[str] = None
    deck_version: Optional[str] = None
    baseline_cache: Optional["BaselineCache"] = None
    world_size: int = 1
    hide_env: Sequence[str] = ()
    sandbox: Optional["SandboxPolicy"] = None
    timers: Optional[Sequence[str]] = None
    zygote_home: Optional[Path] = None
    own_kernels: Optional[bool] = None
    held_out_shapes: List[Dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_config(
        cls,
        problem: "Problem",
        roofline: Dict[str, Any],
        gpu: GpuSpec,
        track: Dict[str, Any],
        grade: Dict[str, Any],
        paths: Dict[str, Any],
        deck_version: Optional[str] = None,
        hide_env: Sequence[str] = (),
    ) -> "GradeRequest":
        """The grade a resolved config's sections ask for on ``problem``: its GPU, track limits (time, world size,
        sandbox), timing, baselines and their cache under ``paths.outputs``; :meth:`of` names the solution."""
        from kbsweep.grader.baselines import BaselineCache
        from kbsweep.sandbox.confine import SandboxPolicy
        from kbsweep.sandbox.watch import memory_cap_mib

        return cls(
            problem,
            Path(),
            gpu,
            roofline,
            baselines=list(gpu.baselines or grade["baselines"]),
            timeout_s=track["grade_timeout_s"],
            memory_mib=memory_cap_mib(grade["memory_mib"]),  # the grading host's, where the grade runs
            timing=grade["timing"],
            compile_mode=grade["compile_mode"],
            deck_version=deck_version,
            baseline_cache=BaselineCache(  # shared by every grade under the same outputs folder; seeds shipped beside the problems
                Path(paths["outputs"]) / "baselines" / f"{gpu.name}.json",
                seed_files=[Path(root).parent / "baselines" / f"{gpu.name}.json" for root in paths["problems"]],
                gpu=gpu.name,
                fresh=bool(grade.get("fresh_baselines")),
            ),
            world_size=int(track.get("world_size", 1)),
            hide_env=tuple(hide_env),
            sandbox=SandboxPolicy.of(track),
            timers=grade.get("timers"),
            # a worker's next cells grade with the same runner zygote; absolute: the zygotes fork elsewhere
            zygote_home=(Path(paths["outputs"]) / "zygotes").resolve(),
            own_kernels=bool(track.get("own_kernels", True)),
        )

    def of(self, mode: str, solution: Path, log_dir: Path) -> "GradeRequest":
        """This grade of ``solution`` in ``mode``, logged under ``log_dir``: the baselines are timed, and the problem's
        held-out shapes graded, by full grades only."""
        full = mode == "full"
        return replace(
            self,
            mode=mode,
            solution=Path(solution),
            log_dir=log_dir,
            baselines=self.baselines if full else [],
            held_out_shapes=self.problem.held_out_shapes(self.gpu.shape_set) if full else [],
        )
