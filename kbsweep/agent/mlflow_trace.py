"""A cell's transcript as an MLflow trace, so the MLflow UI's trace view is the conversation viewer.

One trace per cell, linked to the cell's run (``mlflow.sourceRun``): an ``AGENT`` root span (the prompt in, the stop
reason and totals out) holding, in order, a ``CHAT_MODEL`` span per model turn (the messages new since the last turn
in, the assistant message out in OpenAI's completion shape; tokens as ``mlflow.chat.tokenUsage``, dollars as
``mlflow.llm.cost``, which MLflow sums onto the trace) and a ``TOOL`` span per tool call (parsed arguments in, the
result out). Retries, compactions and provider faults are events on the root span. Times come from the transcript
(events carry their end time; a model span starts ``latency_s`` earlier, a tool span when the previous event
ended), so a trace logged after the cell ends shows the run's real timeline.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from kbsweep.agent.trace_export import system_line, tool_input

NS = 1_000_000_000


def ns(ts: float) -> int:
    return int(ts * NS)


def usage_attribute(usage: Dict[str, Any]) -> Dict[str, int]:
    """kbsweep usage → MLflow's token-usage attribute (its input_tokens counts cache reads and writes, as ours does)."""
    inputs, outputs = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
    return {
        "input_tokens": inputs,
        "output_tokens": outputs,
        "total_tokens": inputs + outputs,
        "cache_read_input_tokens": int(usage.get("cached_tokens", 0)),
        "cache_creation_input_tokens": int(usage.get("cache_write_tokens", 0)),
    }


def as_message(event: Dict[str, Any]) -> Dict[str, Any]:
    """A transcript event as the OpenAI chat message the model saw."""
    if event["type"] == "tool":
        return {"role": "tool", "tool_call_id": event.get("tool_call_id"), "name": event.get("name"), "content": event.get("content")}
    return {"role": event["type"], "content": event.get("content")}


def log_trace(client: Any, experiment_id: str, run_id: str, events: List[Dict[str, Any]], title: str, model: str, tags: Optional[Dict[str, str]] = None) -> Optional[str]:
    """Log ``events`` (a transcript, docs/transcripts.md) as one trace of ``run_id``; returns the trace id (None
    for an empty transcript). The global tracking URI must be the client's: MLflow exports traces there."""
    import mlflow
    from mlflow.entities import SpanEvent, SpanType
    from mlflow.tracing.constant import SpanAttributeKey

    if not events:
        return None
    prompt = next((e.get("content") for e in events if e["type"] == "user"), None)
    root = client.start_trace(title, span_type=SpanType.AGENT, inputs={"prompt": prompt}, tags=tags, experiment_id=experiment_id,
                              start_time_ns=ns(events[0]["ts"]), run_id=run_id, attributes={SpanAttributeKey.MODEL: model})
    pending: List[Dict[str, Any]] = []  # messages the next model turn reads for the first time
    previous_ts, turn, outputs = events[0]["ts"], 0, {}
    for event in events:
        kind = event["type"]
        if kind in ("system", "user"):
            pending.append(as_message(event))
        elif kind == "assistant":
            turn += 1
            usage, cost = event.get("usage") or {}, float(event.get("cost_usd") or 0.0)
            message = {"role": "assistant", "content": event.get("content"), "tool_calls": event.get("tool_calls") or None}
            attributes = {SpanAttributeKey.CHAT_USAGE: usage_attribute(usage), SpanAttributeKey.LLM_COST: {"total_cost": cost},
                          SpanAttributeKey.MODEL: model, "latency_s": event.get("latency_s"), "reasoning": event.get("reasoning")}
            span = client.start_span(f"turn {turn}", trace_id=root.trace_id, parent_id=root.span_id, span_type=SpanType.CHAT_MODEL,
                                     inputs={"messages": pending}, attributes=attributes,
                                     start_time_ns=ns(event["ts"] - float(event.get("latency_s") or 0.0)))
            client.end_span(root.trace_id, span.span_id, outputs={"choices": [{"index": 0, "message": message, "finish_reason": event.get("finish_reason")}]},
                            end_time_ns=ns(event["ts"]))
            pending = []
        elif kind == "tool":
            pending.append(as_message(event))
            content = event.get("content") or ""
            span = client.start_span(str(event.get("name")), trace_id=root.trace_id, parent_id=root.span_id, span_type=SpanType.TOOL,
                                     inputs=tool_input(event.get("arguments")), attributes={"tool_call_id": event.get("tool_call_id")},
                                     start_time_ns=ns(previous_ts))
            client.end_span(root.trace_id, span.span_id, outputs={"result": content}, end_time_ns=ns(event["ts"]),
                            status="ERROR" if content.startswith("error:") else "OK")
        elif kind == "stop":
            outputs = {k: event.get(k) for k in ("reason", "turns", "usage", "cost_usd", "wall_s", "harness") if k in event}
        elif kind in ("retry", "compaction", "error"):
            root.add_event(SpanEvent(kind, timestamp=ns(event["ts"]), attributes={"message": system_line(event)}))
        previous_ts = event["ts"]
    client.end_trace(root.trace_id, outputs=outputs, end_time_ns=ns(events[-1]["ts"]))
    mlflow.flush_trace_async_logging(terminate=False)  # written before the run is closed and the sweep moves on
    return root.trace_id
