"""Dynamic layer: findings from the grading process's own evidence (recorded by the worker and
:mod:`kbsweep.grader.runner.runtime`): ghost replays, the aten trace of a probe call, runtime events, threads, global
flags, file hashes and, on GPUs, profiled kernel names, streams and the persisting-L2 limit."""

from __future__ import annotations

import re
from typing import Any, Dict, List

from kbsweep.audit.kinds import HUMAN, KINDS, Finding, finding
from kbsweep.audit.static_rules import HEAVY, OTHER_RUNS, Forbidden
from kbsweep.outcomes import Outcome

LIBRARY_KERNELS = [
    ("gemm", re.compile(r"gemm|gemv|xmma|cutlass|nvjet|cublas", re.I)),
    ("attention", re.compile(r"flash|fmha|attention", re.I)),
    ("select", re.compile(r"radix|sort|topk|bitonic|cub::", re.I)),
    ("softmax", re.compile(r"softmax", re.I)),
    ("conv", re.compile(r"cudnn|conv", re.I)),
    ("nccl", re.compile(r"nccl", re.I)),
]
TOOLCHAIN_MODULES = ("torch", "triton", "time", "kbsweep", "builtins", "numpy")
# Library work in one counted call, as a share of the problem's work per call: an honest kernel's torch ops are glue
# (copies, casts, pads, allocations), which count for nothing, so its share is ~0 (the legit cases and the bundled
# solutions on their smoke shapes: at most 0.006; a per-column vector op on a 33-row shape: 0.044). Library work under
# these shares is at most that share of a call's work.
LIBRARY_FLOP_SHARE = 0.1
LIBRARY_BYTE_SHARE = 0.1
LEGACY_SHARES = (
    0.1,
    1.0,
)  # a grade before per-call records: totals over every call, against one call's FLOPs and bytes
HOST_BYTES = (
    1024  # a call's data through host arrays: room for a host-side list of lengths, never the problem's tensors
)
KNOWN_NAMESPACES = ("aten", "prims", "c10d", "_c10d_functional", "profiler")  # collectives: the multi track's gates


def findings(
    grade: Dict[str, Any], forbidden: Forbidden, own_kernels: List[str], compute_rules: bool = True
) -> List[Finding]:
    """Every dynamic finding one grade's evidence supports (``compute_rules``: the problem scores the candidate's
    own kernels, so torch compute and outputs that survive stubbed kernels are findings)."""
    evidence = grade.get("evidence") or {}
    out = [
        finding(
            f["kind"],
            "dynamic",
            f.get("detail") or str(f.get("shape") or ""),
            verdict=None if f["kind"] in KINDS else HUMAN,
        )
        for f in grade.get("findings") or []
    ]
    if grade.get("outcome") == Outcome.INCORRECT and grade.get("stage") in ("timing", "audit"):
        out.append(finding("dual_path", "dynamic", grade.get("message") or ""))
    probe = evidence.get("probe")
    if probe:
        out += probe_findings(probe, forbidden, compute_rules)
    elif grade.get("outcome") == Outcome.PASS:
        out.append(
            finding("evidence_missing", "dynamic", "no audit probe in this grade (graded before the probes existed?)")
        )
    out += event_findings(evidence, forbidden)
    for entry in grade.get("timings") or []:
        out += timing_findings(entry, forbidden, own_kernels)
    return out


def probe_findings(probe: Dict[str, Any], forbidden: Forbidden, compute_rules: bool) -> List[Finding]:
    out = probe_ghost_findings(probe["ghost"], probe["aten_ops"]) if compute_rules and probe.get("ghost") else []
    seen = dict(probe.get("profiled_ops") or {})
    seen.update(probe["aten_ops"])  # the recorder's counts where both saw an op; the profiler's alone otherwise
    own = set(probe.get("own_ops") or {}) - set(
        probe["aten_ops"]
    )  # every call of it launched the solution's own kernels
    for name, count in sorted(seen.items()):
        namespace, _, op = name.partition("::")
        if name in own:  # its name is the solution's to choose (a rowwise::softmax of its own is no aten softmax)
            continue
        if namespace not in KNOWN_NAMESPACES:
            out.append(finding("custom_op", "dynamic", f"{name} x{count}"))
        elif forbidden.op(op):
            out.append(finding("forbidden_op", "dynamic", f"{name} x{count} (forbidden: {forbidden.op(op)})"))
        elif compute_rules and op.lower() in HEAVY:
            out.append(finding("torch_op", "dynamic", f"{name} x{count}"))
    share, moved, host = work_shares(probe)
    flop_share, byte_share = (LIBRARY_FLOP_SHARE, LIBRARY_BYTE_SHARE) if probe.get("work") else LEGACY_SHARES
    if compute_rules and share >= flop_share:
        out.append(
            finding("library_compute", "dynamic", f"torch ops did {share:.0%} of the problem's FLOPs in one call")
        )
    if compute_rules and moved >= byte_share:
        out.append(
            finding(
                "library_compute",
                "dynamic",
                f"torch ops that compute moved {moved:.2f}x the problem's bytes in one call",
            )
        )
    if compute_rules and host >= HOST_BYTES:
        out.append(
            finding(
                "library_compute",
                "dynamic",
                f"a counted call moved {host:.0f} bytes between torch and host arrays (numpy, DLPack)",
            )
        )
    if probe.get("persisting_l2_limit"):
        out.append(finding("persisting_l2", "dynamic", f"persisting-L2 limit {probe['persisting_l2_limit']} bytes"))
    return out


def work_shares(probe: Dict[str, Any]) -> tuple:
    """(FLOP share, byte share, host bytes) of the calls that count: the most one call did (``work``: grades since
    per-call records; before every call was read, the median call's); an older grade's totals over every call,
    without host bytes."""
    work = probe.get("work")
    if work:
        return work["flop_share"], work["byte_share"], work["host_bytes"]
    share = probe["torch_flops"] / probe["problem_flops"] if probe.get("problem_flops") else 0.0
    return share, probe.get("torch_bytes", 0) / probe["problem_bytes"] if probe.get("problem_bytes") else 0.0, 0.0


def probe_ghost_findings(ghost: Dict[str, Any], aten_ops: Dict[str, int]) -> List[Finding]:
    """Ghost replays (absent for multi-rank grades): an output that survives its kernels being stubbed."""
    out = []
    same, fresh = ghost["same_instance"], ghost["fresh_instance"]
    # kernels behind a custom dispatcher op (TORCH_LIBRARY) cannot be stubbed: then the replay cannot tell
    doubt = HUMAN if any(name.split("::")[0] not in KNOWN_NAMESPACES for name in aten_ops) else None
    if not fresh["changed"]:
        out.append(
            finding(
                "ghost_unchanged",
                "dynamic",
                f"fresh instance, {fresh['stubbed']} launches stubbed, output identical",
                verdict=doubt,
            )
        )
    if not same["graph_replays"] and (not same["changed"] or (same["aliases_previous"] and not same["stubbed"])):
        detail = f"same instance, {same['stubbed']} launches stubbed, no graph replay, output served"
        out.append(finding("instance_state", "dynamic", detail, verdict=doubt))
    return out


def event_findings(evidence: Dict[str, Any], forbidden: Forbidden) -> List[Finding]:
    out = []
    for event in evidence.get("runtime_events") or []:
        kind, detail = event["kind"], f"{event['detail']} at {event['where']} ({event['stage']})"
        if kind == "import":
            module = event["detail"]
            if forbidden.name(module):
                out.append(finding("forbidden_name", "dynamic", f"imported {detail}"))
            elif module.split(".")[0] in ("reference", "kbsweep", "kbsweep_reference"):
                out.append(finding("reference_use", "dynamic", f"imported {detail}"))
            continue
        if kind == "class_patch" and not event["detail"].startswith(TOOLCHAIN_MODULES):
            out.append(finding(kind, "dynamic", detail, verdict=HUMAN))
            continue
        out.append(finding(kind, "dynamic", detail))
        if kind in ("file_access", "dir_listing") and OTHER_RUNS.search(event["detail"]):
            out.append(finding("other_runs", "dynamic", detail))
    for thread in evidence.get("threads") or []:
        kind = "thread_outlived_call" if thread["outlived_call"] else "thread"
        out.append(finding(kind, "dynamic", f"started at {thread['where']} ({thread['stage']})"))
    for name, (before, after) in (evidence.get("global_flags") or {}).items():
        out.append(finding("global_flag_changed", "dynamic", f"{name}: {before} -> {after}"))
    if evidence.get("files_modified"):
        out.append(finding("files_modified", "dynamic", ", ".join(evidence["files_modified"])))
    return out


def timing_findings(entry: Dict[str, Any], forbidden: Forbidden, own_kernels: List[str]) -> List[Finding]:
    out, shape = [], entry.get("shape")
    profile = entry.get("profile") or {}
    if len(profile.get("streams") or []) > 1:  # evidence only: the referee's clock spans a device-wide sync, and every
        # output slot is read for its poison right after, so work left running on another stream is time or a failure
        # (a graph replay's kernels report the stream they were captured on: honest replays read two streams)
        out.append(Finding("side_stream", "dynamic", None, f"{shape}: kernels on streams {profile['streams']}", {}))
    for name in profile.get("kernels") or {}:
        if any(own in name for own in own_kernels):
            continue
        family = next((f for f, pattern in LIBRARY_KERNELS if pattern.search(name)), None)
        if family in forbidden.families:
            out.append(finding("forbidden_kernel", "dynamic", f"{shape}: {name[:120]} ({family})"))
        elif family:
            out.append(finding("library_kernel", "dynamic", f"{shape}: {name[:120]} ({family})"))
    return out
