"""The evidence the referee reads from the candidate's runner, and what it checks of it itself: call ranges read by
the ids of this grade's commands (a range's public name proves nothing), each call's work against the problem's
(glue and one-time preparation left out; every call read, not the median's), the bytes of ops the profiler saw with
dispatch disabled, ops the candidate registered in the aten namespace, a call's result made plain inside its range,
the candidate's own kernels on a kernel track, the runner never learning which stage a call serves nor finding any
call's memory filled, and the problem's own output check on every compared call."""

from __future__ import annotations

import contextlib
import re
import shutil
import textwrap
from collections import Counter
from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import pytest
import torch

from kbsweep.audit.cases import run_case, summary
from kbsweep.grader.referee import checks, witness
from kbsweep.grader.runner import op_bytes, runtime, seal
from kbsweep.grader.runner.runner import Runner
from kbsweep.grader.shared import profiling
from kbsweep.grader.shared.modules import load_module
from kbsweep.score.roofline import load_roofline
from tests.support.grading import CPU
from tests.test_exploits import QUICK_TIMING, REPO

A, B = "a" * profiling.TOKEN_CHARS, "b" * profiling.TOKEN_CHARS  # two commands' ids


def session(body) -> object:
    """A finished CPU profiler session over ``body()``."""
    with profiling.profiler_session(torch.device("cpu")) as prof:
        body()
    return prof


def test_ranges_are_read_by_command_id_and_a_forged_one_bounds_nothing():
    x = torch.randn(64, 64)
    rf = torch.profiler.record_function

    def calls():
        with rf(profiling.CALL_RANGE + A):
            with rf("kbsweep::kernel"):  # the name the harness once skipped: counted like any op now
                torch.mm(x, x)
            with rf(profiling.CALL_RANGE + A):  # inside a call: not a call of its own
                torch.exp(x)
        with rf(profiling.CALL_RANGE + B + profiling.CAPTURE_TAG):
            torch.sin(x)
        with rf(profiling.CALL_RANGE + "f" * profiling.TOKEN_CHARS):  # an id no command had
            torch.sort(x)

    found = profiling.session_evidence(session(calls), {A: "/correctness/0", B: "/timing/0"}, {"/correctness/0": 1})
    assert found["ranges"] == {"/correctness/0": 1, "/timing/0/capture": 1}
    assert found["forged_ranges"] == 2
    assert {"aten::mm", "aten::exp", "aten::sin"} <= set(found["ops"]) and "aten::sort" not in found["ops"]
    assert "kbsweep::kernel" not in found["ops"]  # a range of any name is not an op
    assert found["range_flops"]["/correctness/0"] == [2 * 64**3]


def test_work_leaves_out_each_instances_first_call_and_finds_idle_groups():
    prep, call = [1e6, 0, 1, 0, 0], [10.0, 0, 1, 0, 0]
    rows = [(0, prep)] + [(0, call)] * 3 + [(1, prep), (1, call)]
    work = witness.call_work({"/correctness/0": rows}, {}, lambda group: (100.0, 100.0))
    assert work["basis"] == "compared" and work["byte_share"] == pytest.approx(0.1) and not work["idle_groups"]
    timed = {"/timing/0": [(2, [0, 0, 0, 0, 0])] * 3, "/correctness/0": rows}
    work = witness.call_work(timed, {"/timing/0": [50, 50, 50]}, lambda group: (100.0, 100.0))
    assert work["basis"] == "timed" and work["flop_share"] == 0.5 and work["idle_groups"] == ["/timing/0"]


def test_the_work_of_every_call_counts_not_the_median_calls():
    """Library work on 7 of 16 calls (none of them launching a kernel of its own) leaves the median call clean; the
    evidence is the most any call did, and every call that launched nothing."""
    own, library = [0.0, 0, 1, 0, 0], [400.0, 0, 0, 0, 0]
    rows = [(0, library if turn in (3, 5, 7, 9, 11, 13, 15) else own) for turn in range(16)]
    work = witness.call_work({"/timing/0": rows}, {}, lambda group: (100.0, 100.0))
    assert work["byte_share"] == 4.0 and work["idle_groups"] == ["/timing/0"] and work["idle_calls"] == 7
    unseen = [(0, own)] * 16  # the recorder saw nothing; the profiler saw one call's ops read half the problem's bytes
    work = witness.call_work(
        {"/timing/0": unseen}, {}, lambda group: (100.0, 100.0), {"/timing/0": [0] * 9 + [50] + [0] * 6}
    )
    assert work["byte_share"] == 0.5 and not work["idle_groups"]


def test_the_profiler_counts_the_bytes_of_ops_that_compute_with_dispatch_disabled():
    """Per call range, the inputs of ops that compute, however torch was entered; glue (casts, pads, copies,
    concatenations, views) counts for nothing, a composite op once, and a glue-named op of the candidate's counts
    by the ops it runs."""
    x = torch.randn(64, 32)
    rf = torch.profiler.record_function
    lib = torch.library.Library("aten", "FRAGMENT")
    lib.define("clone.kbsweep_test_body(Tensor x) -> Tensor")
    lib.impl("clone.kbsweep_test_body", lambda t: t.exp(), "CompositeExplicitAutograd")

    def calls():
        with rf(profiling.CALL_RANGE + A), torch._C._DisableTorchDispatch():
            x.amax(dim=-1)
        with rf(profiling.CALL_RANGE + A):
            torch.cat(
                [torch.nn.functional.pad(x.t().contiguous(), (0, 3)), x.to(torch.float64).float().t()], dim=1
            ).clone()
        with rf(profiling.CALL_RANGE + B):
            torch.nn.functional.softmax(x, dim=-1)
        with rf(profiling.CALL_RANGE + B):
            torch.ops.aten.clone.kbsweep_test_body(x)

    found = op_bytes.range_bytes(session(calls), {A: "/timing/0", B: "/timing/1"})
    del lib
    assert found == {"/timing/0": [x.numel() * 4, 0], "/timing/1": [x.numel() * 4, x.numel() * 4]}


def test_an_op_the_candidate_registers_in_the_aten_namespace_is_its_own_never_torchs():
    """The recorder knows torch's aten ops from before the import: one registered later is recorded apart and its
    bytes are library work, even as an overload of a glue op; an opaque op of the candidate's own namespace is its
    work when it launched the candidate's kernels."""
    launches = Counter()
    recorder = seal.op_recorder(MappingProxyType(launches), frozenset(torch._C._dispatch_get_all_op_names()))
    fragment, own = torch.library.Library("aten", "FRAGMENT"), torch.library.Library("kbsweep_test_own", "DEF")
    fragment.define("clone.kbsweep_test_shift(Tensor x) -> Tensor")
    fragment.impl("clone.kbsweep_test_shift", lambda t: t + 1, "CompositeExplicitAutograd")
    own.define("launching(Tensor x) -> Tensor")
    own.define("silent(Tensor x) -> Tensor")

    def launching(t):
        launches["triton"] += 1  # stands for a launch the gate counted
        return torch.empty_like(t)

    own.impl("launching", launching, "CompositeExplicitAutograd")
    own.impl("silent", lambda t: t * 2, "CompositeExplicitAutograd")
    x = torch.randn(16, 8)
    with recorder:
        torch.ops.aten.clone.kbsweep_test_shift(x)
    assert recorder.ops == {"aten.fragment::clone.kbsweep_test_shift": 1} and recorder.bytes == 2 * x.numel() * 4
    with recorder:
        torch.ops.kbsweep_test_own.launching(x)
    assert recorder.own_ops == {"kbsweep_test_own::launching": 1} and recorder.bytes == 2 * x.numel() * 4
    with recorder:
        torch.ops.kbsweep_test_own.silent(x)
    assert recorder.ops["kbsweep_test_own::silent"] == 1 and recorder.bytes == 4 * x.numel() * 4
    del fragment, own


def test_a_calls_result_is_read_inside_its_range():
    """A list subclass whose ``__iter__`` computes: the runner reads it inside the call's recorded range, so its ops
    are the call's, and what the harness copies out is a plain tuple."""

    class Deferred(list):
        def __iter__(self):
            for t in list.__iter__(self):
                yield t.exp()

    gate = runtime.KernelGate(install=False)
    runner = object.__new__(Runner)
    runner.monitor = SimpleNamespace(watch=lambda stage: contextlib.nullcontext())
    runner.stage = runner.tag = A
    runner.gate, runner.recorder = gate, seal.op_recorder(gate.launches)
    runner.calls, runner.ops = {}, {"calls": 0}
    x = torch.randn(8, 8)
    out = runner.invoke(lambda t: Deferred([t]), [x])
    assert type(out) is tuple and torch.equal(out[0], x.exp())
    assert runner.recorder.ops.get("aten::exp") == 1 and runner.calls[A][0][witness.BYTES] == 2 * x.numel() * 4


def test_a_graph_replay_counts_as_own_work_only_through_the_kernels_it_captured():
    """A call record's launches (its third column) hold a replayed graph's captured kernels; a call that only
    replays a graph of library ops (a replay, no own launch) is idle."""
    own_graph, library_graph = (
        [0, 0, 1, 1, 0],
        [0, 0, 0, 1, 0],
    )  # one replay each; the first's capture launched a kernel
    timed = {"/timing/0": [(0, own_graph)] * 3, "/timing/1": [(0, library_graph)] * 3}
    work = witness.call_work(timed, {}, lambda group: (100.0, 100.0))
    assert work["idle_groups"] == ["/timing/1"] and work["own_launches"] == 3


class Graph:
    """Stands for a captured ``torch.cuda.CUDAGraph`` (none can be captured without a GPU): the gate knows a graph
    only by identity."""


def test_the_gate_attributes_a_replay_to_what_its_capture_launched():
    gate = runtime.KernelGate(install=False)  # its counters alone: installed, it patches torch for a grade
    own, library, unseen = Graph(), Graph(), Graph()
    gate.captured(own, ended=False)
    gate.counts["triton"] += 2  # two Triton launches inside the capture
    gate.captured(own, ended=True)
    gate.captured(library, ended=False)
    gate.captured(library, ended=True)  # torch ops only: no launch of the candidate's own
    before = gate.own_launches()
    gate.replayed(own)
    assert gate.own_launches() - before == 2
    for graph in (library, unseen, object.__new__(object)):  # library ops, a capture it never saw, no graph at all
        gate.replayed(graph)
    assert gate.own_launches() - before == 2


def test_records_are_checked_against_the_calls_made():
    rows = {"/correctness/0": [(0, [0.0] * 5)] * 3}
    assert witness.mismatches({"/correctness/0": 3}, rows, {"ranges": {"/correctness/0": 3}, "forged_ranges": 0}) == []
    short = witness.mismatches({"/correctness/0": 4}, rows, {"ranges": {"/correctness/0": 2}, "forged_ranges": 1})
    assert len(short) == 4  # fewer records, fewer ranges, records and ranges apart, a forged range


def test_a_problem_check_decides_the_outputs_with_several_right_answers():
    check_outputs = load_module("topk_reference", REPO / "problems/hard/topk/reference.py").check_outputs
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    expected = (torch.tensor([[3.0, 3.0]]), torch.tensor([[1, 2]]))
    swapped = (torch.tensor([[3.0, 3.0]]), torch.tensor([[2, 1]]))
    table = {"float32": {"atol": 0.0, "rtol": 0.0}}
    with pytest.raises(checks.CheckFailure):
        checks.verify(expected, swapped, [x], table)  # no problem check: indices compared exactly
    checks.verify(expected, swapped, [x], table, hook=check_outputs)
    with pytest.raises(checks.CheckFailure, match="repeats"):
        checks.verify(expected, (torch.tensor([[3.0, 3.0]]), torch.tensor([[1, 1]])), [x], table, hook=check_outputs)


def grade_case(tmp_path: Path, cases_home: Path, source: str, mode: str = "check", problems: Path = REPO / "problems"):
    path = tmp_path / "solution_case.py"
    path.write_text(textwrap.dedent(source))
    roofline = load_roofline([str(REPO / "roofline_specs")], "cpu")
    (tmp_path / "case").mkdir()
    return run_case(path, tmp_path / "case", CPU, roofline, problems, mode=mode, timing=QUICK_TIMING, shared=cases_home)


def test_a_plain_pytorch_solution_on_a_kernel_track_is_a_finding_and_has_no_score(tmp_path, cases_home):
    source = (REPO / "tests/exploits/plain_pytorch.py").read_text()
    _, result, audited = grade_case(tmp_path, cases_home, source, mode="bench")
    assert result["outcome"] == "pass" and result["score"] is None, summary(result, audited)
    assert any(f["kind"] == "no_kernel" for f in result["findings"]), summary(result, audited)


def test_the_runner_never_learns_which_stage_a_call_serves(tmp_path, cases_home):
    """Every command reaches the runner under an id drawn for it alone: no stage's name, no id twice."""
    source = '''
        """Problem: demo/scale_shift"""
        import sys
        from pathlib import Path

        from _demo_kernels import scale_shift
        from _scale_shift_params import ScaleShiftParams

        LOG = Path(__file__).with_name("tags.log")


        class ModelNew(ScaleShiftParams):
            def forward(self, x):
                frame = sys._getframe(1)
                while frame is not None and not hasattr(frame.f_locals.get("self"), "monitor"):
                    frame = frame.f_back
                runner = frame.f_locals["self"]
                with LOG.open("a") as log:
                    log.write(f"{runner.stage} {runner.tag}\\n")
                return scale_shift(x, self.weight, self.bias)
    '''
    for helper in ("_demo_kernels.py", "_scale_shift_params.py"):
        shutil.copy(REPO / "tests/exploits" / helper, tmp_path / helper)
    _, result, audited = grade_case(tmp_path, cases_home, source, mode="bench")
    assert result["outcome"] == "pass", summary(result, audited)
    seen = [line.split() for line in (tmp_path / "case/grade/candidate/tags.log").read_text().splitlines()]
    ids = [tag.split("/")[0] for stage, tag in seen]
    assert len(seen) > 20 and all(
        re.fullmatch(f"[0-9a-f]{{{profiling.TOKEN_CHARS}}}(/capture)?", tag) for _, tag in seen
    )
    assert all(stage == tag for stage, tag in seen)
    assert len(set(ids)) > 10  # a new id for every command (a batch's calls share theirs)
    stages = {e["stage"] for e in result["evidence"]["runtime_events"]}
    assert "correctness" in stages and stages <= {
        "import_candidate",
        "correctness",
        "timing",
        "audit",
    }  # named back here


def test_every_compared_call_uses_the_problems_own_check(tmp_path, cases_home):
    """Top-k over rows full of ties, answered with the other tie order than the reference's: the problem's
    check_outputs accepts it in the correctness stage and in the timed batches' checks alike."""
    problems = tmp_path / "problems"
    deck = problems / "hard" / "topk"
    shutil.copytree(REPO / "problems/hard/topk", deck, ignore=shutil.ignore_patterns("solutions"))
    reference = deck / "reference.py"
    reference.write_text(
        reference.read_text()
        + textwrap.dedent("""

        def get_inputs(shape: dict, device: torch.device) -> list:
            return [torch.randint(0, 4, (shape["batch"], shape["n"]), device=device).float()]  # every row full of ties
    """)
    )
    source = '''
        """Problem: hard/topk"""
        import torch


        class ModelNew(torch.nn.Module):
            def __init__(self, k):
                super().__init__()
                self.k = k

            def forward(self, x):
                values, indices = torch.topk(x.flip(-1), self.k, dim=-1)  # of equal values, the last one first
                return values, x.shape[-1] - 1 - indices
    '''
    _, result, audited = grade_case(tmp_path, cases_home, source, mode="bench", problems=problems)
    assert result["outcome"] == "pass", summary(result, audited)
    assert result["timings"] and all(entry["candidate"]["median_ms"] > 0 for entry in result["timings"])


def test_no_call_finds_its_memory_filled(tmp_path, cases_home):
    """Checked calls, timed calls and ghost replays are prepared alike: a fresh 256-byte allocation never holds one
    byte repeated from the range a fill was once drawn from (0xC0-0xFE), in any call."""
    source = '''
        """Problem: demo/scale_shift"""
        from pathlib import Path

        import torch

        from _demo_kernels import scale_shift
        from _scale_shift_params import ScaleShiftParams

        LOG = Path(__file__).with_name("fills.log")


        class ModelNew(ScaleShiftParams):
            def forward(self, x):
                probe = torch.empty(256, dtype=torch.uint8, device=x.device)
                first = int(probe[0])
                filled = 0xC0 <= first <= 0xFE and bool((probe == first).all())
                with LOG.open("a") as log:
                    log.write("filled\\n" if filled else "plain\\n")
                return scale_shift(x, self.weight, self.bias)
    '''
    for helper in ("_demo_kernels.py", "_scale_shift_params.py"):
        shutil.copy(REPO / "tests/exploits" / helper, tmp_path / helper)
    _, result, audited = grade_case(tmp_path, cases_home, source, mode="bench")
    assert result["outcome"] == "pass", summary(result, audited)
    seen = (tmp_path / "case/grade/candidate/fills.log").read_text().split()
    assert len(seen) > 30 and set(seen) == {"plain"}, Counter(seen)
