"""Our transcript events → Claude Code session JSONL for the Hugging Face agent-trace viewer."""

from __future__ import annotations

import json

import pytest

from kbsweep.agent.trace_export import RESULT_CAP, main, to_claude_code

pytestmark = pytest.mark.fast

T0 = 1_796_000_000.0
CALLS = [
    {
        "id": "call_a",
        "type": "function",
        "function": {"name": "write_file", "arguments": '{"path": "solution.py", "content": "x"}'},
    },
    {"id": "call_b", "type": "function", "function": {"name": "write_file", "arguments": '{"path": "oops'}},
]
EVENTS = [
    {"ts": T0, "type": "system", "content": "You are a GPU kernel engineer."},
    {"ts": T0 + 1, "type": "user", "content": "Make scale_shift fast on a CPU."},
    {"ts": T0 + 2, "type": "retry", "attempt": 1, "status": 429, "delay_s": 2.0, "message": "rate limited"},
    {
        "ts": T0 + 3,
        "type": "assistant",
        "content": "Writing two files.",
        "reasoning": "Start simple.",
        "tool_calls": CALLS,
        "usage": {
            "input_tokens": 1000,
            "output_tokens": 50,
            "cached_tokens": 600,
            "cache_write_tokens": 100,
            "reasoning_tokens": 10,
        },
        "finish_reason": "tool_calls",
    },
    {
        "ts": T0 + 4,
        "type": "tool",
        "name": "write_file",
        "tool_call_id": "call_a",
        "content": "wrote 1 characters to solution.py",
    },
    {
        "ts": T0 + 5,
        "type": "tool",
        "name": "write_file",
        "tool_call_id": "call_b",
        "content": "error: malformed arguments",
    },
    {"ts": T0 + 6, "type": "compaction", "shortened": 3, "keep": 4, "reason": "near the context window"},
    {"ts": T0 + 7, "type": "assistant", "content": "Done.", "tool_calls": [], "usage": {}, "finish_reason": "stop"},
    {"ts": T0 + 8, "type": "tool", "name": "read_file", "tool_call_id": "call_c", "content": "z" * (RESULT_CAP + 10)},
    {"ts": T0 + 9, "type": "stop", "reason": "model_stopped", "turns": 2, "cost_usd": 0.0123},
]


def export():
    return to_claude_code(EVENTS, session_id="sess-1", title="fake · demo/scale_shift", model="fake-model")


def test_header_records_and_common_fields():
    records = export()
    assert [r["type"] for r in records[:3]] == ["custom-title", "ai-title", "mode"]
    assert records[0]["customTitle"] == records[1]["aiTitle"] == "fake · demo/scale_shift"
    body = records[3:]
    assert [r["type"] for r in body] == [
        "user",
        "system",
        "assistant",
        "user",
        "user",
        "system",
        "assistant",
        "user",
        "system",
    ]
    assert body[0]["parentUuid"] is None
    assert all(b["parentUuid"] == a["uuid"] for a, b in zip(body, body[1:]))
    assert len({r["uuid"] for r in body}) == len(body)
    for record in body:
        assert record["sessionId"] == "sess-1" and record["isSidechain"] is False and record["userType"] == "external"
        assert record["timestamp"].endswith("Z") and record["version"] and record["entrypoint"] == "cli"
    assert body[0]["timestamp"] == "2026-11-30T00:53:21.000Z"
    assert export() == records  # deterministic
    json.dumps(records)


def test_assistant_blocks_usage_and_tool_results():
    body = export()[3:]
    assistant = body[2]["message"]
    assert [b["type"] for b in assistant["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    thinking, text, good, bad = assistant["content"]
    assert thinking == {"type": "thinking", "thinking": "Start simple.", "signature": ""}
    assert good["input"] == {"path": "solution.py", "content": "x"} and good["id"] == "call_a"
    assert bad["input"] == {"raw_arguments": '{"path": "oops'}
    assert assistant["usage"] == {
        "input_tokens": 300,
        "output_tokens": 50,
        "cache_read_input_tokens": 600,
        "cache_creation_input_tokens": 100,
    }
    assert assistant["stop_reason"] == "tool_use" and assistant["model"] == "fake-model"
    assert body[6]["message"]["stop_reason"] == "end_turn"
    ok, err, capped = (body[i]["message"]["content"][0] for i in (3, 4, 7))
    assert (ok["tool_use_id"], ok["is_error"]) == ("call_a", False)
    assert (err["tool_use_id"], err["is_error"]) == ("call_b", True)
    assert len(capped["content"]) == RESULT_CAP
    assert (
        "retry 1: rate limited" in body[1]["content"]
        and "3 items" in body[5]["content"]
        and "$0.0123" in body[8]["content"]
    )


def test_command_line(tmp_path):
    source = tmp_path / "transcript.jsonl"
    source.write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    out = tmp_path / "trace.jsonl"
    main([str(source), str(out), "--title", "t"])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 12 and lines[0] == {
        "type": "custom-title",
        "customTitle": "t",
        "sessionId": lines[3]["sessionId"],
    }


def test_mlflow_trace_maps_usage_and_messages():
    """The MLflow trace's pieces (kbsweep/agent/mlflow_trace.py): token usage, a tool result as the model saw it."""
    from kbsweep.agent.mlflow_trace import as_message, ns, usage_attribute

    usage = usage_attribute({"input_tokens": 120, "output_tokens": 30, "cached_tokens": 100, "cache_write_tokens": 7})
    assert usage == {
        "input_tokens": 120,
        "output_tokens": 30,
        "total_tokens": 150,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 7,
    }
    tool = {"type": "tool", "tool_call_id": "call_1", "name": "run_shell", "content": "ok"}
    assert as_message(tool) == {"role": "tool", "tool_call_id": "call_1", "name": "run_shell", "content": "ok"}
    assert ns(1.5) == 1_500_000_000
