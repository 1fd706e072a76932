"""The local launcher: GPU pool and pinning, the machine-wide grade lock, the wall-clock cap, requeue, torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cloudpickle
import pytest

from kbsweep import KbsweepError
from kbsweep.config import gpus
from kbsweep.config.gpus import GpuSpec
from kbsweep.grader.torchrun import run_torchrun, torchrun_command
from kbsweep.launch.launchers import LocalLauncher, SubmititLauncher, WarmLocalLauncher
from kbsweep.planner.matrix import Cell, cell_dir

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # job functions below travel to the job by value

FAKE_NVML = [
    {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaa-0"},
    {"index": 1, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-bbbb-1"},
]


def make_cell(outputs: Path, name: str = "c", device: str = "cpu", world_size: int = 1, cap_s: float = 600) -> Cell:
    """A minimal cell: launchers read only its key, label, track caps, world size, device and outputs."""
    return Cell(
        sweep="launch-test",
        key=f"key-{name}",
        model={"name": "probe"},
        gpu=GpuSpec("fake", "a test GPU", "cpu", device=device),
        track={"name": "t", "time_cap_s": cap_s / 2, "grade_timeout_s": cap_s / 2, "world_size": world_size},
        problem=f"t/{name}",
        problem_dir="",
        deck_version="v",
        repeat=0,
        paths={"outputs": str(outputs)},
        launcher={},
        grade={},
    )


def local_launcher(kind: str, conf: dict, job):
    """The local launcher of ``kind``: ``fresh`` (a submitit process per cell) or ``warm`` (long-lived workers)."""
    return LocalLauncher(conf, job=job) if kind == "fresh" else WarmLocalLauncher(conf, job=job)


LOCAL_KINDS = pytest.mark.parametrize("kind", ["fresh", "warm"])


def launcher_conf(tmp_path: Path, **over) -> dict:
    conf = {
        "kind": "local",
        "concurrency": 2,
        "folder": str(tmp_path / "submitit"),
        "requeue_infra": 1,
        "cap_slack_s": 0.0,
    }
    return {**conf, **over}


def gone(pid: int, wait_s: float = 5.0) -> bool:
    """True once the process no longer runs (exited, or a zombie awaiting its reaper)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.1)
    return False


def run_all(launcher: SubmititLauncher, cells):
    """Run cells; returns (cells started, (cell, result) done), in order."""
    started, done = [], []
    launcher.run(cells, started.append, lambda cell, result: done.append((cell, result)))
    return started, done


# ---- job functions (run inside submitit jobs) ----


def via_run_cell_pinned(body):
    """A job running the real ``run_cell_pinned``, with ``body(cell)`` standing in for the cell."""

    def job(cell, visible):
        import kbsweep.launch.launchers as launch

        launch.run_cell = body
        return launch.run_cell_pinned(cell, visible)

    return job


def report_env(cell):
    return {
        "outcome": "pass",
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "order": os.environ.get("CUDA_DEVICE_ORDER"),
        "own_group": os.getpgrp() == os.getpid(),
    }


def hang(cell):
    """A hung cell that ignores signals and leaves behind a grader in its own session, a child, and an orphan
    (reparented away, still in the cell's process group); records every pid."""
    folder = cell_dir(cell)
    previous = (folder / "marker").exists()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "marker").write_text("x")
    grader = subprocess.Popen(["sleep", "300"], start_new_session=True)
    child = subprocess.Popen(["sleep", "300"])
    orphan = subprocess.run(
        ["bash", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True
    ).stdout
    with open(Path(cell.paths["outputs"]) / "attempts.jsonl", "a") as fh:
        pids = [os.getpid(), grader.pid, child.pid, int(orphan)]
        fh.write(json.dumps({"pids": pids, "saw_previous": previous}) + "\n")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGUSR2})
    time.sleep(3600)


def die_once(cell):
    """Dies without a result on the first attempt, passes on the second."""
    log = Path(cell.paths["outputs"]) / "attempts.txt"
    attempt = len(log.read_text()) + 1 if log.exists() else 1
    log.write_text("x" * attempt)
    if attempt == 1:
        os._exit(3)
    return {"outcome": "pass", "attempt": attempt}


# ---- GPU pool ----


@pytest.mark.fast
def test_visible_gpus_narrows_nvml_list_by_cuda_visible_devices():
    every = gpus.visible_gpus(FAKE_NVML, None)
    assert every == [{"visible": "0", "uuid": "GPU-aaaa-0"}, {"visible": "1", "uuid": "GPU-bbbb-1"}]
    assert gpus.visible_gpus(FAKE_NVML, "1") == [{"visible": "1", "uuid": "GPU-bbbb-1"}]
    assert gpus.visible_gpus(FAKE_NVML, "GPU-bbbb") == [{"visible": "GPU-bbbb", "uuid": "GPU-bbbb-1"}]
    assert gpus.visible_gpus(FAKE_NVML, "") == []
    assert gpus.visible_gpus([], "3,5") == [{"visible": "3", "uuid": "3"}, {"visible": "5", "uuid": "5"}]


@LOCAL_KINDS
def test_local_jobs_get_the_nvml_pool_pinned_and_a_process_group_of_their_own(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(gpus, "list_gpus", lambda: FAKE_NVML)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    launcher = local_launcher(kind, launcher_conf(tmp_path), via_run_cell_pinned(report_env))
    assert launcher.pool == ["0", "1"]
    gpu_cell, cpu_cell = make_cell(tmp_path, "g", device="cuda"), make_cell(tmp_path, "c")
    started, done = run_all(launcher, [gpu_cell, cpu_cell])
    results = {cell.key: result for cell, result in done}
    assert results[gpu_cell.key] == {"outcome": "pass", "visible": "0,1", "order": "PCI_BUS_ID", "own_group": True}
    assert results[cpu_cell.key]["visible"] == ""  # a CPU cell sees no GPU
    with pytest.raises(KbsweepError, match="needs 3 GPU"):
        launcher.run([make_cell(tmp_path, "big", device="cuda", world_size=3)], started.append, None)


# ---- machine-wide grade lock ----

HOLDER = """
import json, os, sys, time
from kbsweep.grader.locks import device_lock
with device_lock("cuda", count=int(sys.argv[2])) as held:
    start = time.time()
    pinned = os.environ["CUDA_VISIBLE_DEVICES"]
    time.sleep(0.8)
    end = time.time()
print(json.dumps({"who": sys.argv[1], "held": held, "pinned": pinned, "start": start, "end": end}))
"""


def test_grade_lock_is_exclusive_per_gpu_across_processes(tmp_path):
    """Five processes (as if from two sweeps) share GPUs 0 and 1: never two on one GPU at once, both GPUs used,
    and a 2-GPU grade holds both alone."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1", "KBSWEEP_LOCK_DIR": str(tmp_path / "locks")}
    counts = ["1", "1", "2", "1", "1"]
    procs = [
        subprocess.Popen([sys.executable, "-c", HOLDER, str(i), n], env=env, stdout=subprocess.PIPE, text=True)
        for i, n in enumerate(counts)
    ]
    holds = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(h["pinned"] == ",".join(h["held"]) for h in holds)
    assert sorted(len(h["held"]) for h in holds) == [1, 1, 1, 1, 2]
    assert {g for h in holds for g in h["held"]} == {"0", "1"}
    for a in holds:
        for b in holds:
            if a is not b and set(a["held"]) & set(b["held"]):
                assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
    assert any(a["start"] < b["end"] and b["start"] < a["end"] for a in holds for b in holds if a is not b)


# ---- wall-clock cap and requeue ----


@LOCAL_KINDS
def test_hung_cell_is_killed_at_its_cap_with_its_process_tree_and_requeued_once(tmp_path, kind):
    launcher = local_launcher(kind, launcher_conf(tmp_path, cap_slack_s=0.0), via_run_cell_pinned(hang))
    cell = make_cell(
        tmp_path, "hung", cap_s=10
    )  # a fresh job's start (Python, its imports) must fit well inside it under load
    t0 = time.monotonic()
    started, done = run_all(launcher, [cell])
    elapsed = time.monotonic() - t0
    assert started == [cell]  # one MLflow run, whatever the requeues
    assert len(done) == 1 and done[0][1]["outcome"] == "node_failure"
    assert "wall-clock cap of 10 s" in done[0][1]["message"]
    attempts = [json.loads(line) for line in (tmp_path / "attempts.jsonl").read_text().splitlines()]
    assert len(attempts) == 2
    assert [a["saw_previous"] for a in attempts] == [False, False]  # the requeue starts on a fresh folder
    assert 20 <= elapsed < 80
    assert all(gone(pid) for a in attempts for pid in a["pids"])


@LOCAL_KINDS
def test_cells_stop_with_the_orchestrator(tmp_path, kind):
    """A crash in the orchestrator (here: its on_done) kills the cells still running."""
    quick, hung = make_cell(tmp_path, "quick"), make_cell(tmp_path, "hung")

    def crash(cell, result):
        while not (tmp_path / "attempts.jsonl").exists():  # the hung cell is up
            time.sleep(0.1)
        raise RuntimeError("orchestrator crash")

    body = lambda cell: hang(cell) if cell.key == hung.key else {"outcome": "pass"}  # noqa: E731
    launcher = local_launcher(kind, launcher_conf(tmp_path), via_run_cell_pinned(body))
    with pytest.raises(RuntimeError, match="orchestrator crash"):
        launcher.run([hung, quick], lambda cell: None, crash)
    (attempt,) = [json.loads(line) for line in (tmp_path / "attempts.jsonl").read_text().splitlines()]
    assert all(gone(pid) for pid in attempt["pids"])


@LOCAL_KINDS
@pytest.mark.parametrize("requeue, outcome", [(1, "pass"), (0, "node_failure")])
def test_job_that_dies_is_node_failure_and_requeued_once(tmp_path, requeue, outcome, kind):
    launcher = local_launcher(kind, launcher_conf(tmp_path, requeue_infra=requeue), via_run_cell_pinned(die_once))
    started, done = run_all(launcher, [make_cell(tmp_path, "dies")])
    assert len(started) == 1 and len(done) == 1
    assert done[0][1]["outcome"] == outcome
    if outcome == "node_failure":
        assert "ended without a result" in done[0][1]["message"]


def test_warm_workers_run_cells_one_after_another_and_exit_with_the_sweep(tmp_path):
    """Two workers for five cells: each worker process runs several cells (what keeps its imports and zygotes
    warm), a cell's prints do not reach the result channel, and the workers are gone once the sweep ends. A
    cell is reported done before the cell taking its worker is started, so the sweep never counts more running
    cells than workers."""

    def body(cell):
        print("a cell's own output")
        return {"outcome": "pass", "pid": os.getpid()}

    launcher = local_launcher("warm", launcher_conf(tmp_path), via_run_cell_pinned(body))
    started, done, in_flight = [], [], []
    launcher.run(
        [make_cell(tmp_path, str(i)) for i in range(5)],
        lambda cell: (started.append(cell), in_flight.append(len(started) - len(done))),
        lambda cell, result: done.append((cell, result)),
    )
    pids = {result["pid"] for _, result in done}
    assert len(started) == 5 and [r["outcome"] for _, r in done] == ["pass"] * 5
    assert max(in_flight) == 2, in_flight
    assert 1 <= len(pids) <= 2
    assert all(gone(pid) for pid in pids)


@pytest.mark.parametrize("order", ["grouped", "interleaved"])
def test_warm_workers_keep_to_problems_of_their_own(tmp_path, order):
    """Two workers, two problems' cells in matrix order (grouped) or alternating: the workers start on different
    problems and each runs its problem's cells while any is left (its grading zygotes are that problem's), so it
    changes problem at most once, whichever worker answers first."""

    def body(cell):
        time.sleep(0.1 if cell.problem_dir == "p0" else 0.5)  # first in line, the faster worker takes any cell
        return {"outcome": "pass", "pid": os.getpid()}

    cells = [make_cell(tmp_path, str(i)) for i in range(10)]
    for i, cell in enumerate(cells):
        cell.problem_dir = f"p{i % 2}" if order == "interleaved" else f"p{i // 5}"
    started, done = run_all(local_launcher("warm", launcher_conf(tmp_path), via_run_cell_pinned(body)), cells)
    problems_of = {}
    for cell, result in done:
        problems_of.setdefault(result["pid"], []).append(cell.problem_dir)
    changes = [sum(a != b for a, b in zip(seq, seq[1:])) for seq in problems_of.values()]
    assert len(done) == 10 and len(problems_of) == 2 and max(changes) <= 1, problems_of
    assert {seq[0] for seq in problems_of.values()} == {"p0", "p1"}, problems_of


# ---- torchrun ----


def test_torchrun_command_runs_a_module_under_this_interpreter():
    assert torchrun_command(4, "pkg.worker", ["a", 1]) == [
        sys.executable,
        "-I",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=4",
        "-m",
        "pkg.worker",
        "a",
        "1",
    ]


def test_torchrun_gloo_world_of_two(tmp_path):
    run = run_torchrun(2, "kbsweep.grader.torchrun", log_dir=tmp_path, timeout_s=180)
    assert run.returncode == 0, run.stderr()[-2000:]
    report = json.loads(run.stdout().strip().splitlines()[-1])
    assert (report["world"], report["backend"], report["sum"]) == (2, "gloo", 3.0)


def test_torchrun_hung_ranks_are_killed_at_the_timeout(tmp_path):
    (tmp_path / "hang_worker.py").write_text(
        textwrap.dedent("""
        import os, pathlib, time
        pathlib.Path(os.environ["PIDS"], os.environ["RANK"]).write_text(str(os.getpid()))
        time.sleep(3600)
    """)
    )
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PIDS": str(pids)}
    run = run_torchrun(2, "hang_worker", log_dir=tmp_path / "logs", timeout_s=12, env=env)
    assert run.timed_out and run.returncode is None
    ranks = sorted(pids.iterdir())
    assert [p.name for p in ranks] == ["0", "1"], run.stderr()[-2000:]
    assert all(gone(int(path.read_text())) for path in ranks)


@pytest.mark.fast
def test_model_concurrency_caps_cells_per_provider(tmp_path):
    """model.concurrency: cells at once per provider (the smallest cap of its models); other providers and
    scripted models are not held back by it."""
    from kbsweep.launch.launchers import next_cell, provider_caps

    def cell(name, route, concurrency):
        c = make_cell(tmp_path, name)
        c.model = {"name": name, "provider": "litellm", "route": route, "concurrency": concurrency}
        return c

    a1, a2, b1 = cell("a1", "anthropic/x", 2), cell("a2", "anthropic/y", 1), cell("b1", "zai/z", 4)
    scripted = make_cell(tmp_path, "s")
    caps = provider_caps([a1, a2, b1, scripted])
    assert caps == {"anthropic": 1, "zai": 4}
    assert next_cell([a2, b1], [a1], caps) is b1  # anthropic is at its cap of 1
    assert next_cell([a2, scripted], [a1, b1], caps) is scripted
    assert next_cell([a2], [a1], caps) is None
    assert next_cell([a2], [b1, scripted], caps) is a2
    other, same = cell("b2", "zai/z", 4), cell("b3", "zai/z", 4)
    same.problem_dir = "warm"
    warm = lambda c: c.problem_dir == "warm"  # noqa: E731
    assert next_cell([other, same], [], caps, warm) is same
    assert next_cell([other, b1], [], caps, warm) is other  # none preferred: the first
    a2.problem_dir = "warm"
    assert (
        next_cell([a2, other], [a1], caps, warm) is other
    )  # a preferred cell over its provider's cap waits all the same
