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

import json
from typing import Any, Dict, List, Optional, Sequence

from mlflow.tracing.trace_manager import InMemoryTraceManager
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

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
        return {
            "role": "tool",
            "tool_call_id": event.get("tool_call_id"),
            "name": event.get("name"),
            "content": event.get("content"),
        }
    return {"role": event["type"], "content": event.get("content")}


class TraceWriter:
    """Writes transcripts as traces to one MLflow store (:meth:`log`).

    MLflow's span processor builds each trace as it does for its own tracing APIs (its metadata, previews, token
    usage and cost); this writer is that processor's exporter, on a tracer provider of its own. It stores a finished
    trace's info in one request and its spans where ``spans`` says (:class:`StoreExporter`). MLflow's exporter logs
    the spans first and the info after the root span ends, which the store merges row by row into the trace the
    spans made: 72 SQL statements and ~58 CPU-ms for a 5-span trace on SQLite, against 23 and ~21 ms info then spans
    (docs/benchmarks.md, "Sweeps at scale")."""

    def __init__(self, tracking_uri: str, spans: str = "artifact"):
        from mlflow.tracing.client import TracingClient
        from mlflow.tracing.processor.mlflow_v3 import MlflowV3SpanProcessor
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        self.exporter = StoreExporter(TracingClient(tracking_uri), spans)
        provider = TracerProvider(resource=Resource.get_empty())  # a resource's keys would be the trace's tags
        provider.add_span_processor(MlflowV3SpanProcessor(self.exporter, export_metrics=False))
        self.tracer = provider.get_tracer(__name__)

    def log(
        self,
        experiment_id: str,
        run_id: str,
        events: List[Dict[str, Any]],
        title: str,
        model: str,
        tags: Optional[Dict[str, str]] = None,
    ) -> Optional[str]:
        """Log ``events`` (a transcript, docs/transcripts.md) as one trace of ``run_id``; returns the trace id (None
        for an empty transcript). Raises what the store raised."""
        from mlflow.entities import SpanEvent, SpanType
        from mlflow.tracing.constant import SpanAttributeKey, TraceMetadataKey

        if not events:
            return None
        prompt = next((e.get("content") for e in events if e["type"] == "user"), None)
        root = self.span(
            None,
            title,
            SpanType.AGENT,
            {"prompt": prompt},
            {SpanAttributeKey.MODEL: model},
            ns(events[0]["ts"]),
            experiment_id,
        )
        with InMemoryTraceManager.get_instance().get_trace(root.trace_id) as held:
            held.info.trace_metadata[TraceMetadataKey.SOURCE_RUN] = run_id
            held.info.tags.update(tags or {})
        pending: List[Dict[str, Any]] = []  # messages the next model turn reads for the first time
        previous_ts, turn, outputs = events[0]["ts"], 0, {}
        for event in events:
            kind = event["type"]
            if kind in ("system", "user"):
                pending.append(as_message(event))
            elif kind == "assistant":
                turn += 1
                usage, cost = event.get("usage") or {}, float(event.get("cost_usd") or 0.0)
                message = {
                    "role": "assistant",
                    "content": event.get("content"),
                    "tool_calls": event.get("tool_calls") or None,
                }
                attributes = {
                    SpanAttributeKey.CHAT_USAGE: usage_attribute(usage),
                    SpanAttributeKey.LLM_COST: {"total_cost": cost},
                    SpanAttributeKey.MODEL: model,
                    "latency_s": event.get("latency_s"),
                    "reasoning": event.get("reasoning"),
                }
                span = self.span(
                    root,
                    f"turn {turn}",
                    SpanType.CHAT_MODEL,
                    {"messages": pending},
                    attributes,
                    ns(event["ts"] - float(event.get("latency_s") or 0.0)),
                )
                span.end(
                    outputs={
                        "choices": [{"index": 0, "message": message, "finish_reason": event.get("finish_reason")}]
                    },
                    end_time_ns=ns(event["ts"]),
                )
                pending = []
            elif kind == "tool":
                pending.append(as_message(event))
                content = event.get("content") or ""
                span = self.span(
                    root,
                    str(event.get("name")),
                    SpanType.TOOL,
                    tool_input(event.get("arguments")),
                    {"tool_call_id": event.get("tool_call_id")},
                    ns(previous_ts),
                )
                span.end(
                    outputs={"result": content},
                    end_time_ns=ns(event["ts"]),
                    status="ERROR" if content.startswith("error:") else "OK",
                )
            elif kind == "stop":
                outputs = {
                    k: event.get(k) for k in ("reason", "turns", "usage", "cost_usd", "wall_s", "harness") if k in event
                }
            elif kind in ("retry", "compaction", "error"):
                # a concrete dataclass, though mlflow's stubs inherit an abstract from_proto
                event_span = SpanEvent(kind, timestamp=ns(event["ts"]), attributes={"message": system_line(event)})  # type: ignore[abstract]
                root.add_event(event_span)
            previous_ts = event["ts"]
        root.end(outputs=outputs, end_time_ns=ns(events[-1]["ts"]))  # the exporter stores the trace here
        error, self.exporter.error = self.exporter.error, None
        if error is not None:
            raise error
        return root.trace_id

    def span(
        self,
        parent: Any,
        name: str,
        span_type: str,
        inputs: Any,
        attributes: Dict[str, Any],
        start_ns: int,
        experiment_id: Optional[str] = None,
    ) -> Any:
        """A live MLflow span: under ``parent``, or the root of a new trace of ``experiment_id``."""
        from mlflow.tracing.constant import SpanAttributeKey
        from mlflow.tracing.utils import encode_span_id
        from opentelemetry import trace

        if parent is None:
            otel = self.tracer.start_span(
                name, start_time=start_ns, attributes={SpanAttributeKey.EXPERIMENT_ID: json.dumps(experiment_id)}
            )
            trace_id = InMemoryTraceManager.get_instance().get_mlflow_trace_id_from_otel_id(
                otel.get_span_context().trace_id
            )
        else:
            otel = self.tracer.start_span(name, context=trace.set_span_in_context(parent._span), start_time=start_ns)
            trace_id = parent.trace_id
        span = InMemoryTraceManager.get_instance().get_span_from_id(
            trace_id, encode_span_id(otel.get_span_context().span_id)
        )  # the processor made it
        span.set_span_type(span_type)
        span.set_inputs(inputs)
        span.set_attributes(attributes)
        return span


class StoreExporter(SpanExporter):
    """Stores each finished trace (its root span ended): its info in one request, then its spans, as MLflow stores
    either. ``artifact``: one ``traces.json`` in the trace's artifact folder, which MLflow's UI and clients read
    (1.4-2.6 CPU-ms a cell on SQLite); ``store``: rows of the tracking store, one request that MLflow's trace search
    can filter by span (8.9-11.9 CPU-ms a cell on SQLite; docs/benchmarks.md, "Sweeps at scale"). What the store
    raised is kept in ``error`` (OpenTelemetry's processor would only log it) for the writer to raise."""

    def __init__(self, client: Any, spans: str):
        self.client = client
        self.spans = spans
        self.error: Optional[Exception] = None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from mlflow.tracing.constant import TraceMetadataKey
        from mlflow.tracing.utils import add_size_stats_to_trace_metadata, aggregate_cost_from_spans

        for span in spans:
            if span.parent is None:
                trace = InMemoryTraceManager.get_instance().pop_trace(span.context.trace_id).trace
                add_size_stats_to_trace_metadata(trace)
                if self.spans == "artifact":  # the store sums the spans' dollars onto the trace only from its own rows
                    cost = aggregate_cost_from_spans(trace.data.spans)
                    if cost:
                        trace.info.request_metadata[TraceMetadataKey.COST] = json.dumps(cost)
                try:
                    info = self.client.start_trace(trace.info)
                    if self.spans == "store":
                        self.client.log_spans(info.experiment_id, trace.data.spans)
                    else:
                        self.upload(info, trace.data)
                except Exception as error:  # noqa: BLE001 (raised again by TraceWriter.log)
                    self.error = error
                    return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def upload(self, info: Any, data: Any) -> None:
        """The spans as ``traces.json`` of the trace's artifact folder (MLflow's form, which its UI reads through the
        server and its clients through :meth:`TracingClient.get_trace`)."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
        from mlflow.tracing.utils import TraceJSONEncoder
        from mlflow.tracing.utils.artifact_utils import get_artifact_uri_for_trace

        repo = get_artifact_repository(get_artifact_uri_for_trace(info), tracking_uri=self.client.tracking_uri)
        repo.upload_trace_data(json.dumps(data.to_dict(), cls=TraceJSONEncoder, ensure_ascii=False))
