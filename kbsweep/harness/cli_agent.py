"""CLI agents (Claude Code, Codex) as runners: the CLI runs in the cell's sandbox, its model only through a proxy.

Per cell: a :class:`~kbsweep.harness.proxy.ModelProxy` on the orchestrator's loopback; the CLI in bubblewrap with
the workspace (writable, its cwd), a fresh home (writable), its installed package and interpreter
(:mod:`kbsweep.harness.locate`) and kbsweep's tools (``tool_server.py``: the ``kbsweep-check``
command, or an MCP server when the track forbids the shell) read-only; no network but a forwarder to the proxy
(:class:`kbsweep.sandbox.net.Relay`). Its environment is the
sandbox's minimal one plus the proxy's URL and a per-cell token, never the provider key. The CLI's own stream
(JSON lines on stdout) is kept redacted as ``harness_stream.jsonl`` in the cell's folder and normalized to
kbsweep's transcript schema by the subclass. The session's wall time, memory and disk are the sandbox's watch's;
a spent budget or a provider fault at the proxy stops the CLI at once.
"""

from __future__ import annotations

import functools
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from kbsweep.agent.loop import AgentResult
from kbsweep.agent.providers import build_model
from kbsweep.agent.tools import GRADING_TOOLS
from kbsweep.errors import KbsweepError
from kbsweep.harness.base import AgentJob, Runner
from kbsweep.harness.locate import Installed, locate
from kbsweep.harness.proxy import SERVED, ModelProxy
from kbsweep.outcomes import StopReason
from kbsweep.sandbox.confine import WORKSPACE, Sandbox, SandboxPolicy, minimal_env, self_test
from kbsweep.sandbox.net import BASH, FORWARDER, PROXY_PORT, PROXY_SOCKET, WITH_FORWARDER, Relay
from kbsweep.sandbox.watch import POLL_S, Watch, kill

SANDBOX_HOME = "/home/agent"
TOOL_SERVER = Path(__file__).with_name("tool_server.py")  # copied into the sandbox (kbsweep itself is not there)
MCP_PREFIX = "mcp__kbsweep__"  # how both CLIs name the tools of the MCP server they know as "kbsweep"
NATIVE_STREAM = "harness_stream.jsonl"
Record = Tuple[float, Dict[str, Any]]  # (arrival time, one JSON line of the CLI's stream)
Event = Tuple[float, str, Dict[str, Any]]  # (ts, type, fields) of kbsweep's transcript schema

WORKING_NOTE = """

## Working here
You run non-interactively: nobody will answer questions. The workspace is {workspace}; your answer is
{workspace}/solution.py. {check} Finish when it passes and is as fast as you can make it.
"""
CHECK_NOTE = {  # by whether the track allows the shell
    True: "Check it with the shell command `kbsweep-check` (the grader's correctness check; exit code 0 when it passes) "
    "time it with `kbsweep-check --bench`, and profile it on one shape with `kbsweep-check --profile` (time per GPU "
    "kernel, launches per call, achieved GB/s and TFLOP/s against the roofline).",
    False: "There is no shell. Check it with the tool `run_check` (the grader's correctness check), time it with "
    "`run_benchmark`, and profile it on one shape with `run_profile`; `write_file`, `read_file` and `list_files` "
    "work in the workspace.",
}


@dataclass
class Session:
    """What a CLI's command line is made of, as its sandbox sees it."""

    cli: List[str]  # how to start the CLI (kbsweep.harness.locate)
    prompt: str  # the problem's prompt and how to work here
    url: str  # the model proxy
    token: str  # the cell's token: the CLI's API key
    home: Path  # its home, host path (its configuration goes there)
    workspace: str  # its cwd
    tools: Optional[List[str]]  # argv of the MCP server of kbsweep's tools when the track forbids the shell, else None


class HarnessFailed(RuntimeError):
    """The CLI ended on its own with an error that no budget or provider fault explains (an infrastructure fault)."""


@functools.lru_cache(maxsize=None)
def installed_version(installed: Installed) -> Tuple[int, str]:
    """(exit code, what it says) of ``<cli> --version`` run as a cell runs it: in the sandbox with the mounts it gets,
    where bubblewrap works here (elsewhere a sweep refuses, or runs unconfined by choice)."""
    sandbox = Sandbox(SandboxPolicy(mode="bwrap" if self_test() is None else "unsafe"))
    with tempfile.TemporaryDirectory(prefix="kbsweep-version-") as home:
        env = {**minimal_env(), "HOME": home}
        env["PATH"] = ":".join([env["PATH"], *installed.path])
        proc = sandbox.popen(
            [*installed.argv, "--version"],
            cwd="/",
            env=env,
            writable=[(Path(home), home)],
            readonly=installed.mounts,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            kill(proc)
            return 124, "timed out after 120 s"
    if proc.returncode:  # the line naming the error (node prints its stack, then its version), else the last
        lines = (err.strip() or out.strip() or "no output").splitlines()
        return proc.returncode, next((line.strip() for line in lines if "Error" in line), lines[-1])
    return 0, (out or err).strip()


def own_names(kind: str, fields: Dict[str, Any]) -> Dict[str, Any]:
    """An event with kbsweep's tools under their own names (the CLIs prefix an MCP server's), so the audit and the
    trace views read them as the built-in loop's."""

    def bare(name: str) -> str:
        return name.removeprefix(MCP_PREFIX)

    if kind == "tool":
        return {**fields, "name": bare(fields["name"])}
    if kind == "assistant":
        calls = [
            {**c, "function": {**c["function"], "name": bare(c["function"]["name"])}} for c in fields["tool_calls"]
        ]
        return {**fields, "tool_calls": calls}
    return fields


class CliRunner(Runner):
    """A CLI agent installed from npm; subclasses give its command line and read its stream."""

    def installed(self) -> Installed:
        return locate(self.conf)

    def setup(self, allow_shell: bool) -> Dict[str, str]:
        kbsweep = GRADING_TOOLS if allow_shell else SERVED
        return {
            "tools": f"{'its own' if allow_shell else 'its own that run no command'} + {','.join(kbsweep)}",
            "kbsweep_tools": "kbsweep-check in its shell" if allow_shell else "MCP server",
            "shell": "its own, in kbsweep's sandbox" if allow_shell else "none",
            "instructions": "the CLI's own system prompt, then the problem's prompt and a note on the workspace and tools",
            "ends": "when the CLI ends its session",
            "budgets_checked": "before each model call, by the model proxy; wall clock by the sandbox",
        }

    def version(self) -> str:
        """What the CLI's ``--version`` says in the sandbox; refuses (one line) a CLI that cannot run there."""
        installed = self.installed()
        code, said = installed_version(installed)
        if code:
            raise KbsweepError(
                f"harness/{self.conf['name']}.yaml: key 'bin': {installed.found} does not run in the sandbox "
                f"(`{shlex.join(installed.argv)} --version`: exit code {code}: {said})"
            )
        return said

    def preflight(self, model: Mapping[str, Any]) -> None:
        if model["provider"] != "litellm":
            raise KbsweepError(
                f"harness/{self.conf['name']}.yaml: needs a litellm model (a route the proxy can call); "
                f"model '{model['name']}' has provider '{model['provider']}'"
            )
        version = self.version()
        if self.conf.get("version") and str(self.conf["version"]) not in version:
            raise KbsweepError(
                f"harness/{self.conf['name']}.yaml: key 'version': {self.conf['version']} pinned, '{version}' installed; "
                "run `python -m kbsweep.harness.install`"
            )

    def describe(self) -> str:
        return f"{self.conf['name']}: {self.version()} ({self.installed().found})"

    def command(self, job: AgentJob, session: Session) -> Tuple[List[str], Dict[str, str]]:
        """The CLI's argv and its environment variables; may write its configuration into ``session.home``."""
        raise NotImplementedError

    def normalize(self, records: List[Record], proxy: ModelProxy) -> List[Event]:
        """The CLI's stream (or what the proxy saw) as transcript events (assistant turns and tool results)."""
        raise NotImplementedError

    def run(self, job: AgentJob) -> AgentResult:
        started = time.time()
        with ModelProxy(build_model(job.model, job.solutions), job.model["route"], job.budgets, job.toolbox) as proxy:
            relay = Relay(proxy.address) if job.toolbox.sandbox.confined else None
            try:
                returncode, records, breach, last_error = self.session(job, proxy, relay)
            finally:
                if relay:
                    relay.close()
        result = proxy.result
        if breach:
            result.stop_reason = StopReason.WALL_CLOCK if breach[0] == "wall" else StopReason.MODEL_STOPPED
        events = [(started, "user", {"content": job.prompt}), *self.normalize(records, proxy), *proxy.events]
        for ts, kind, fields in sorted(events, key=lambda e: e[0]):
            job.transcript.add(kind, **own_names(kind, fields), ts=ts)
        job.transcript.add(
            "stop",
            reason=result.stop_reason.value,
            turns=result.turns,
            usage=vars(result.usage),
            cost_usd=result.cost_usd,
            wall_s=result.wall_s,
            harness=self.conf["name"],
            **({"message": breach[1]} if breach else {}),
        )
        if proxy.failure:
            raise HarnessFailed(f"model proxy: {proxy.failure}")
        if not breach and not proxy.ended.is_set() and returncode != 0:
            raise HarnessFailed(
                f"{self.conf['name']} exited with code {returncode}: {job.transcript.redactor.text(last_error)}"
            )
        return result

    def session(self, job: AgentJob, proxy: ModelProxy, relay: Optional[Relay]):
        """Run the CLI in the sandbox until it ends or is stopped: (exit code, its stream, the sandbox's breach or
        None, its last stderr line)."""
        sandbox = job.toolbox.sandbox
        root = job.folder / "harness"
        shutil.rmtree(root, ignore_errors=True)
        home, bin_dir = root / "home", root / "bin"
        home.mkdir(parents=True)
        bin_dir.mkdir()
        installed = self.installed()
        workspace = WORKSPACE if sandbox.confined else str(job.workspace)
        home_seen = SANDBOX_HOME if sandbox.confined else str(home)
        url = f"http://127.0.0.1:{PROXY_PORT if relay else proxy.address[1]}"
        check = bin_dir / "kbsweep-check"
        check.write_text(f"#!{sys.executable}\n" + TOOL_SERVER.read_text())
        check.chmod(0o755)
        served = [t["function"] for t in job.toolbox.schemas() if t["function"]["name"] in SERVED]
        (bin_dir / "tools.json").write_text(json.dumps({"url": url, "token": proxy.token, "tools": served}))
        shell = job.toolbox.allow_shell
        note = WORKING_NOTE.format(workspace=workspace, check=CHECK_NOTE[shell])
        argv, variables = self.command(
            job,
            Session(
                list(installed.argv),
                job.prompt + note,
                url,
                proxy.token,
                home,
                workspace,
                None if shell else [str(check), "--mcp"],
            ),
        )
        env = {**minimal_env(job.toolbox.secret_env), **variables, "HOME": home_seen}
        env["PATH"] = ":".join([str(bin_dir), env["PATH"], *installed.path])
        # a login shell (Codex runs `bash -lc`) resets PATH in /etc/profile; the home's profile puts it back
        (home / ".bash_profile").write_text(f"export PATH={shlex.quote(env['PATH'])}\n")
        if relay:  # in the sandbox 127.0.0.1:PROXY_PORT is a forwarder to the relay's socket
            argv = [BASH, "-c", WITH_FORWARDER, "kbsweep-harness", FORWARDER, shlex.join(argv)]
        with (root / "stderr.log").open("w+") as errors:
            proc = sandbox.popen(
                argv,
                cwd=workspace,
                env=env,
                writable=[(job.workspace, workspace), (home, home_seen)],
                readonly=[bin_dir, *installed.mounts],
                extra=["--bind", str(relay.path), PROXY_SOCKET] if relay else [],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
            )
            records, breach = self.drive(proc, proxy, job, [job.workspace, home])
            errors.seek(0)
            return proc.returncode, records, breach, (errors.read().strip().splitlines() or [""])[-1]

    def drive(self, proc: subprocess.Popen, proxy: ModelProxy, job: AgentJob, folders: List[Path]):
        """Keep the CLI's stream (redacted) until it ends, a sandbox limit is passed, or the proxy ends the run."""
        records: List[Record] = []

        def read() -> None:
            assert proc.stdout is not None  # started with stdout=PIPE
            with (job.folder / NATIVE_STREAM).open("w") as native:
                for line in proc.stdout:
                    native.write(job.transcript.redactor.text(line))
                    try:
                        records.append((time.time(), json.loads(line)))
                    except ValueError:
                        pass

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        policy = job.toolbox.sandbox.policy
        watch = Watch(proc, job.budgets.wall_s, policy.memory_mib, policy.disk_mib, folders)
        breach = None
        while proc.poll() is None:
            breach = watch.breach()
            if breach or proxy.ended.is_set():
                kill(proc)
                break
            time.sleep(POLL_S)
        reader.join()
        return records, breach
