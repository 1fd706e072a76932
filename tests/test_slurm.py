"""The Slurm launcher against a real single-node Slurm (scripts/slurm_up.sh: munge, slurmdbd, slurmctld, slurmd,
8 fake GPUs, a preempting `urgent` partition). Skipped, off CI only, when Slurm cannot be started here."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pytest
from test_launch import launcher_conf, make_cell, run_all, via_run_cell_pinned

from kbsweep.launch.launchers import SlurmLauncher
from kbsweep.planner.matrix import cell_dir

cloudpickle.register_pickle_by_value(sys.modules[__name__])
REPO = Path(__file__).resolve().parent.parent
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY"}


def slurm_ready() -> bool:
    if not shutil.which("sinfo"):
        return False
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15).stdout.split()
    except subprocess.TimeoutExpired:
        return False
    return any(s in ("idle", "mixed", "allocated") for s in states)


@pytest.fixture(scope="session")
def slurm() -> None:
    """A running Slurm: the one already up, else one started by scripts/slurm_up.sh."""
    if slurm_ready():
        return
    reason = "scripts/slurm_up.sh needs root (apt-get, daemons)"
    if os.geteuid() == 0:
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "slurm_up.sh")], capture_output=True, text=True, timeout=900
        )
        reason = f"scripts/slurm_up.sh exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-500:]}"
        if proc.returncode == 0 and slurm_ready():
            return
    if os.environ.get("CI"):
        pytest.fail(f"Slurm is required on CI: {reason}")
    pytest.skip(f"Slurm could not be started: {reason}")


def sacct(job_id: str) -> dict:
    """The job's accounting record once it is in a terminal state (sacct lags the job's end by a moment)."""
    fields = ["State", "Timelimit", "NNodes", "AllocTRES", "Elapsed"]
    for _ in range(60):
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", ",".join(fields)], capture_output=True, text=True
        ).stdout
        record = dict(zip(fields, out.strip().splitlines()[0].split("|"))) if out.strip() else {}
        if record.get("State", "").split()[0:1] and record["State"].split()[0] in TERMINAL:
            return record
        time.sleep(0.5)
    raise AssertionError(f"sacct: job {job_id} never reached a terminal state ({record})")


def slurm_conf(tmp_path: Path, arrays: dict | None = None, **over) -> dict:
    slurm = {
        "partition": "debug",
        "account": None,
        "qos": None,
        "cpus_per_task": 1,
        "mem_gb": 1,
        "setup": [],
        "additional_parameters": {},
        "array_parallelism": 32,
        "max_array_size": 1000,
        **(arrays or {}),
    }
    return launcher_conf(tmp_path, kind="slurm", slurm=slurm, **over)


def job_id_note(cell) -> str:
    """Append this job's Slurm id to <outputs>/jobs.txt; returns it."""
    job_id = os.environ["SLURM_JOB_ID"]
    with open(Path(cell.paths["outputs"]) / "jobs.txt", "a") as fh:
        fh.write(job_id + "\n")
    return job_id


def jobs_of(outputs: Path) -> list:
    return (outputs / "jobs.txt").read_text().split()


# ---- job bodies (stand in for run_cell inside the Slurm job) ----


def torchrun_grade(cell):
    """What a multi-track grade does (kbsweep.grader.torchrun's recipe), with the smoke worker as the grade."""
    from kbsweep.grader.locks import device_lock
    from kbsweep.grader.torchrun import run_torchrun

    job_id_note(cell)
    n = cell.track["world_size"]
    with device_lock(cell.gpu.device, count=n) as held:
        run = run_torchrun(n, "kbsweep.grader.torchrun", log_dir=cell_dir(cell) / "torchrun", timeout_s=120)
    env = {k: os.environ.get(k) for k in ("SLURM_GPUS_ON_NODE", "SLURM_NTASKS", "SLURM_JOB_NUM_NODES")}
    report = json.loads(run.stdout().strip().splitlines()[-1]) if run.returncode == 0 else run.stderr()[-2000:]
    return {"outcome": "pass", "held": held, "report": report, "env": env}


def wait_to_be_preempted(cell):
    """First attempt: runs until something ends it. Later attempts: pass at once."""
    job_id_note(cell)
    if len(jobs_of(Path(cell.paths["outputs"]))) == 1:
        time.sleep(300)
    return {"outcome": "pass"}


def hang(cell):
    """Blocks the signals Slurm and submitit send before the kill, and sleeps."""
    job_id_note(cell)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGUSR2})
    time.sleep(3600)


def stamp(cell, visible):
    """The job of an instant cell, naming its Slurm job (no kbsweep module imported: 1 000 of them run on two
    cores); a cell whose key ends in ``-dies`` dies on its first attempt (its job ends without a result)."""
    first = Path(cell.paths["outputs"]) / f"{cell.key}.tried"
    if cell.key.endswith("-dies") and not first.exists():
        first.touch()
        os._exit(3)
    return {
        "outcome": "pass",
        "job": os.environ["SLURM_JOB_ID"],
        "array": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "task": os.environ.get("SLURM_ARRAY_TASK_ID"),
    }


# ---- tests ----


def mlflow_cells(outputs: Path) -> tuple:
    """(cell runs with their artifact names, sweep runs) of one outputs folder's store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{outputs}/mlflow.db")
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, filter_string="tags.`kbsweep.kind` = 'cell'")
    sweeps = client.search_runs(experiments, filter_string="tags.`kbsweep.kind` = 'sweep'")
    cells = [
        {
            "run": r,
            "artifacts": sorted(a.path for a in client.list_artifacts(r.info.run_id)),
            "config": json.loads(
                Path(client.download_artifacts(r.info.run_id, "config.json", str(outputs))).read_text()
            ),
        }
        for r in runs
    ]
    return cells, sweeps


def test_a_sweep_through_slurm_records_what_a_local_sweep_records(slurm, tmp_path):
    """The same one-cell sweep, run at once through launcher=local and launcher=slurm, into two stores."""
    runs = {}
    for kind, extra in (("local", []), ("slurm", ["launcher.slurm.cpus_per_task=1", "launcher.slurm.mem_gb=1"])):
        env = {**os.environ, "KBSWEEP_OUTPUTS": str(tmp_path / kind), "KBSWEEP_LOCK_DIR": str(tmp_path / "locks")}
        command = [sys.executable, "-m", "kbsweep.cli", "problem=scale_shift", f"launcher={kind}", *extra]
        runs[kind] = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    for kind, proc in runs.items():
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{kind}: {err[-3000:]}"
    records = {kind: mlflow_cells(tmp_path / kind) for kind in runs}
    (local, local_sweeps), (slurm_cells, slurm_sweeps) = records["local"], records["slurm"]
    assert [s.data.params["launcher"] for s in local_sweeps + slurm_sweeps] == ["local", "slurm"]
    assert len(local) == len(slurm_cells) == 1
    a, b = local[0]["run"], slurm_cells[0]["run"]
    assert a.info.status == b.info.status == "FINISHED"
    differ = {k for k in a.data.params.keys() | b.data.params.keys() if a.data.params.get(k) != b.data.params.get(k)}
    assert a.data.params.keys() == b.data.params.keys()
    assert not differ, differ
    config_a, config_b = local[0]["config"], slurm_cells[0]["config"]
    assert {k: v for k, v in config_a.items() if k != "paths"} == {k: v for k, v in config_b.items() if k != "paths"}
    assert {k for k in config_a["paths"] if config_a["paths"][k] != config_b["paths"][k]} == {
        "outputs"
    }  # what the test set apart
    assert set(a.data.tags) == set(b.data.tags)
    same = ("outcome", "verdict", "stop_reason", "problem", "model", "gpu", "track", "kbsweep.cell_key", "deck_version")
    assert {k: a.data.tags[k] for k in same} == {k: b.data.tags[k] for k in same}
    assert a.data.tags["outcome"] == "pass"
    assert set(a.data.metrics) == set(b.data.metrics) and b.data.metrics["passed"] == 1.0
    assert local[0]["artifacts"] == slurm_cells[0]["artifacts"]
    # the Slurm job: one node, time limit = the cell's cap (agent cap + grade timeout + default slack)
    (job_file,) = (tmp_path / "slurm" / "submitit").glob("*_submitted.pkl")
    record = sacct(job_file.name.split("_")[0])
    cap_min = math.ceil((config_a["track"]["time_cap_s"] + config_a["track"]["grade_timeout_s"] + 600) / 60)
    assert record["State"] == "COMPLETED" and record["NNodes"] == "1"
    assert record["Timelimit"] == f"00:{cap_min:02d}:00"


def test_a_multi_gpu_cell_runs_torchrun_inside_one_node_with_n_gpus(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("KBSWEEP_LOCK_DIR", str(tmp_path / "locks"))
    launcher = SlurmLauncher(slurm_conf(tmp_path), job=via_run_cell_pinned(torchrun_grade))
    cell = make_cell(tmp_path, "dist", device="cuda", world_size=2, cap_s=120)
    _, done = run_all(launcher, [cell])
    result = done[0][1]
    assert result["outcome"] == "pass", result
    assert result["env"] == {"SLURM_GPUS_ON_NODE": "2", "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "1"}
    assert result["held"] == ["0", "1"]  # both allocated (fake) GPUs, held through the machine-wide lock
    report = result["report"]
    assert (report["world"], report["backend"], report["sum"], report["cuda_visible_devices"]) == (
        2,
        "gloo",
        3.0,
        "0,1",
    ), report
    record = sacct(jobs_of(tmp_path)[0])
    assert "gres/gpu=2" in record["AllocTRES"], record
    assert record["Timelimit"] in ("00:02:00", ""), record  # sacct sometimes reports the limit only later


def test_a_preempted_job_is_node_failure_then_requeued_once(slurm, tmp_path):
    launcher = SlurmLauncher(slurm_conf(tmp_path), job=via_run_cell_pinned(wait_to_be_preempted))
    jobs = tmp_path / "jobs.txt"

    def preempt() -> None:  # once the cell runs, an `urgent` job that needs the whole node preempts it
        deadline = time.monotonic() + 120
        while not jobs.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        subprocess.run(
            ["sbatch", "-p", "urgent", "-c", "16", "-o", "/dev/null", "--wrap", "sleep 1"],
            check=True,
            capture_output=True,
        )

    thread = threading.Thread(target=preempt)
    thread.start()
    started, done = run_all(launcher, [make_cell(tmp_path, "preempted", cap_s=240)])
    thread.join()
    assert len(started) == 1 and [r["outcome"] for _, r in done] == ["pass"]
    first, second = jobs_of(tmp_path)
    assert sacct(first)["State"] == "PREEMPTED"
    assert sacct(second)["State"] == "COMPLETED"


def test_a_hung_job_is_stopped_by_the_slurm_time_limit(slurm, tmp_path):
    launcher = SlurmLauncher(slurm_conf(tmp_path, requeue_infra=0), job=via_run_cell_pinned(hang))
    t0 = time.monotonic()
    _, done = run_all(launcher, [make_cell(tmp_path, "hung", cap_s=30)])
    elapsed = time.monotonic() - t0
    assert done[0][1]["outcome"] == "node_failure", done
    record = sacct(jobs_of(tmp_path)[0])
    # TIMEOUT when slurmctld's limit fires first; FAILED when the cap's own stop lands first (seen on a
    # long-running accounting store) — either way the hung job was stopped and became node_failure
    assert record["State"] in ("TIMEOUT", "FAILED") and record["Timelimit"] == "00:01:00", record
    # how long it ran by Slurm's own clock: the limit's whole minute for TIMEOUT; for FAILED, the cap's 30 s counted
    # from the launcher's start of the cell, less the job's submission and scheduling (23-25 s of Elapsed seen here)
    ran = seconds(record["Elapsed"])
    assert (ran >= 55 if record["State"] == "TIMEOUT" else 15 <= ran <= 60) and elapsed < 240, (record, elapsed)


def seconds(slurm_duration: str) -> int:
    """Seconds of a Slurm duration, ``[D-]HH:MM:SS``."""
    days, _, clock = slurm_duration.rpartition("-")
    h, m, s = map(int, clock.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def test_a_thousand_cells_go_as_throttled_job_arrays_each_task_a_cell_of_its_own(slurm, tmp_path):
    """1 000 instant cells, the queue capped at 1 000: two arrays (max_array_size 600), 16 tasks of each at once;
    every cell's result comes back from its own task, a cell whose job died is requeued alone in a later job, and
    Slurm's accounting holds every task."""
    arrays = {"array_parallelism": 16, "max_array_size": 600}
    launcher = SlurmLauncher(slurm_conf(tmp_path, arrays, concurrency=1000), job=stamp)
    cells = [make_cell(tmp_path, f"c{i}" + ("-dies" if i == 7 else ""), cap_s=240) for i in range(1000)]
    t0 = time.monotonic()
    started, done = run_all(launcher, cells)
    elapsed = time.monotonic() - t0
    print(f"1000 cells through Slurm job arrays in {elapsed:.1f} s")
    assert len(started) == len(done) == 1000 and {r["outcome"] for _, r in done} == {"pass"}
    results = {cell.key: r for cell, r in done}
    first = sorted({r["array"] for key, r in results.items() if key != "key-c7-dies"}, key=int)
    assert (
        len(first) == 2 and len({r["job"] for r in results.values()}) == 1000
    )  # a job id of its own, polled and cancelled alone
    assert results["key-c7-dies"]["array"] not in first  # requeued in a job of its own
    scripts = (tmp_path / "submitit").rglob("*_submission.sh")
    throttles = {
        line.split("=", 1)[1]
        for path in scripts
        for line in path.read_text().splitlines()
        if line.startswith("#SBATCH --array")
    }
    assert throttles == {"0-599%16", "0-399%16"}, throttles
    for array, tasks in zip(first, (600, 400)):
        states = accounted(array, tasks)
        died = {f"{array}_7"} if array == first[0] else set()  # the cell that died on its first attempt
        assert {job for job, state in states.items() if state != "COMPLETED"} == died, states


def accounted(array: str, tasks: int) -> dict:
    """Task id -> state of the ``tasks`` tasks of a job array, once sacct holds them all in a terminal state."""
    states: dict = {}
    for _ in range(240):
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", array, "-o", "JobID,State"], capture_output=True, text=True
        ).stdout
        states = {
            job: state.split()[0]
            for job, state in (line.split("|")[:2] for line in out.splitlines() if line and "[" not in line)
        }
        if len(states) == tasks and all(state in TERMINAL for state in states.values()):
            return states
        time.sleep(0.5)
    raise AssertionError(f"sacct: array {array} never held {tasks} tasks in a terminal state ({len(states)}: {states})")
