"""A sweep's jobs are composed once per set that differs only in ``repeat``: the copies are the configs Hydra would
compose (an interpolation of the repeat resolves per copy), a bad repeat is refused like a composed one, and a
job Hydra cannot compose fails before any verb runs."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

import kbsweep
from kbsweep import KbsweepError
from kbsweep.api import compose
from kbsweep.errors import ExitCode


@pytest.mark.fast
def test_repeats_are_composed_once_and_equal_what_hydra_composes(monkeypatch):
    import hydra

    calls = []
    real = hydra.compose
    monkeypatch.setattr(hydra, "compose", lambda *a, **k: calls.append(k["overrides"]) or real(*a, **k))
    sweep = compose(["gpu=cpu", "repeat=0,1,2", "model=scripted,scripted-lazy", "sweep.name=demo-r${repeat}"], "plan")
    assert len(calls) == 2  # one per model, not per job
    calls.clear()
    one_by_one = [
        compose(["gpu=cpu", f"repeat={r}", f"model={m}", "sweep.name=demo-r${repeat}"], "plan")[0]
        for r in (0, 1, 2)
        for m in ("scripted", "scripted-lazy")
    ]  # the jobs' order: the overrides' product
    assert [OmegaConf.to_container(c, resolve=True) for c in sweep] == [
        OmegaConf.to_container(c, resolve=True) for c in one_by_one
    ]
    assert [c.sweep.name for c in sweep] == ["demo-r0", "demo-r0", "demo-r1", "demo-r1", "demo-r2", "demo-r2"]


@pytest.mark.fast
def test_a_bad_repeat_among_good_ones_is_refused():
    with pytest.raises(KbsweepError, match="key 'repeat': must be an integer >= 0, got -1"):
        kbsweep.plan("gpu=cpu", "repeat=0,-1")


@pytest.mark.fast
def test_cli_sweep_composes_every_job_before_the_verb(cli):
    proc = cli("plan", "-m", "gpu=cpu", "repeat=0,1", "model=scripted,nope-9")
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    assert "nope-9" in proc.stderr
    proc = cli("plan", "-m", "gpu=cpu", "repeat=0,1,-1")
    assert proc.returncode == ExitCode.CONFIG and "key 'repeat': must be an integer >= 0, got -1" in proc.stderr, (
        proc.stderr
    )
    proc = cli("plan", "-m", "gpu=cpu", "repeat=range(0,3)")
    assert proc.returncode == 0 and [f"r{r}" in proc.stdout for r in range(3)] == [True] * 3, proc.stderr


@pytest.mark.fast
def test_repeats_share_one_config_and_give_the_cells_of_one_by_one_composition():
    """A set's repeats are one prepared config until a job's own is read; its cells, keys and order are those of
    composing each job alone; an interpolated repeat still resolves per job."""
    from kbsweep.planner.matrix import build_matrix

    jobs = compose(["gpu=cpu", "repeat=range(0,5)", "model=scripted,scripted-lazy"], "plan")
    assert len(jobs.units) == 2 and not jobs.copies
    one_by_one = [
        c
        for r in range(5)
        for m in ("scripted", "scripted-lazy")
        for c in build_matrix(compose(["gpu=cpu", f"repeat={r}", f"model={m}"], "plan"))
    ]
    assert [(c.key, c.label) for c in build_matrix(jobs)] == [(c.key, c.label) for c in one_by_one]
    assert (
        not jobs.copies
        and jobs[3].repeat == 1
        and jobs[3].model.name == "scripted-lazy"
        and jobs.units[1][0].repeat == 0
    )
    named = compose(["gpu=cpu", "repeat=0,1", "sweep.name=demo-r${repeat}"], "plan")
    assert len(named.units) == 2 and [c.sweep for c in build_matrix(named)] == [
        "demo-r0",
        "demo-r0",
        "demo-r1",
        "demo-r1",
    ]
