"""Preflight against a real local OpenAI-compatible server (tests/support/fake_provider): missing keys named one
per line before anything launches, a live probe per model, `plan`'s key and token lines; and a resumed sweep with
nothing to do logs no empty sweep run."""
from __future__ import annotations

import os
import subprocess
import sys

from kbsweep import ExitCode
from tests.support.fake_provider import FakeProvider, HttpError, Reply
from tests.support.sweeps import KEY_ENV, REPO, SECRET, model_yaml


def kbsweep(conf, outputs, *args, key=SECRET):
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    env.update(KBSWEEP_OUTPUTS=str(outputs), KBSWEEP_LOCK_DIR=str(outputs / "locks"), **({KEY_ENV: key} if key else {}))
    command = [sys.executable, "-m", "kbsweep.cli", *args, "-cd", str(conf), "track=demo", "problem=scale_shift", "gpu=cpu", "launcher=inline"]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_missing_key_is_one_line_before_anything_launches(tmp_path):
    model_yaml(tmp_path / "conf", "fake", "openai/fake", "http://127.0.0.1:9/v1")
    proc = kbsweep(tmp_path / "conf", tmp_path / "out", "model=fake", key=None)
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("kbsweep: error:")]
    assert errors == [f"kbsweep: error: model 'fake' (openai/fake): environment variable {KEY_ENV} is not set (model/fake.yaml: api_key_env)"]
    assert not list((tmp_path / "out" / "sweeps" / "demo").glob("*/"))  # no cell folder: nothing ran


def test_live_probe_reaches_the_provider(tmp_path):
    with FakeProvider([Reply(content="ok", prompt_tokens=5, completion_tokens=1)]) as fp:
        model_yaml(tmp_path / "conf", "fake", "openai/fake", fp.base_url)
        proc = kbsweep(tmp_path / "conf", tmp_path / "out", "preflight", "model=fake")
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert proc.stdout.startswith("ok          model 'fake' (openai/fake): answered in")
    [request] = fp.requests
    assert request.headers["authorization"] == f"Bearer {SECRET}"
    assert request.json["max_tokens"] == 16 and "reasoning_effort" not in request.json


def test_rejected_key_stops_the_sweep_before_it_starts(tmp_path):
    with FakeProvider([HttpError(401, {"error": {"message": "invalid api key", "type": "invalid_request_error"}})]) as fp:
        model_yaml(tmp_path / "conf", "fake", "openai/fake", fp.base_url)
        proc = kbsweep(tmp_path / "conf", tmp_path / "out", "model=fake")
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    assert len(fp.requests) == 1  # the probe only: no retry, no cell
    assert "kbsweep: error: model 'fake' (openai/fake): authentication:" in proc.stderr
    assert not list((tmp_path / "out" / "sweeps" / "demo").glob("*/"))


def test_plan_names_missing_keys_and_token_assumptions(tmp_path):
    model_yaml(tmp_path / "conf", "fake", "openai/fake", "http://127.0.0.1:9/v1")
    proc = kbsweep(tmp_path / "conf", tmp_path / "out", "plan", "model=fake", key=None)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "  fake: assumes 2,000,000 input / 150,000 output tokens per cell (model.expected_tokens)" in proc.stdout
    assert f"missing key: model 'fake' (openai/fake): environment variable {KEY_ENV} is not set" in proc.stdout


def test_bad_mode_is_one_line(tmp_path):
    model_yaml(tmp_path / "conf", "fake", "openai/fake", "http://127.0.0.1:9/v1")
    proc = kbsweep(tmp_path / "conf", tmp_path / "out", "preflight", "model=fake", "preflight=maybe")
    assert proc.returncode == ExitCode.CONFIG
    assert proc.stderr.strip() == "kbsweep: error: conf/config.yaml: key 'preflight': 'maybe' is not one of live, keys, off"
