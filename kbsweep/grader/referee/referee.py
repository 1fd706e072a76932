"""The trusted side of a grade: a process that never imports candidate code.

Run by :func:`kbsweep.grader.processes.supervise` as
``python -m kbsweep.grader.referee.referee <result fd> <runner fd>``. It holds the grade request (the secret seed
included), loads the reference, times the baselines, makes every input, keeps the reference's weights and outputs to
itself, compares, owns the clock that corroborates time, and writes the one result message. Its stages
(:mod:`kbsweep.grader.referee.correctness`, :mod:`kbsweep.grader.referee.timing_stage`,
:mod:`kbsweep.grader.referee.probes`) work over one candidate context (:mod:`kbsweep.grader.referee.candidate`). The
candidate runs in another process (:mod:`kbsweep.grader.runner.runner`) that gets inputs and its own copies of the
weights through shared memory (:mod:`kbsweep.grader.shared.arena`) and writes its outputs there; commands and replies
cross a JSON channel (:mod:`kbsweep.grader.shared.channel`). What the runner reports (times, structure, evidence) is
untrusted: times are checked against this process's clock, outputs of calls picked after each timed batch are checked
against the reference, evidence is sanitized and kept as evidence.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List

import torch

from kbsweep.grader.referee import kernelbench_eval
from kbsweep.grader.referee.probes import ProbeStage
from kbsweep.grader.referee.request import RefereeRequest
from kbsweep.grader.referee.runner_cpu import RunnerCPU
from kbsweep.grader.referee.timing_stage import TimingStage
from kbsweep.grader.shared import timing
from kbsweep.grader.shared.channel import Channel, ChannelError
from kbsweep.grader.shared.failures import GradeFailure, one_line
from kbsweep.grader.shared.modules import load_module
from kbsweep.outcomes import Outcome


class Referee(ProbeStage, TimingStage):
    """Correctness over shapes x seeds x stress cases, then timing of baselines (here) and candidate (there), then
    the audit's probes, each stage over the one candidate context."""

    def run(self) -> Dict[str, Any]:
        t0, started_at = time.perf_counter(), time.time()  # the grade's start-up ends here: both processes are up
        deck = Path(self.req.reference).parent
        hashes = self.deck_hashes(deck)
        self.ref = load_module("kbsweep_reference", Path(self.req.reference))
        timed = self.req.mode in ("bench", "full", "profile")
        baselines: List[Dict[str, Any]] = []
        if (
            self.device.type == "cuda"
        ):  # a persisting-L2 carve-out an earlier process left on the GPU is not this candidate's
            self.evidence["persisting_l2_inherited"] = timing.persisting_l2_limit()
            timing.reset_persisting_l2()
        if timed and self.req.baselines:
            self.stage = "baselines"  # before the candidate is imported: it cannot touch what its speedups divide by
            deadline = time.perf_counter() + self.req.baseline_budget_s  # one budget for all shapes
            with torch.no_grad():
                baselines = [self.time_baselines(shape, deadline) for shape in self.req.shapes]
        self.stage, self.tag = "import_candidate", "/import"
        self.trusted_round_trip()  # the runner holds harness code only until the import
        self.ask("import")
        with torch.no_grad():
            if self.kernelbench:  # KernelBench's verdict first, whatever kbsweep's own checks then find
                self.stage = "kernelbench_correctness"
                self.kernelbench_verdict = kernelbench_eval.run(self, self.kernelbench)
            self.stage, self.tag = "correctness", "/correctness"
            try:
                correctness = self.correctness()
            except GradeFailure as failure:
                verdict = self.kernelbench_verdict
                if timed and failure.outcome == Outcome.INCORRECT and verdict and verdict.get("correctness"):
                    verdict["candidate_timing"] = self.kernelbench_timing(baselines)
                raise
            timings: List[Dict[str, Any]] = []
            if timed:
                self.stage = "timing"
                for index, shape in enumerate(self.req.shapes):
                    self.tag = f"/timing/{index}"
                    timings.append(self.time_shape(shape))
                for entry, base in zip(timings, baselines or [{}] * len(timings)):
                    entry["baselines"] = base
            self.stage, self.tag = "audit", "/audit"
            self.audit_probes()
        self.collect_evidence(timings, complete=True)
        self.evidence["files_modified"] = sorted(p for p, h in self.deck_hashes(deck).items() if hashes.get(p) != h)
        return {
            "correctness": correctness,
            "timings": timings,
            "evidence": self.evidence,
            "findings": self.findings,
            "kernelbench": self.kernelbench_verdict,
            "worker_s": time.perf_counter() - t0,
            "started_at": started_at,
            **({"profile": self.profile} if self.req.mode == "profile" else {}),
        }


def referee_message(
    request: RefereeRequest, runner: Channel, make: Callable[[RefereeRequest, Channel], Referee]
) -> Dict[str, Any]:
    """The grade of ``make(request, runner)``, as the one message the referee writes: its result, or its outcome
    with the stage, findings and the runner's evidence; the runner is told to exit either way."""
    referee = None
    try:
        try:
            runner.send({"request": request.for_runner()})
            runner.receive()
        except ChannelError as exc:  # nothing of the candidate has run yet
            raise GradeFailure(
                Outcome.HARNESS_ERROR, f"the candidate's process died before it took the request ({exc})"
            ) from None
        referee = make(request, runner)
        message: Dict[str, Any] = {"ok": True, "result": referee.run()}
    except GradeFailure as exc:
        message = {"ok": False, "outcome": exc.outcome, "message": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - this process runs no candidate code: anything else is the harness's
        stage = referee.stage if referee else "load_reference"
        message = {"ok": False, "outcome": Outcome.HARNESS_ERROR, "message": f"referee, {stage}: {one_line(exc)}"}
        traceback.print_exc()
    if not message["ok"]:
        message["at"] = time.time()  # when it failed: of several ranks' failures, the earliest is the cause
    if referee is not None and not message["ok"]:
        runner.sock.settimeout(30)  # a runner rank stuck in a collective with a failed peer never answers
        try:  # a failed grade keeps the runner's evidence too, when the runner is still there to give it
            referee.collect_evidence()
        except (GradeFailure, ChannelError):
            pass
        message.update(
            stage=referee.stage,
            findings=referee.findings,
            evidence=referee.evidence,
            kernelbench=referee.kernelbench_verdict,
        )
        if referee.kernelbench and referee.kernelbench_verdict is None and referee.stage == "import_candidate":
            message["kernelbench"] = kernelbench_eval.not_compiled(referee.kernelbench, message["message"])
    try:
        runner.send({"op": "exit"})
    except ChannelError:
        pass
    return message


def main() -> None:
    """``referee <result fd> <runner channel fd> [<host /proc fd> <runner tree's host pid>]``."""
    channel = os.fdopen(int(sys.argv[1]), "w")
    request = RefereeRequest(**json.loads(sys.stdin.read()))
    watch = RunnerCPU(int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else None

    def make(req: RefereeRequest, runner: Channel) -> Referee:
        referee = Referee(req, runner)
        referee.runner_cpu = watch
        return referee

    message = referee_message(request, Channel.from_fd(int(sys.argv[2])), make)
    channel.write(json.dumps(message, default=str) + "\n")
    channel.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
