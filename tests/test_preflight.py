"""Preflight against a real local OpenAI-compatible server (tests/support/fake_provider): missing keys and routes
named one per line before anything launches, a live probe per model retried through transient faults as a cell's
calls are, a refusal naming the model and what the provider answered, and `plan`'s key and token lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mlflow.tracking import MlflowClient

from kbsweep import ExitCode
from tests.support.fake_provider import Disconnect, FakeProvider, HttpError, Reply
from tests.support.sweeps import FAST_RETRY, KEY_ENV, REPO, SECRET, model_yaml

NO_CHOICES = HttpError(
    200, body={"id": "x", "object": "chat.completion", "created": 0, "model": "fake", "choices": []}
)  # an empty reply


def kbsweep(conf, outputs, *args, key=SECRET):
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    env.update(KBSWEEP_OUTPUTS=str(outputs), KBSWEEP_LOCK_DIR=str(outputs / "locks"), **({KEY_ENV: key} if key else {}))
    command = [
        sys.executable,
        "-m",
        "kbsweep.cli",
        *args,
        "-cd",
        str(conf),
        "track=demo",
        "problem=scale_shift",
        "gpu=cpu",
        "launcher=inline",
    ]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_missing_key_is_one_line_before_anything_launches(tmp_path):
    model_yaml(tmp_path / "conf", "fake", "openai/fake", "http://127.0.0.1:9/v1")
    proc = kbsweep(tmp_path / "conf", tmp_path / "out", "model=fake", key=None)
    assert proc.returncode == ExitCode.CONFIG, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("kbsweep: error:")]
    assert errors == [
        f"kbsweep: error: model 'fake' (openai/fake): environment variable {KEY_ENV} is not set (model/fake.yaml: api_key_env)"
    ]
    assert not list((tmp_path / "out" / "sweeps" / "demo").glob("*/"))  # no cell folder: nothing ran
    assert (
        MlflowClient(f"sqlite:///{tmp_path}/out/mlflow.db").get_experiment_by_name("demo") is None
    )  # nothing in the store either


def test_the_preflight_verb_names_a_missing_key_as_a_sweeps_preflight_does(tmp_path):
    model_yaml(tmp_path / "conf", "fake", "openai/fake", "http://127.0.0.1:9/v1")
    for mode in ("live", "keys"):
        proc = kbsweep(tmp_path / "conf", tmp_path / "out", "preflight", "model=fake", f"preflight={mode}", key=None)
        errors = [line for line in proc.stderr.splitlines() if line.strip()]
        assert (proc.returncode, errors) == (
            ExitCode.CONFIG,
            [
                f"kbsweep: error: model 'fake' (openai/fake): environment variable {KEY_ENV} is not set (model/fake.yaml: api_key_env)"
            ],
        ), proc.stderr
        assert proc.stdout == ""


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
    with FakeProvider(
        [HttpError(401, {"error": {"message": "invalid api key", "type": "invalid_request_error"}})]
    ) as fp:
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


def test_bad_mode_is_the_same_line_from_every_verb(tmp_path):
    model_yaml(tmp_path / "conf", "fake", "openai/fake", "http://127.0.0.1:9/v1")
    for verb in (["preflight"], [], ["plan"], ["report"]):
        proc = kbsweep(tmp_path / "conf", tmp_path / "out", *verb, "model=fake", "preflight=maybe")
        assert proc.returncode == ExitCode.CONFIG, (verb, proc.stdout)
        assert (
            proc.stderr.strip()
            == f"kbsweep: error: {REPO}/conf/config.yaml: key 'preflight': must be one of live, keys, off, got 'maybe'"
        ), verb


def test_transient_faults_are_retried_with_each_wait_on_stderr(tmp_path):
    """A 429, a 503, a reset connection and an empty reply, then an answer: the probe passes; each wait is a line."""
    with FakeProvider(
        [HttpError(429, retry_after=0), HttpError(503), Disconnect(), NO_CHOICES, Reply(content="ok")]
    ) as fp:
        model_yaml(tmp_path / "conf", "fake", "openai/fake", fp.base_url, retry={**FAST_RETRY, "max_attempts": 6})
        proc = kbsweep(tmp_path / "conf", tmp_path / "out", "preflight", "model=fake")
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert (
        proc.stdout.startswith("ok          model 'fake' (openai/fake): answered in")
        and "after 4 retries" in proc.stdout
    )
    waits = [
        line for line in proc.stderr.splitlines() if line.startswith("[kbsweep] preflight: model 'fake': attempt ")
    ]
    assert [line.split(": ")[2] for line in waits] == [f"attempt {n} of 6" for n in (1, 2, 3, 4)]
    assert (
        "attempt 1 of 6: 429 fake provider error 429; retrying in 0.0 s" in waits[0]
        and "response has no choices" in waits[3]
    )
    assert len(fp.requests) == 5


def test_a_sweep_survives_a_glitch_in_its_live_preflight(tmp_path):
    """The preflight before a sweep: one 502, retried; then the cell runs (its model gives up: no_solution)."""
    with FakeProvider([HttpError(502), Reply(content="ok"), Reply(content="I cannot do this.")]) as fp:
        model_yaml(tmp_path / "conf", "fake", "openai/fake", fp.base_url)
        proc = kbsweep(tmp_path / "conf", tmp_path / "out", "model=fake")
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "[kbsweep] preflight: model 'fake': attempt 1 of 3: 502 " in proc.stderr
    [result] = [json.loads(p.read_text()) for p in (tmp_path / "out" / "sweeps" / "demo").glob("*/result.json")]
    assert result["outcome"] == "no_solution" and len(fp.requests) == 3


def test_a_fault_for_good_is_one_line_naming_the_model_and_the_providers_answer(tmp_path):
    overloaded = HttpError(
        429,
        body={"error": {"message": "slow down: 40 requests a minute", "type": "rate_limit_exceeded"}},
        retry_after=0,
    )
    with FakeProvider([overloaded] * 3) as fp:
        model_yaml(tmp_path / "conf", "fake", "openai/fake", fp.base_url)
        proc = kbsweep(tmp_path / "conf", tmp_path / "out", "model=fake")
    assert proc.returncode == ExitCode.INFRA, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("kbsweep: error:")]
    assert errors == [
        "kbsweep: error: model 'fake' (openai/fake): rate_limited: the provider answered 429: slow down: 40 requests a minute (after 3 attempts)"
    ]
    assert len(fp.requests) == 3 and not list((tmp_path / "out" / "sweeps" / "demo").glob("*/"))


def test_a_model_without_a_route_is_refused_by_plan_and_every_preflight(tmp_path):
    path = model_yaml(tmp_path / "conf", "noroute", "openai/unused", "http://127.0.0.1:9/v1")
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "route"}))
    line = (
        "kbsweep: error: model/noroute.yaml: key 'route': missing; provider 'litellm' needs a litellm model string "
        "(e.g. openai/gpt-5.5)"
    )
    for args in (["plan"], ["preflight", "preflight=keys"], ["preflight"], ["preflight=off"]):
        proc = kbsweep(tmp_path / "conf", tmp_path / "out", *args, "model=noroute")
        errors = [error for error in proc.stderr.splitlines() if error.startswith("kbsweep: error:")]
        assert (proc.returncode, errors) == (ExitCode.CONFIG, [line]), (args, proc.stderr)
    assert not list((tmp_path / "out" / "sweeps" / "demo").glob("*/"))  # the sweep (preflight=off) ran no cell


def test_an_unreachable_host_is_named_at_once_never_as_a_providers_500(tmp_path):
    """No provider answers a name that does not resolve or a port nobody listens on: the line says so (litellm's
    InternalServerError 500 and its "Handle with" hint are no answer), after one quick retry, under the default
    retry policy (six attempts, waits doubling from 2 s, for a provider that did answer)."""
    import re
    import socket
    import time

    with socket.socket() as sock:  # a port bound and closed: nothing listens on it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    default_retry = {"max_attempts": 6, "base_delay_s": 2.0, "max_delay_s": 120.0, "budget_s": 900.0}
    for base, host, why in (
        ("http://api.kbsweep-test.invalid/v1", "api.kbsweep-test.invalid", "name not resolved"),
        (f"http://127.0.0.1:{port}/v1", f"127.0.0.1:{port}", "connection refused"),
    ):
        model_yaml(tmp_path / "conf", "fake", "openai/fake", base, retry=default_retry, timeout_s=30)
        started = time.monotonic()
        proc = kbsweep(tmp_path / "conf", tmp_path / "out", "preflight", "model=fake")
        took = time.monotonic() - started
        errors = [line for line in proc.stderr.splitlines() if line.startswith("kbsweep: error:")]
        assert (proc.returncode, errors) == (
            ExitCode.INFRA,
            [
                f"kbsweep: error: model 'fake' (openai/fake): provider_error: cannot reach {host}: {why} (after 2 attempts)"
            ],
        ), proc.stderr
        # a status 500 as a word of its own (the port drawn may hold the digits, 127.0.0.1:50097)
        assert not re.search(r"\b500\b", proc.stderr), proc.stderr
        assert "Handle with" not in proc.stderr and "InternalServerError" not in proc.stderr
        [wait] = re.findall(
            rf"attempt 1 of 2: cannot reach {re.escape(host)}: {why}; retrying in ([0-9.]+) s", proc.stderr
        )
        assert float(wait) <= 1.0
        assert took < 120, took  # the CLI's start and litellm's import included (seconds on an idle machine)
