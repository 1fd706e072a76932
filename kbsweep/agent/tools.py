"""The agent's tools. Each returns a bounded string; errors come back as tool results, never as crashes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from kbsweep.sandbox.confine import Sandbox

MAX_TOOL_OUTPUT = 12_000
MAX_FILE_BYTES = 1_000_000


def truncate(text: str, limit: int = MAX_TOOL_OUTPUT) -> str:
    if len(text) <= limit:
        return text
    head, tail = text[: limit // 2], text[-limit // 2 :]
    return f"{head}\n[... {len(text) - limit} characters truncated ...]\n{tail}"


def schema(name: str, description: str, properties: Dict[str, Any], required: List[str]) -> Dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


PATH = {"path": {"type": "string", "description": "a path inside the workspace"}}
TOOL_SCHEMAS = {
    "write_file": schema(
        "write_file",
        "Write a text file in the workspace.",
        {**PATH, "content": {"type": "string"}},
        ["path", "content"],
    ),
    "read_file": schema("read_file", "Read a text file of the workspace.", PATH, ["path"]),
    "list_files": schema("list_files", "List the workspace's files.", {}, []),
    "run_check": schema("run_check", "Check solution.py for correctness through the grader.", {}, []),
    "run_benchmark": schema(
        "run_benchmark", "Check and time solution.py: ms, TFLOP/s, GB/s and roofline fraction per shape.", {}, []
    ),
    "run_profile": schema(
        "run_profile",
        "Check and profile solution.py on one shape: time per call, GB/s and TFLOP/s against the "
        "roofline, launches per call, and time per GPU kernel (per torch op on CPU); never scored.",
        {},
        [],
    ),
    "run_shell": schema(
        "run_shell",
        "Run a shell command in the workspace (compilers, profilers).",
        {"command": {"type": "string"}},
        ["command"],
    ),
    "submit": schema("submit", "Submit solution.py as the final answer and stop.", {}, []),
}


GRADING_TOOLS = (
    "run_check",
    "run_benchmark",
    "run_profile",
)  # each runs a grade; the result is the toolbox's last_grade


def tool_names(allow_shell: bool) -> List[str]:
    """The built-in loop's tools on a track that allows the shell or not."""
    return [n for n in TOOL_SCHEMAS if allow_shell or n != "run_shell"]


class ToolError(Exception):
    """A tool call that failed in a way the model should see."""


@dataclass
class Toolbox:
    """Tools bound to one workspace; ``grade`` is the grader stage's entry, given by the cell.

    ``run_shell`` commands run in ``sandbox`` (docs/sandbox.md), which sees the workspace as /workspace and gets
    a minimal environment (never the ``secret_env`` names nor *_API_KEY/_TOKEN/_SECRET). The file tools resolve
    every path, symlinks included, and refuse what lands outside the workspace.
    """

    workspace: Path
    grade: Callable[[str], Dict[str, Any]]
    allow_shell: bool = True
    sandbox: Sandbox = field(default_factory=Sandbox)
    secret_env: Sequence[str] = ()
    submitted: bool = False
    last_grade: Optional[Dict[str, Any]] = field(default=None)

    def __post_init__(self) -> None:
        self.workspace = Path(self.workspace).resolve()

    def schemas(self) -> List[Dict[str, Any]]:
        return [TOOL_SCHEMAS[n] for n in tool_names(self.allow_shell)]

    def inside(self, target: Path) -> bool:
        return target == self.workspace or self.workspace in target.parents

    def resolve(self, path: str) -> Path:
        target = (self.workspace / path).resolve()
        if not self.inside(target):
            raise ToolError(f"{path}: outside the workspace")
        return target

    def call(self, name: str, raw_arguments: str) -> str:
        try:
            arguments = json.loads(raw_arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            return f"error: malformed arguments for {name}: {exc}"
        handler = getattr(self, f"tool_{name}", None)
        if handler is None or (name == "run_shell" and not self.allow_shell):
            return f"error: unknown tool {name!r}"
        try:
            return truncate(handler(**arguments))
        except (ToolError, OSError, UnicodeError) as exc:
            return f"error: {exc}"
        except (TypeError, ValueError) as exc:
            return f"error: bad arguments for {name}: {exc}"

    def tool_write_file(self, path: str, content: str) -> str:
        if len(content.encode()) > MAX_FILE_BYTES:
            raise ToolError(f"{path}: file larger than {MAX_FILE_BYTES} bytes")
        target = self.resolve(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return f"wrote {len(content)} characters to {path}"

    def tool_read_file(self, path: str) -> str:
        target = self.resolve(path)
        if not target.is_file():
            raise ToolError(f"{path}: no such file")
        return target.read_text(errors="replace")

    def tool_list_files(self) -> str:
        files = sorted(
            str(p.relative_to(self.workspace))
            for p in self.workspace.rglob("*")
            if p.is_file() and self.inside(p.resolve())
        )
        return "\n".join(f for f in files if not f.startswith(".grade")) or "(empty)"

    def tool_run_check(self) -> str:
        return self.graded("check")

    def tool_run_benchmark(self) -> str:
        return self.graded("bench")

    def tool_run_profile(self) -> str:
        return self.graded("profile")

    def graded(self, mode: str) -> str:
        if not (self.workspace / "solution.py").exists():
            raise ToolError("write solution.py first")
        result = self.grade(mode)
        self.last_grade = result
        return format_profile(result) if mode == "profile" else format_grade(result)

    def tool_run_shell(self, command: str) -> str:
        result = self.sandbox.shell(command, self.workspace, hide=self.secret_env, output_limit=MAX_TOOL_OUTPUT)
        return f"exit code {result.returncode}\n{result.output}" + "".join(
            f"\n[sandbox] {note}" for note in result.notes
        )

    def tool_submit(self) -> str:
        self.submitted = True
        return "submitted"


def format_grade(result: Dict[str, Any]) -> str:
    """What the model sees of a grade: outcome, message, and per-shape numbers."""
    lines = [f"outcome: {result['outcome']}"]
    if result.get("message"):
        lines.append(f"message: {result['message']}")
    for shape in result.get("shapes", []):
        numbers = [f"ms={shape['ms']:.4g}"]
        for key, label in (("tflops", "TFLOP/s"), ("gbps", "GB/s"), ("fraction", "roofline")):
            if shape.get(key) is not None:
                numbers.append(f"{label}={shape[key]:.4g}")
        for name, value in shape.get("speedup", {}).items():
            numbers.append(f"vs_{name}={value:.3g}x")
        lines.append(f"shape {shape['shape']}: " + " ".join(numbers))
    if result.get("score") is not None:
        lines.append(f"score ({result.get('basis')}): {result['score']:.4g}")
    return "\n".join(lines)


def format_profile(result: Dict[str, Any]) -> str:
    """What the model sees of a profile grade: the grader's summary of a pass, else the outcome as a check shows it."""
    summary = (result.get("profile") or {}).get("summary")
    return f"outcome: {result['outcome']}\n{summary}" if summary else format_grade(result)
