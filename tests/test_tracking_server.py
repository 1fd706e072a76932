"""A real sweep logged over HTTP (``tracking.uri=http://…``) to a real `mlflow server` on loopback, started by
scripts/mlflow_server.sh; a rerun (``tracking=server``) and an export against the same server.

``served_sweep`` is shared with the browser test: one server and one logged sweep per test session.
Set KBSWEEP_TEST_MLFLOW_URI to use a running server instead of starting one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Dict

import pytest

from kbsweep.tracking.mlflow_store import make_client
from tests.test_tracking import artifact_paths

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "mlflow_server.sh"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kbsweep(
    outputs: Path, *args: str, env: Dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    full = {**os.environ, "KBSWEEP_OUTPUTS": str(outputs), "KBSWEEP_LOCK_DIR": str(outputs / "locks"), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "kbsweep.cli", *args],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def served_sweep(request, tmp_path_factory) -> Dict[str, Any]:
    """A loopback MLflow server with one kbsweep sweep (demo/scale_shift, inline launcher) logged to it over HTTP."""
    cached = getattr(request.config, "_kbsweep_served_sweep", None)
    if cached:
        return cached
    root = tmp_path_factory.mktemp("mlflow-http")
    uri, artifacts = os.environ.get("KBSWEEP_TEST_MLFLOW_URI"), None
    if not uri:
        server = root / "server"
        started = subprocess.run(
            ["bash", str(SCRIPT), "start", str(server), str(free_port())], capture_output=True, text=True, timeout=300
        )
        request.config.add_cleanup(lambda: subprocess.run(["bash", str(SCRIPT), "stop", str(server)], timeout=60))
        assert started.returncode == 0, started.stderr + (server / "server.log").read_text()
        uri, artifacts = started.stdout.strip(), server / "artifacts"
    sweep = f"http-{uuid.uuid4().hex[:8]}"
    outputs = root / "outputs"
    proc = kbsweep(
        outputs, "launcher=inline", "gpu=cpu", "problem=scale_shift", f"sweep.name={sweep}", f"tracking.uri={uri}"
    )
    info = {"uri": uri, "sweep": sweep, "proc": proc, "outputs": outputs, "artifacts": artifacts}
    request.config._kbsweep_served_sweep = info
    return info


@pytest.fixture(scope="module")
def served(request, tmp_path_factory):
    return served_sweep(request, tmp_path_factory)


def rest(uri: str, path: str, body: Dict[str, Any]) -> Dict[str, Any]:
    request = urllib.request.Request(
        f"{uri}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_sweep_logs_runs_metrics_and_artifacts_over_http(served):
    assert served["proc"].returncode == 0, served["proc"].stderr
    client = make_client(served["uri"])
    experiment = client.get_experiment_by_name(served["sweep"])
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if r.data.tags["kbsweep.kind"] == "sweep"]
    [cell] = [r for r in runs if r.data.tags["kbsweep.kind"] == "cell"]
    assert (
        cell.info.status == parent.info.status == "FINISHED"
        and cell.data.tags["mlflow.parentRunId"] == parent.info.run_id
    )
    assert cell.data.tags["outcome"] == "pass" and cell.data.metrics["score"] > 0 and cell.data.metrics["shape0.ms"] > 0
    assert cell.info.artifact_uri.startswith("mlflow-artifacts:/")  # proxied through the server
    stored = artifact_paths(client, cell.info.run_id)
    assert {"solution.py", "transcript.jsonl", "trace.jsonl", "grade.json", "audit.json", "result.json"} <= stored
    assert {"report/report.html", "report/report.md", "report/report.json"} <= artifact_paths(
        client, parent.info.run_id
    )
    if served["artifacts"]:  # our own server: the files landed in its artifact folder
        assert list(served["artifacts"].rglob("trace.jsonl")) and list(served["artifacts"].rglob("report.html"))
    found = rest(
        served["uri"],
        "runs/search",
        {"experiment_ids": [experiment.experiment_id], "filter": "tags.model = 'scripted' and metrics.score > 0"},
    )
    assert [r["info"]["run_id"] for r in found["runs"]] == [cell.info.run_id]


def test_rerun_against_the_server_runs_nothing(served):
    server_group = {"MLFLOW_TRACKING_URI": served["uri"]}  # the tracking=server group reads it
    proc = kbsweep(
        served["outputs"],
        "tracking=server",
        "launcher=inline",
        "gpu=cpu",
        "problem=scale_shift",
        f"sweep.name={served['sweep']}",
        env=server_group,
    )
    assert proc.returncode == 0, proc.stderr
    assert "1 cells, 1 already finished, 0 to log from disk, 0 to run" in proc.stderr
    client = make_client(served["uri"])
    experiment = client.get_experiment_by_name(served["sweep"])
    cells = client.search_runs([experiment.experiment_id], "tags.`kbsweep.kind` = 'cell'")
    assert len(cells) == 1


def test_export_over_http_writes_traces_and_index(served, tmp_path):
    out = tmp_path / "dataset"
    proc = kbsweep(served["outputs"], "export", f"tracking.uri={served['uri']}", f"+out={out}")
    assert proc.returncode == 0, proc.stderr
    index = [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]
    [row] = [r for r in index if r["experiment"] == served["sweep"]]
    assert row["outcome"] == "pass" and row["verdict"] == "clean" and row["score"] > 0 and row["tokens_output"] > 0
    trace = [json.loads(line) for line in (out / row["trace"]).read_text().splitlines()]
    assert trace[0]["type"] == "custom-title" and any(r.get("type") == "assistant" for r in trace)
    assert "configs:" in (out / "README.md").read_text()


def test_contamination_tripwire_knows_the_servers_runs(served, tmp_path, monkeypatch):
    """A transcript naming a run id that only the MLflow server holds (nothing on disk) is contaminated."""
    from kbsweep.audit.contamination import findings

    client = make_client(served["uri"])
    experiment = client.get_experiment_by_name(served["sweep"])
    [cell] = client.search_runs([experiment.experiment_id], "tags.`kbsweep.kind` = 'cell'")
    folder = tmp_path / "outputs" / "sweeps" / "demo" / "0123456789abcdef"
    folder.mkdir(parents=True)
    transcript = folder / "transcript.jsonl"
    event = {"ts": 1.0, "type": "assistant", "content": f"the best run so far is {cell.info.run_id}", "tool_calls": []}
    transcript.write_text(json.dumps(event) + "\n")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", served["uri"])  # as the orchestrator exports it to its cells
    [found] = [f for f in findings(transcript, {}) if f.kind == "contaminated"]
    assert f"MLflow run {cell.info.run_id}" in found.detail


@pytest.fixture(scope="module")
def mariadb_server(tmp_path_factory):
    """An MLflow server whose store is a fresh database on the local MariaDB (scripts/mariadb_up.sh, which CI's
    scripts/test.sh has started with Slurm's accounting): the shared store a lab's sweeps log to at once."""
    database = f"mlflow_{uuid.uuid4().hex[:8]}"
    sql = (
        f"CREATE DATABASE {database}; CREATE USER IF NOT EXISTS 'mlflow'@'localhost' IDENTIFIED BY 'mlflow';"
        f" GRANT ALL ON {database}.* TO 'mlflow'@'localhost';"
    )
    reason = "scripts/mariadb_up.sh needs root (apt-get, the daemon)"
    if os.geteuid() == 0:
        made = subprocess.run(
            ["bash", str(REPO / "scripts" / "mariadb_up.sh"), sql], capture_output=True, text=True, timeout=600
        )
        reason = (
            None
            if made.returncode == 0
            else f"scripts/mariadb_up.sh exited {made.returncode}: {made.stderr.strip()[-500:]}"
        )
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"MariaDB is required on CI: {reason}")
        pytest.skip(f"MariaDB could not be started: {reason}")
    server = tmp_path_factory.mktemp("mlflow-mariadb") / "server"
    store = f"mysql+pymysql://mlflow:mlflow@127.0.0.1/{database}"
    started = subprocess.run(
        ["bash", str(SCRIPT), "start", str(server), str(free_port()), store],
        capture_output=True,
        text=True,
        timeout=600,
    )
    try:
        assert started.returncode == 0, started.stderr + (server / "server.log").read_text()
        yield started.stdout.strip()
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(server)], timeout=60)
        subprocess.run(["mariadb", "-e", f"DROP DATABASE IF EXISTS {database}"], timeout=60)


def test_four_sweeps_logging_at_once_to_a_mariadb_store_lose_nothing(mariadb_server, tmp_path):
    """4 orchestrators, 50 cells each (the instant model, inline), log to one server at once (``tracking=server``,
    spans as rows of the database): every cell's run is there, finished, with its params, metrics, artifacts and
    trace."""
    sweeps = [f"db-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
    env = {**os.environ, "KBSWEEP_LOCK_DIR": str(tmp_path / "locks"), "MLFLOW_TRACKING_URI": mariadb_server}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kbsweep.cli",
                "-m",
                "model=instant",
                "track=instant",
                "repeat=range(0,25)",
                "launcher=inline",
                "preflight=off",
                "gpu=cpu",
                "sandbox.mode=unsafe",
                f"sweep.name={sweep}",
                "tracking=server",
            ],
            cwd=REPO,
            env={**env, "KBSWEEP_OUTPUTS": str(tmp_path / sweep)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for sweep in sweeps
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    client = make_client(mariadb_server)
    for sweep in sweeps:
        experiment = client.get_experiment_by_name(sweep)
        cells = client.search_runs([experiment.experiment_id], "tags.`kbsweep.kind` = 'cell'", max_results=1000)
        assert len(cells) == 50 and {c.info.status for c in cells} == {"FINISHED"}, sweep
        assert len({c.data.tags["kbsweep.cell_key"] for c in cells}) == 50
        assert all(
            c.data.tags["outcome"] == "no_solution"
            and c.data.metrics["turns"] == 2
            and c.data.tags["model"] == "instant"
            and c.data.params["setup.shell"] == "none"
            for c in cells
        )
        assert all(
            {"result.json", "transcript.jsonl", "trace.jsonl"} <= artifact_paths(client, c.info.run_id)
            for c in cells[:5]
        )
        traces = client.search_traces(locations=[experiment.experiment_id], max_results=100)
        assert len(traces) == 50 and {len(t.data.spans) for t in traces} == {5}
        assert {t.info.tags.get("mlflow.trace.spansLocation") for t in traces} == {"TRACKING_STORE"}


def test_no_server_at_the_uri_is_one_line_and_exit_4_before_anything_runs(tmp_path):
    """Nothing listens at ``tracking.uri``: one ``kbsweep: error:`` line naming the address and the script that
    starts a server, exit 4, within seconds (MLflow's own retries waited ~250 s, then a traceback), and no cell ran."""
    import time

    uri = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    proc = kbsweep(
        tmp_path / "outputs",
        "tracking=server",
        f"tracking.uri={uri}",
        "launcher=inline",
        "gpu=cpu",
        "problem=scale_shift",
        timeout=90,
    )
    took = time.monotonic() - started
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert (proc.returncode, lines) == (
        4,
        [
            f"kbsweep: error: no MLflow server answers at {uri} (connection refused); start one with scripts/mlflow_server.sh"
        ],
    )
    assert not list((tmp_path / "outputs" / "sweeps").glob("*/*/"))  # no cell folder: nothing launched
    assert took < 60, took  # ~3 s of asking /health after the CLI's start (seconds on an idle machine)


def test_a_server_that_dies_mid_sweep_loses_nothing_and_the_rerun_logs_it(tmp_path):
    """The server is stopped while an inline sweep of 60 instant cells (30 repeats of two problems) logs to it: the
    sweep says so in one line (no traceback), runs every cell to its journal, exits 4; against the server started
    again on the same store, the same command runs nothing and logs every cell the first run could not."""
    import time

    server, port, sweep = tmp_path / "server", free_port(), f"dies-{uuid.uuid4().hex[:6]}"

    def up():
        return subprocess.run(
            ["bash", str(SCRIPT), "start", str(server), str(port)], capture_output=True, text=True, timeout=300
        )

    down = lambda: subprocess.run(["bash", str(SCRIPT), "stop", str(server)], timeout=60)  # noqa: E731
    started = up()
    assert started.returncode == 0, started.stderr
    uri = started.stdout.strip()
    outputs = tmp_path / "outputs"
    args = [
        "-m",
        "model=instant",
        "track=instant",
        "repeat=range(0,30)",
        "launcher=inline",
        "preflight=off",
        "gpu=cpu",
        "sandbox.mode=unsafe",
        f"sweep.name={sweep}",
        f"tracking.uri={uri}",
    ]
    env = {**os.environ, "KBSWEEP_OUTPUTS": str(outputs), "KBSWEEP_LOCK_DIR": str(outputs / "locks")}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kbsweep.cli", *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        journals = lambda: list((outputs / "sweeps" / sweep).glob("*/result.json"))  # noqa: E731
        deadline = time.monotonic() + 300
        while len(journals()) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        down()
        out, err = proc.communicate(timeout=600)
        assert len(journals()) < 60 or "no MLflow server answers" in err, (
            "the sweep ended before the server was stopped"
        )
        assert proc.returncode == 4 and "Traceback" not in err, err[-3000:]
        assert f"[kbsweep] tracking: no MLflow server answers at {uri} (connection refused)" in err
        assert err.count("no MLflow server answers") == 2  # the sweep's line, and the board's refusal as the run ends
        assert "results are on disk but not in tracking; run the sweep again to log them" in err
        assert len(journals()) == 60  # every cell ran to its journal
        started = up()
        assert started.returncode == 0, started.stderr
        again = kbsweep(outputs, *args)
        assert again.returncode == 0, again.stderr[-3000:]
        assert ", 0 to run" in again.stderr and "Traceback" not in again.stderr
        client = make_client(uri)
        experiment = client.get_experiment_by_name(sweep)
        cells = client.search_runs([experiment.experiment_id], "tags.`kbsweep.kind` = 'cell'", max_results=1000)
        assert len({c.data.tags["kbsweep.cell_key"] for c in cells if c.info.status == "FINISHED"}) == 60
        assert "RUNNING" not in {c.info.status for c in cells}
    finally:
        down()
