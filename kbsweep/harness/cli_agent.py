"""CLI agents (Claude Code, Codex) as runners: the CLI runs in the cell's sandbox, its model only through a proxy.

Per cell: a :class:`~kbsweep.harness.proxy.ModelProxy` on the orchestrator's loopback; the CLI in bubblewrap with
the workspace (writable, its cwd), a fresh home (writable), its installed package and a ``kbsweep-check`` command
(read-only); no network but a forwarder to the proxy (:class:`kbsweep.sandbox_net.Relay`). Its environment is the
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
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from kbsweep.agent.loop import AgentResult
from kbsweep.agent.models import Usage
from kbsweep.agent.providers import build_model
from kbsweep.errors import KbsweepError
from kbsweep.harness.base import AgentJob, Runner
from kbsweep.harness.proxy import ModelProxy
from kbsweep.outcomes import StopReason
from kbsweep.paths import REPO_ROOT
from kbsweep.sandbox import POLL_S, WORKSPACE, Watch, kill, minimal_env
from kbsweep.sandbox_net import BASH, FORWARDER, PROXY_PORT, PROXY_SOCKET, WITH_FORWARDER, Relay

INSTALL_DIR = REPO_ROOT / ".harnesses"  # `python -m kbsweep.harness.install` puts the pinned packages here
SANDBOX_HOME = "/home/agent"
NATIVE_STREAM = "harness_stream.jsonl"
Record = Tuple[float, Dict[str, Any]]  # (arrival time, one JSON line of the CLI's stream)
Event = Tuple[float, str, Dict[str, Any]]  # (ts, type, fields) of kbsweep's transcript schema

WORKING_NOTE = """

## Working here
You run non-interactively: nobody will answer questions. The workspace is {workspace}; your answer is
{workspace}/solution.py. Check it with the shell command `kbsweep-check` (the grader's correctness check; exit
code 0 when it passes) and time it with `kbsweep-check --bench`. Finish when it passes and is as fast as you can make it.
"""

CHECK_COMMAND = '''#!{python}
"""kbsweep's check tool: grades solution.py through the grader (--bench: and times it)."""
import json, sys, urllib.request

mode = "bench" if "--bench" in sys.argv[1:] else "check"
request = urllib.request.Request("{url}/kbsweep/check", data=json.dumps({{"mode": mode}}).encode(), headers={{"x-api-key": "{token}"}})
answer = json.load(urllib.request.build_opener(urllib.request.ProxyHandler({{}})).open(request))
print(answer["output"])
sys.exit(0 if answer["outcome"] == "pass" else 1)
'''


class HarnessFailed(RuntimeError):
    """The CLI ended on its own with an error that no budget or provider fault explains (an infrastructure fault)."""


@functools.lru_cache(maxsize=None)
def installed_version(executable: str) -> str:
    proc = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    return (proc.stdout or proc.stderr).strip()


def kbsweep_usage(anthropic: Optional[Mapping[str, Any]]) -> Dict[str, int]:
    """Anthropic-style usage (disjoint input counts) as kbsweep's (input includes cache reads and writes)."""
    usage = anthropic or {}
    cached, written = int(usage.get("cache_read_input_tokens") or 0), int(usage.get("cache_creation_input_tokens") or 0)
    return vars(Usage(input_tokens=int(usage.get("input_tokens") or 0) + cached + written,
                      output_tokens=int(usage.get("output_tokens") or 0), cached_tokens=cached, cache_write_tokens=written))


def assistant_event(ts: float, content: Optional[str], calls: List[Dict[str, Any]], reasoning: Optional[str] = None,
                    usage: Optional[Dict[str, int]] = None, finish_reason: Optional[str] = None) -> Event:
    """An ``assistant`` event; cost and latency are the proxy's (the run's totals), not per turn."""
    return ts, "assistant", {"content": content, "tool_calls": calls, "reasoning": reasoning, "usage": usage or vars(Usage()),
                             "cost_usd": 0.0, "latency_s": None, "finish_reason": finish_reason or ("tool_calls" if calls else "stop")}


def tool_call(call_id: str, name: str, arguments: Any) -> Dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


class CliRunner(Runner):
    """A CLI agent installed from npm; subclasses give its command line and read its stream."""

    def executable(self) -> Path:
        installed = INSTALL_DIR / "node_modules" / ".bin" / self.conf["bin"]
        found = installed if installed.exists() else shutil.which(self.conf["bin"])
        if not found:
            raise KbsweepError(
                f"harness/{self.conf['name']}.yaml: key 'bin': '{self.conf['bin']}' is not installed; run "
                f"`python -m kbsweep.harness.install` (npm {self.conf['package']}@{self.conf['version']})"
            )
        return Path(found)

    def preflight(self, model: Mapping[str, Any]) -> None:
        if model["provider"] != "litellm":
            raise KbsweepError(
                f"harness/{self.conf['name']}.yaml: needs a litellm model (a route the proxy can call); "
                f"model '{model['name']}' has provider '{model['provider']}'"
            )
        version = installed_version(str(self.executable()))
        if self.conf.get("version") and str(self.conf["version"]) not in version:
            raise KbsweepError(
                f"harness/{self.conf['name']}.yaml: key 'version': {self.conf['version']} pinned, '{version}' installed; "
                "run `python -m kbsweep.harness.install`"
            )

    def describe(self) -> str:
        return f"{self.conf['name']}: {installed_version(str(self.executable()))} ({self.executable()})"

    def command(self, job: AgentJob, url: str, token: str, home: Path, workspace: str) -> Tuple[List[str], Dict[str, str]]:
        """The CLI's argv and its environment variables; may write its configuration into ``home`` (host path)."""
        raise NotImplementedError

    def normalize(self, records: List[Record]) -> List[Event]:
        """The CLI's stream as transcript events (assistant turns and tool results)."""
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
        events = [(started, "user", {"content": job.prompt}), *self.normalize(records), *proxy.events]
        for ts, kind, fields in sorted(events, key=lambda e: e[0]):
            job.transcript.add(kind, **fields, ts=ts)
        job.transcript.add("stop", reason=result.stop_reason.value, turns=result.turns, usage=vars(result.usage),
                           cost_usd=result.cost_usd, wall_s=result.wall_s, harness=self.conf["name"],
                           **({"message": breach[1]} if breach else {}))
        if proxy.failure:
            raise HarnessFailed(f"model proxy: {proxy.failure}")
        if not breach and not proxy.ended.is_set() and returncode != 0:
            raise HarnessFailed(f"{self.conf['name']} exited with code {returncode}: {job.transcript.redactor.text(last_error)}")
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
        workspace = WORKSPACE if sandbox.confined else str(job.workspace)
        home_seen = SANDBOX_HOME if sandbox.confined else str(home)
        url = f"http://127.0.0.1:{PROXY_PORT if relay else proxy.address[1]}"
        check = bin_dir / "kbsweep-check"
        check.write_text(CHECK_COMMAND.format(python=sys.executable, url=url, token=proxy.token))
        check.chmod(0o755)
        argv, variables = self.command(job, url, proxy.token, home, workspace)
        env = {**minimal_env(job.toolbox.secret_env), **variables, "HOME": home_seen}
        env["PATH"] = f"{bin_dir}:{self.executable().parent}:{env['PATH']}"
        # a login shell (Codex runs `bash -lc`) resets PATH in /etc/profile; the home's profile puts it back
        (home / ".bash_profile").write_text(f"export PATH={shlex.quote(env['PATH'])}\n")
        if relay:  # in the sandbox 127.0.0.1:PROXY_PORT is a forwarder to the relay's socket
            argv = [BASH, "-c", WITH_FORWARDER, "kbsweep-harness", FORWARDER, shlex.join(argv)]
        with (root / "stderr.log").open("w+") as errors:
            proc = sandbox.popen(
                argv, cwd=workspace, env=env, writable=[(job.workspace, workspace), (home, home_seen)],
                readonly=[bin_dir, *([INSTALL_DIR] if INSTALL_DIR.exists() else [])],
                extra=["--bind", str(relay.path), PROXY_SOCKET] if relay else [],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors, text=True,
            )
            records, breach = self.drive(proc, proxy, job, [job.workspace, home])
            errors.seek(0)
            return proc.returncode, records, breach, (errors.read().strip().splitlines() or [""])[-1]

    def drive(self, proc: subprocess.Popen, proxy: ModelProxy, job: AgentJob, folders: List[Path]):
        """Keep the CLI's stream (redacted) until it ends, a sandbox limit is passed, or the proxy ends the run."""
        records: List[Record] = []

        def read() -> None:
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
