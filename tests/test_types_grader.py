"""Grader bugs the type checker pointed at: a value that may be absent (None, a bare annotation, a list where an
object was expected) used as if it were there."""

from __future__ import annotations

import importlib.util
import sys
import time
from types import SimpleNamespace

import pytest


def test_torch_cuda_skips_a_bare_annotation_of_cuda(tmp_path, monkeypatch):
    """``cuda: Optional[str]`` declares the name without a value: the assignment after it is torch's CUDA version,
    not a reason to import torch."""
    from kbsweep.grader import grading

    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "version.py").write_text("from typing import Optional\ncuda: Optional[str]\ncuda = '12.4'\n")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: SimpleNamespace(origin=str(tmp_path / "__init__.py")))
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(version=SimpleNamespace(cuda="imported")))
    assert grading.torch_cuda() == "12.4"


def test_torch_cuda_without_a_torch_package_file_asks_torch(monkeypatch):
    from kbsweep.grader import grading

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: SimpleNamespace(origin=None))
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(version=SimpleNamespace(cuda="imported")))
    assert grading.torch_cuda() == "imported"


def test_another_busy_rank_fails_a_rank_that_could_not_read_its_load_as_host_busy(tmp_path):
    """``agree``: another rank's host was busy. This rank's load is None (no /proc/stat): the grade ends as a busy
    host, never as the referee's TypeError formatting None."""
    from kbsweep.grader.referee.host_load import HostBusy, QuietHost

    gate = QuietHost(1.0, 2.0, agree=lambda busy: True, stat=tmp_path / "missing", sleep=lambda s: None)
    with pytest.raises(HostBusy, match="another rank of the grade found its CPUs busy"):
        gate.time("baseline eager", lambda: {"median_ms": 1.0})


def test_a_rank_referee_times_a_kernelbench_shape(monkeypatch):
    """KernelBench's timing of a candidate kbsweep failed passes ``kernelbench=True``; a rank's override took it."""
    pytest.importorskip("torch.distributed")
    from kbsweep.grader.distributed import RankReferee
    from kbsweep.grader.referee.timing_stage import TimingStage

    seen = []

    def time_shape(self, shape, kernelbench=False):
        seen.append(kernelbench)
        self.per_rank = [[1.0], [2.0]]
        return {"candidate": {}}

    monkeypatch.setattr(TimingStage, "time_shape", time_shape)
    rank = object.__new__(RankReferee)
    rank.world = 2
    entry = rank.time_shape({"n": 1}, kernelbench=True)
    assert seen == [True] and entry["candidate"] == {"per_rank_median_ms": [1.0, 2.0], "slowest_rank": 1}


def test_a_profile_whose_kernels_are_not_an_object_is_read_as_none(monkeypatch):
    """The runner (the candidate's process) sends its profiles: a list where the kernels' object belongs must not
    end the referee with an AttributeError (a harness error, never the candidate's)."""
    from kbsweep.grader.referee.probes import ProbeStage

    stage = object.__new__(ProbeStage)
    stage.__dict__.update(
        commands={},
        calls_by_tag={},
        stages={},
        evidence={},
        findings=[],
        work={"calls": 0},
        req=SimpleNamespace(shapes=[{"n": 1}], mode="bench", own_kernels=False),
        device=SimpleNamespace(type="cuda"),
        _stage="audit",
        _since=time.perf_counter(),
    )
    profile = {"kernels": ["gemm"], "launches_per_call": 1, "streams": [7], "median_launches": 1}
    monkeypatch.setattr(
        ProbeStage, "ask", lambda self, op, **fields: {"ok": True, "profiled": {"profiles": {"/timing/0": profile}}}
    )
    timings = [{}]
    stage.collect_evidence(timings)
    assert timings[0]["profile"]["kernels"] == {} and timings[0]["profile"]["streams"] == [7]
