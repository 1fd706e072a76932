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
    for an empty transcript). The global tracking URI must be the client's: MLflow exports traces there.

    The root span goes through MLflow's trace lifecycle (its trace info, previews and metadata); the turns' and tool
    calls' spans are built under it by a tracer that exports nothing and are logged in one request before the root
    ends. Ended one by one, MLflow wrote each span in a transaction of its own (~4 CPU-ms a span on a 2-core host:
    most of logging a cell, docs/benchmarks.md "Sweeps at scale")."""
    import mlflow
    from mlflow.entities import SpanEvent, SpanType
    from mlflow.tracing.constant import SpanAttributeKey

    if not events:
        return None
    prompt = next((e.get("content") for e in events if e["type"] == "user"), None)
    root = client.start_trace(title, span_type=SpanType.AGENT, inputs={"prompt": prompt}, tags=tags, experiment_id=experiment_id,
                              start_time_ns=ns(events[0]["ts"]), run_id=run_id, attributes={SpanAttributeKey.MODEL: model})
    child = children_of(root)
    spans = []
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
            span = child(f"turn {turn}", SpanType.CHAT_MODEL, {"messages": pending}, attributes, ns(event["ts"] - float(event.get("latency_s") or 0.0)))
            span.end(outputs={"choices": [{"index": 0, "message": message, "finish_reason": event.get("finish_reason")}]}, end_time_ns=ns(event["ts"]))
            spans.append(span)
            pending = []
        elif kind == "tool":
            pending.append(as_message(event))
            content = event.get("content") or ""
            span = child(str(event.get("name")), SpanType.TOOL, tool_input(event.get("arguments")), {"tool_call_id": event.get("tool_call_id")}, ns(previous_ts))
            span.end(outputs={"result": content}, end_time_ns=ns(event["ts"]), status="ERROR" if content.startswith("error:") else "OK")
            spans.append(span)
        elif kind == "stop":
            outputs = {k: event.get(k) for k in ("reason", "turns", "usage", "cost_usd", "wall_s", "harness") if k in event}
        elif kind in ("retry", "compaction", "error"):
            root.add_event(SpanEvent(kind, timestamp=ns(event["ts"]), attributes={"message": system_line(event)}))
        previous_ts = event["ts"]
    if spans:
        client._tracing_client.log_spans(experiment_id, [span.to_immutable_span() for span in spans])
    client.end_trace(root.trace_id, outputs=outputs, end_time_ns=ns(events[-1]["ts"]))
    mlflow.flush_trace_async_logging(terminate=False)  # written before the run is closed and the sweep moves on
    return root.trace_id


def children_of(root: Any):
    """``child(name, span_type, inputs, attributes, start_ns)``: a live span under ``root`` that no processor sees, so
    ending it exports nothing (its caller logs it). It is in the root's trace as MLflow holds it until the root ends,
    which reads the trace's size and token usage from every span."""
    from mlflow.entities.span import LiveSpan
    from mlflow.tracing.trace_manager import InMemoryTraceManager
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider(resource=Resource.get_empty()).get_tracer(__name__)  # a resource's keys would be the trace's tags
    parent = trace.set_span_in_context(trace.NonRecordingSpan(trace.SpanContext(
        trace_id=int(root.trace_id.removeprefix("tr-"), 16), span_id=int(root.span_id, 16), is_remote=False,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))))

    def child(name: str, span_type: str, inputs: Any, attributes: Dict[str, Any], start_ns: int) -> Any:
        span = LiveSpan(tracer.start_span(name, context=parent, start_time=start_ns), root.trace_id, span_type)
        span.set_inputs(inputs)
        span.set_attributes(attributes)
        InMemoryTraceManager.get_instance().register_span(span)
        return span

    return child
