"""Scripted conversations for the fake provider: a model working problems/demo/scale_shift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.fake_provider import Reply, ToolCall

SOLUTIONS = Path(__file__).resolve().parents[2] / "problems" / "demo" / "scale_shift" / "solutions"


def kernel(name: str) -> str:
    """A bundled solution's text: ``wrong`` (forgets the bias) or ``triton`` (correct)."""
    return (SOLUTIONS / f"{name}.py").read_text()


def call(tool: str, say: str | None = None, **arguments: Any) -> Reply:
    """An assistant turn making one tool call."""
    return Reply(content=say, tool_calls=[ToolCall(tool, arguments)])


def write(name: str, say: str | None = None) -> Reply:
    """An assistant turn writing bundled solution ``name`` to solution.py."""
    return call("write_file", say, path="solution.py", content=kernel(name))


def multi_turn_fix() -> list[Reply]:
    """Write a wrong kernel, check it, fix it, check, benchmark, submit."""
    return [
        write("wrong", "A first attempt."),
        call("run_check"),
        write("triton", "The bias is missing; fixing."),
        call("run_check"),
        call("run_benchmark"),
        call("submit"),
    ]
