"""Secrets: a real sweep (litellm over the fake provider, so the model key is really sent) with fake secrets planted
in the orchestrator's environment; the agent dumps every environment it can reach from the shell, and its
solution prints the grading process's. Every file the sweep wrote and every MLflow record hold none of them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mlflow.tracking import MlflowClient

from kbsweep.agent.transcript import read_events
from tests.support.fake_provider import FakeProvider, Reply
from tests.support.scripts import call, kernel
from tests.support.sweeps import KEY_ENV, SECRET, model_yaml, results, sweep

PLANTED = {  # the model's key (named by its YAML), secret-shaped names, and names no rule recognises
    KEY_ENV: SECRET,
    "OPENAI_API_KEY": "sk-planted0openai0key0123456789",
    "HF_TOKEN": "hf_planted0token0abcdefghijklmn",
    "AWS_SECRET_ACCESS_KEY": "planted0aws0secret0access0key0zz",
    "KBSWEEP_PLAIN_CREDENTIAL": "planted-plain-credential-31337",
}
PRINTS_ENV = "import os\nprint('GRADER_ENV', dict(os.environ), flush=True)\n" + kernel("triton")


def orchestrator() -> int:
    """The pid of the running sweep: the process whose environment holds the model key."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(pid) != os.getpid() and f"{KEY_ENV}={SECRET}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                return int(pid)
        except OSError:
            pass
    raise AssertionError("no process holds the key")


def test_no_secret_reaches_a_file_a_transcript_or_mlflow(tmp_path, monkeypatch):
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)  # the sweep inherits this process's environment

    def dump_command():
        return f"env; cat /proc/[0-9]*/environ; cat /proc/{orchestrator()}/environ; echo end-of-dump"

    steps = iter(
        [
            lambda: Reply(
                content=f"My key is {SECRET}.",
                reasoning_content=f"{SECRET} again",
                tool_calls=[("run_shell", {"command": dump_command()})],
            ),
            lambda: call("write_file", path="solution.py", content=PRINTS_ENV),
            lambda: call("run_check"),
            lambda: call("submit"),
        ]
    )
    with FakeProvider(lambda request: next(steps)()) as fp:
        model_yaml(tmp_path / "conf", "fake-secrets", "openai/fake-secrets", fp.base_url)
        proc = sweep(tmp_path / "conf", tmp_path / "outputs", "model=fake-secrets", "track.allow_shell=true")
    assert proc.returncode == 0, proc.stderr
    assert fp.requests[0].headers["authorization"] == f"Bearer {SECRET}"  # the key was really used

    result = results(tmp_path / "outputs")["fake-secrets"]
    assert result["outcome"] == "pass" and result["stop_reason"] == "submitted"
    folder = Path(result["folder"])
    [dump] = [
        e["content"]
        for e in read_events(folder / "transcript.jsonl")
        if e["type"] == "tool" and e["name"] == "run_shell"
    ]
    assert dump.rstrip().endswith("end-of-dump") and "HOME=/tmp" in dump
    assert "[REDACTED]" not in dump  # nothing to redact: the secrets never entered the sandbox
    assert "GRADER_ENV" in "".join(p.read_text() for p in folder.glob("grades/*/grade_stdout.log"))

    files = [p for p in (tmp_path / "outputs").rglob("*") if p.is_file()]
    assert len(files) > 20 and any(p.suffix == ".db" for p in files) and any("mlartifacts" in p.parts for p in files)
    for path in files:
        data = path.read_bytes()
        assert not [name for name, value in PLANTED.items() if value.encode() in data], path

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/outputs/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    [cell] = [r for r in runs if r.data.tags.get("kbsweep.kind") == "cell"]
    config = json.loads(
        Path(client.download_artifacts(cell.info.run_id, "config.json", str(tmp_path / "config"))).read_text()
    )
    assert config["model"]["api_key_env"] == KEY_ENV  # the variable's name, never its value
    for run in runs:
        record = json.dumps([run.data.params, run.data.tags, sorted(run.data.metrics)])
        assert not [name for name, value in PLANTED.items() if value in record], run.info.run_id
