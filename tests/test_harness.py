"""CLI harnesses: real sweeps with Claude Code and Codex (the pinned npm installs) in the cell's sandbox, their
model reached only through kbsweep's proxy, which calls the fake provider with the real key. The fake model reads
the tools each harness offers and answers with calls that harness understands."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, List

import pytest
from omegaconf import OmegaConf

from kbsweep import ExitCode
from kbsweep.agent.llm import LiteLLMModel
from kbsweep.agent.loop import Budgets
from kbsweep.agent.trace_export import to_claude_code
from kbsweep.agent.transcript import read_events
from kbsweep.harness.locate import install_dir
from kbsweep.harness.proxy import ModelProxy
from kbsweep.reporting.export import export_dataset
from tests.conftest import REPO
from tests.support.fake_provider import FakeProvider, HttpError, MalformedToolCall, Reply, ToolCall
from tests.support.scripts import kernel
from tests.support.sweeps import KEY_ENV, SECRET, cell_runs, model_yaml, results, sweep

HARNESSES = ("claude-code", "codex")


def missing_clis() -> str:
    """Which pinned CLI packages are not in .harnesses/ ('' when all are), read from each package.json by path:
    independent of kbsweep's lookup of the CLIs (kbsweep.harness.locate), which these tests test."""
    missing = []
    for name in HARNESSES:
        conf = OmegaConf.load(REPO / "conf" / "harness" / f"{name}.yaml")
        manifest = REPO / ".harnesses" / "node_modules" / conf.package / "package.json"
        if not manifest.is_file() or json.loads(manifest.read_text()).get("version") != str(conf.version):
            missing.append(f"{conf.package}@{conf.version}")
    return (
        f"{', '.join(missing)} not in .harnesses/ (`python -m kbsweep.harness.install`, needs npm)" if missing else ""
    )


@pytest.fixture
def clis() -> None:
    """The pinned CLIs: without them a test fails under CI (CI=true: scripts/test.sh installs them), else it is skipped."""
    missing = missing_clis()
    if missing:
        (pytest.fail if os.environ.get("CI", "").lower() in ("true", "1") else pytest.skip)(missing)


needs_clis = pytest.mark.usefixtures("clis")

# the key is assembled in the shell, so no file the harness writes about the command holds it whole
HALF = len(SECRET) // 2
DUMP = (
    "env; cat /proc/[0-9]*/environ | tr '\\0' '\\n'; "
    f'grep -rslF "$(printf %s {SECRET[:HALF]})$(printf %s {SECRET[HALF:]})" /workspace "$HOME" /tmp '
    '"$(dirname "$(command -v kbsweep-check)")" | sed \'s/^/LEAK /\'; echo end-of-dump'
)
Plan = List[Callable[[set], ToolCall]]
SHELL = "track.allow_shell=true"  # the demo track forbids the shell; these agents work through the CLIs' own


def shell(command: str) -> Callable[[set], ToolCall]:
    """A shell command in the harness's own tool (Claude Code: Bash; Codex: exec_command, waiting for the end of a
    check on the CPU rather than its default 10 s)."""
    return lambda tools: (
        ToolCall("Bash", {"command": command})
        if "Bash" in tools
        else ToolCall("exec_command", {"cmd": command, "yield_time_ms": 300_000})
    )


def write_solution(text: str) -> Callable[[set], ToolCall]:
    """solution.py written with Claude Code's Write tool, or through Codex's shell."""

    def call(tools: set) -> ToolCall:
        if "Write" in tools:
            return ToolCall("Write", {"file_path": "/workspace/solution.py", "content": text})
        return shell(f"cat > solution.py <<'EOF'\n{text}EOF")(tools)

    return call


def agent(plan: Plan):
    """The fake model: the next step of ``plan`` per tool result so far, then a closing text turn."""

    def answer(request):
        tools = {t["function"]["name"] for t in request.get("tools") or []}
        if not tools:
            return Reply(content="Scale-shift kernel")  # Claude Code's session title
        done = sum(1 for m in request["messages"] if m["role"] == "tool")
        return Reply(tool_calls=[plan[done](tools)]) if done < len(plan) else Reply(content="Done: it passes.")

    return answer


def run(tmp_path: Path, script, *overrides: str, harnesses=HARNESSES, exit_code: int = ExitCode.OK):
    """A sweep of demo/scale_shift with the fake model behind each harness; the result of each cell by harness."""
    with FakeProvider(script) as fp:
        model_yaml(tmp_path / "conf", "fake", "openai/fake", fp.base_url, timeout_s=60)
        proc = sweep(
            tmp_path / "conf", tmp_path / "outputs", "-m", "model=fake", "harness=" + ",".join(harnesses), *overrides
        )
    assert proc.returncode == exit_code, proc.stderr[-3000:]
    found = results(tmp_path / "outputs")
    assert sorted(found) == [f"fake@{h}" for h in harnesses]
    return fp, {h: found[f"fake@{h}"] for h in harnesses}


SCHEMA = {  # docs/transcripts.md: the fields of each event type
    "user": {"content"},
    "assistant": {"content", "tool_calls", "reasoning", "usage", "cost_usd", "latency_s", "finish_reason"},
    "tool": {"name", "tool_call_id", "arguments", "content"},
    "retry": {"attempt", "error", "status", "outcome", "delay_s", "delay_source", "message"},
    "error": {"outcome", "message"},
    "stop": {"reason", "turns", "usage", "cost_usd", "wall_s"},
}


def events_of(result) -> list:
    events = read_events(Path(result["folder"]) / "transcript.jsonl")
    for event in events:
        assert isinstance(event["ts"], float) and SCHEMA[event["type"]] <= set(event), event
    return events


@needs_clis
def test_both_harnesses_write_check_and_pass_a_kernel_without_ever_holding_the_key(tmp_path):
    fp, cells = run(tmp_path, agent([shell(DUMP), write_solution(kernel("triton")), shell("kbsweep-check")]), SHELL)
    assert {r.headers["authorization"] for r in fp.requests} == {
        f"Bearer {SECRET}"
    }  # upstream: the real key, at the proxy only

    for harness, result in cells.items():
        assert (result["outcome"], result["stop_reason"], result["verdict"]) == ("pass", "model_stopped", "clean"), (
            result
        )
        assert (
            result["turns"] >= 4 and result["usage"]["input_tokens"] >= 40
        )  # counted at the proxy: 10 + 5 tokens a call
        assert result["steps"] and result["steps"][0]["best_score"] is None  # the check tool ran through the grader
        events = events_of(result)
        tools = [e for e in events if e["type"] == "tool"]
        assert [e["name"] for e in tools] == {"claude-code": ["Bash", "Write", "Bash"], "codex": ["exec_command"] * 3}[
            harness
        ]
        dump, _, check = (e["content"] for e in tools)
        assert "outcome: pass" in check
        assert "end-of-dump" in dump and "kbsweep-" in dump  # a real dump, holding the proxy's per-cell token
        assert (
            "LEAK" not in dump and "[REDACTED]" not in dump and "fk-live" not in dump
        )  # nor env, /proc nor files: the key
        assert events[-1]["type"] == "stop" and events[-1]["harness"] == harness
        audit = json.loads(
            (Path(result["folder"]) / "audit.json").read_text()
        )  # the dump reached for other processes' env
        assert [f["detail"].split()[0] for f in audit["findings"] if f["kind"] == "sandbox_attempt"] == [
            tools[0]["name"]
        ]

        native = (Path(result["folder"]) / "harness_stream.jsonl").read_text().splitlines()
        assert json.loads(native[0])["type"] == {"claude-code": "system", "codex": "thread.started"}[harness]
        records = to_claude_code(events, "session", result["cell"], "fake")
        assert [
            b["name"]
            for r in records
            if r["type"] == "assistant"
            for b in r["message"]["content"]
            if b["type"] == "tool_use"
        ] == [e["name"] for e in tools]

    for path in (tmp_path / "outputs").rglob("*"):  # streams, transcripts, harness homes, the tracking store
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path
    runs = cell_runs(tmp_path / "outputs")
    assert sorted(r.data.tags["harness"] for r in runs) == sorted(HARNESSES)
    assert {r.data.params["harness.version"] for r in runs} == {"2.1.197", "0.171.0"}

    export_dataset(f"sqlite:///{tmp_path}/outputs/mlflow.db", tmp_path / "hf")
    index = [json.loads(line) for line in (tmp_path / "hf" / "index.jsonl").read_text().splitlines()]
    assert sorted((row["harness"], row["provider"]) for row in index) == [
        ("claude-code", "openai"),
        ("codex", "openai"),
    ]
    for row in index:
        trace = [json.loads(line) for line in (tmp_path / "hf" / row["trace"]).read_text().splitlines()]
        assert trace[0]["customTitle"].startswith(f"fake@{row['harness']} · ")
        assert {r["message"]["model"] for r in trace if r["type"] == "assistant"} == {"openai/fake"}


def kbsweep_tool(name: str, **arguments) -> Callable[[set], ToolCall]:
    """One of kbsweep's tools, under the name the harness offers it (an MCP server's tool: ``mcp__kbsweep__<name>``)."""
    return lambda tools: ToolCall(next(t for t in tools if t.endswith("__" + name)), arguments)


def forbidden_shell(tools: set) -> ToolCall:
    """A shell command in the tool each CLI has when the shell is allowed (Claude Code's Read tells them apart)."""
    command = "touch /workspace/shell-ran"
    return ToolCall("Bash", {"command": command}) if "Read" in tools else ToolCall("exec_command", {"cmd": command})


@needs_clis
def test_a_track_without_the_shell_leaves_both_clis_without_one_and_keeps_their_rejected_turns(tmp_path):
    """The demo track's ``allow_shell: false``: neither CLI is offered a shell, a shell call the model makes anyway
    never runs and stays in the transcript marked rejected, and kbsweep's tools (over MCP) write and check."""
    plan = [
        forbidden_shell,
        lambda tools: (
            ToolCall("Write", {"file_path": "/workspace/solution.py", "content": kernel("triton")})
            if "Write" in tools
            else kbsweep_tool("write_file", path="solution.py", content=kernel("triton"))(tools)
        ),
        kbsweep_tool("run_check"),
    ]
    fp, cells = run(tmp_path, agent(plan))
    offered = set().union(*({t["function"]["name"] for t in r.json.get("tools") or []} for r in fp.requests))
    assert not offered & {"Bash", "exec_command", "write_stdin"} and {"mcp__kbsweep__run_check", "Read"} <= offered

    for harness, result in cells.items():
        assert (result["outcome"], result["stop_reason"]) == ("pass", "model_stopped"), result
        assert not (Path(result["folder"]) / "workspace" / "shell-ran").exists()  # the command never ran
        assert result["steps"]  # the check over MCP went through the grader
        events = events_of(result)
        calls = [c["function"]["name"] for e in events if e["type"] == "assistant" for c in e["tool_calls"]]
        tools = [e for e in events if e["type"] == "tool"]
        expected = {
            "claude-code": ["Bash", "Write", "run_check"],
            "codex": ["exec_command", "write_file", "run_check"],
        }[harness]
        assert calls == [e["name"] for e in tools] == expected  # every turn, the rejected one too
        assert [e.get("rejected", False) for e in tools] == [True, False, False]
        assert tools[0]["content"].startswith("error:") and "outcome: pass" in tools[2]["content"]


@pytest.mark.fast
@needs_clis
def test_provider_faults_end_both_harnesses_as_infrastructure(tmp_path):
    def failing(request):
        tools = {t["function"]["name"] for t in request.get("tools") or []}
        # Claude Code (its title call has no tools); Codex gets garbled replies, billed as a provider charges them
        return (
            HttpError(429)
            if not tools or "Read" in tools
            else MalformedToolCall(prompt_tokens=1_000, completion_tokens=100)
        )

    _, cells = run(tmp_path, failing, exit_code=ExitCode.INFRA)  # cells left for a rerun
    assert (cells["claude-code"]["outcome"], cells["codex"]["outcome"]) == ("rate_limited", "provider_error")
    for result in cells.values():
        assert result["stop_reason"] == "provider_fault" and result["score"] is None
        kinds = [e["type"] for e in events_of(result)]
        assert kinds.count("retry") == 2 and kinds.count("error") == 1  # the built-in loop's retry rules, at the proxy
    assert cells["codex"]["usage"]["input_tokens"] >= 3_000  # the three garbled attempts, counted though none answered


@pytest.mark.fast
@needs_clis
def test_runs_past_max_tokens_or_the_time_cap_end_with_the_budget_outcome(tmp_path):
    _, cells = run(
        tmp_path / "tokens", agent([shell("ls")] * 20), SHELL, "track.max_tokens=40", harnesses=["claude-code"]
    )
    result = cells["claude-code"]
    assert (result["outcome"], result["stop_reason"]) == ("budget_exhausted", "token_budget"), result
    assert (
        40 <= result["usage"]["input_tokens"] + result["usage"]["output_tokens"] < 60
    )  # refused at the first call past it

    _, cells = run(tmp_path / "clock", agent([shell("sleep 60")]), SHELL, "track.time_cap_s=8", harnesses=["codex"])
    result = cells["codex"]  # stopped by the sandbox's watch in the middle of its command
    assert (result["outcome"], result["stop_reason"]) == ("budget_exhausted", "wall_clock"), result
    assert result["agent_s"] < 30


@needs_clis
def test_plan_shows_harness_cells_and_refuses_a_missing_or_unfit_harness(tmp_path, cli):
    conf = tmp_path / "conf"
    model_yaml(conf, "fake", "openai/fake", "http://127.0.0.1:9/v1")
    (conf / "harness").mkdir()
    (conf / "harness" / "ghost.yaml").write_text(
        "name: ghost\nrunner: claude-code\npackage: ghost-cli\nversion: '1.0'\nbin: kbsweep-no-such-cli\n"
    )
    demo = ["track=demo", "problem=scale_shift", "gpu=cpu"]
    plan = cli("plan", "-cd", str(conf), "-m", "model=fake", "harness=builtin,claude-code,codex", *demo)
    assert plan.returncode == 0, plan.stderr
    lines = [line.split("  ", 1) for line in plan.stdout.splitlines() if " · " in line]
    assert sorted(label.split(" · ")[0] for _, label in lines) == ["fake", "fake@claude-code", "fake@codex"]
    assert len({key for key, _ in lines}) == 3
    assert (
        "harnesses: builtin; claude-code: 2.1.197 (Claude Code)" in plan.stdout
        and "codex: codex-cli 0.171.0" in plan.stdout
    )
    builtin = cli("plan", "-cd", str(conf), "model=fake", *demo)  # the built-in loop's cells keep their keys
    assert builtin.stdout.split()[0] in {key for key, _ in lines}

    ghost = cli("plan", "-cd", str(conf), "model=fake", "harness=ghost", *demo)
    assert ghost.returncode == 2 and ghost.stderr.strip().count("\n") == 0
    assert "harness/ghost.yaml: key 'bin': 'kbsweep-no-such-cli' is not installed" in ghost.stderr
    scripted = cli("plan", "model=scripted", "harness=codex", *demo)
    assert scripted.returncode == 2 and "harness/codex.yaml: needs a litellm model" in scripted.stderr


ON_PATH = "kbsweep-path-codex"  # a name the install folder does not hold: found on PATH only


def path_only(tmp_path: Path, monkeypatch) -> Path:
    """Codex reachable only through a PATH folder's symlink to it, under a name the install folder lacks (npm's
    layout: a global ``bin/<name>`` -> ``.../node_modules/.bin/codex`` -> ``../@openai/codex/bin/codex.js``);
    returns the PATH folder."""
    path = tmp_path / "bin"
    path.mkdir()
    (path / ON_PATH).symlink_to(install_dir() / "node_modules" / ".bin" / "codex")
    monkeypatch.setenv("PATH", f"{path}:{os.environ['PATH']}")
    return path


@needs_clis
def test_a_cli_found_only_on_path_runs_in_the_sandbox(tmp_path, monkeypatch, cli):
    """Its script, package and interpreter are bound into the sandbox: the cell runs, checks and passes."""
    path = path_only(tmp_path, monkeypatch)
    conf = tmp_path / "conf"
    model_yaml(conf, "fake", "openai/fake", "http://127.0.0.1:9/v1")
    plan = cli(
        "plan",
        "-cd",
        str(conf),
        "model=fake",
        "harness=codex",
        f"harness.bin={ON_PATH}",
        "track=demo",
        "problem=scale_shift",
        "gpu=cpu",
    )
    assert plan.returncode == 0 and f"codex: codex-cli 0.171.0 ({path}/{ON_PATH})" in plan.stdout, plan.stderr

    _, cells = run(
        tmp_path,
        agent([write_solution(kernel("triton")), shell("kbsweep-check")]),
        SHELL,
        f"harness.bin={ON_PATH}",
        harnesses=["codex"],
    )
    result = cells["codex"]
    assert (result["outcome"], result["stop_reason"]) == ("pass", "model_stopped"), result
    assert "outcome: pass" in [e for e in events_of(result) if e["type"] == "tool"][-1]["content"]


@pytest.mark.fast
@needs_clis
def test_a_cli_that_cannot_run_in_the_sandbox_is_refused_before_anything_runs(tmp_path, monkeypatch, cli):
    """A wrapper on PATH that starts the CLI from a folder nothing binds: `--version` runs outside, fails inside."""
    path = path_only(tmp_path, monkeypatch)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "codex").symlink_to(path / ON_PATH)
    wrapper = path / "kbsweep-wrapped-codex"
    wrapper.write_text(f'#!/bin/sh\nexec {tmp_path}/elsewhere/codex "$@"\n')
    wrapper.chmod(0o755)
    assert "0.171.0" in subprocess.run([wrapper, "--version"], capture_output=True, text=True).stdout
    conf = tmp_path / "conf"
    model_yaml(conf, "fake", "openai/fake", "http://127.0.0.1:9/v1")
    (conf / "harness").mkdir()
    (conf / "harness" / "wrapped.yaml").write_text(
        "name: wrapped\nrunner: codex\npackage: '@openai/codex'\nversion: 0.171.0\nbin: kbsweep-wrapped-codex\n"
    )
    plan = cli(
        "plan", "-cd", str(conf), "model=fake", "harness=wrapped", "track=demo", "problem=scale_shift", "gpu=cpu"
    )
    assert plan.returncode == 2 and plan.stderr.strip().count("\n") == 0, plan.stderr
    assert (
        f"harness/wrapped.yaml: key 'bin': {wrapper} does not run in the sandbox" in plan.stderr
        and "exit code 127" in plan.stderr
    )


@needs_clis
def test_the_documented_local_server_yaml_passes_preflight_with_every_harness(tmp_path, cli):
    """docs/harnesses.md's model YAML for a local OpenAI-compatible server, its `api_base` pointed at the fake
    provider: `kbsweep preflight` sends its one request there, with the served model's name and no key."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "harnesses.md").read_text()
    text = docs.split("## A model on a local server", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    with FakeProvider(lambda request: Reply(content="ok")) as fp:
        (tmp_path / "model").mkdir()
        (tmp_path / "model" / "local-coder.yaml").write_text(text.replace("http://127.0.0.1:8000/v1", fp.base_url))
        checked = cli(
            "preflight", "-cd", str(tmp_path), "-m", "model=local-coder", "harness=builtin,claude-code,codex", "gpu=cpu"
        )
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("ok          model 'local-coder' (openai/Qwen/Qwen3-Coder-30B-A3B-Instruct)"), (
        checked.stdout
    )
    assert [(r.json["model"], r.headers["authorization"]) for r in fp.requests] == [
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "Bearer EMPTY")
    ]


def post(url: str, body: dict, token: str | None) -> tuple:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"x-api-key": token or "", "content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.fast
def test_the_proxy_serves_both_wires_to_its_token_only_and_refuses_past_the_dollar_budget(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    turn = Reply(
        tool_calls=[ToolCall("write_file", {"path": "solution.py", "content": "pass"})],
        prompt_tokens=1000,
        completion_tokens=100,
    )
    with FakeProvider(lambda request: turn) as fp:  # $0.002 a call at these prices
        conf = {
            "name": "priced",
            "route": "openai/priced",
            "api_key_env": KEY_ENV,
            "api_base": fp.base_url,
            "prices": {"input": 1.0, "output": 10.0},
        }
        with ModelProxy(LiteLLMModel(conf), conf["route"], Budgets(max_usd=0.003), toolbox=None) as proxy:
            base = "http://%s:%d" % proxy.address
            messages = {
                "model": "m",
                "max_tokens": 100,
                "messages": [{"role": "user", "content": "go"}],
                "stream": True,
            }
            assert post(f"{base}/v1/messages", messages, "sk-guess")[0] == 401
            status, text = post(f"{base}/v1/messages", messages, proxy.token)
            events = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("event: ")]
            assert status == 200 and events[0] == "message_start" and events[-1] == "message_stop"
            assert '"name": "write_file"' in text and "input_json_delta" in text
            status, text = post(f"{base}/v1/responses", {"model": "m", "input": "go", "stream": False}, proxy.token)
            assert status == 200 and [i["type"] for i in json.loads(text)["output"]] == ["function_call"]
            assert post(f"{base}/v1/messages", messages, proxy.token)[0] == 429  # $0.004 spent: refused, the run ends
            assert (
                proxy.ended.is_set() and proxy.result.stop_reason.value == "dollar_budget" and proxy.result.turns == 2
            )
            assert proxy.result.cost_usd == pytest.approx(0.004) and proxy.result.usage.input_tokens == 2000
        with pytest.raises(OSError):  # the token dies with the cell, and the server with it
            post(f"{base}/v1/messages", messages, proxy.token)
    assert len(fp.requests) == 2 and {r.headers["authorization"] for r in fp.requests} == {f"Bearer {SECRET}"}


@pytest.mark.fast
def test_install_names_each_cli_harness_pinned():
    """`python -m kbsweep.harness.install` installs each CLI harness's npm package at its YAML's version only."""
    from kbsweep.harness.install import packages

    everything = packages([])
    assert everything and all("@" in p.lstrip("@") for p in everything)
    assert packages(["builtin"]) == []  # kbsweep's own loop has no package
    assert len(packages(["codex"])) == 1
