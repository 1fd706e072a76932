"""A profile grade's view of the candidate's timed calls (``mode: profile``): from the runner's profiler session,
each GPU kernel's or (on CPU) each outermost torch op's calls and time, and launches per call.

The numbers come from the candidate's process (docs/grading.md, threat model), so they are read as untrusted
input: bounded, typed, never a verdict's ground and never a score. Only names the candidate's code gave (its
kernels, torch's ops) leave here: the groups, command ids and stages stay in the referee.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Tuple

from kbsweep.grader.referee.witness import LAUNCHES

MOST = 100  # rows kept of either table


def rows(table: Any, calls_of: Any) -> List[Tuple[str, int, float]]:
    """(name, calls, total ms) per entry of ``table`` (name -> its record), ``calls_of`` reading the calls and ns
    of a record; most time first."""
    out = []
    for name, record in list((table if isinstance(table, dict) else {}).items())[:500]:
        count, ns = calls_of(record)
        if isinstance(count, (int, float)) and isinstance(ns, (int, float)) and ns >= 0:
            out.append((str(name)[:200], int(count), float(ns) / 1e6))
    return sorted(out, key=lambda row: -row[2])[:MOST]


def profile_view(
    profiled: Dict[str, Any], group: str, calls: int, work_rows: List[Any], device_type: str
) -> Optional[Dict[str, Any]]:
    """The view of ``group`` (``calls`` calls counted by the referee): on GPUs its kernels (from the group's kernel
    profile), on CPU its ops (from its host times); launches of the median call (GPU kernels, or the candidate's own
    launches from its per-call records ``work_rows``). Means are over the call ranges the session holds of the
    group (the batches' shaping calls too, which the referee does not count). None when the session holds nothing
    of the group."""

    def mapping(value: Any) -> Dict[str, Any]:
        return value if isinstance(value, dict) else {}

    counted = max(int(calls), 1)
    ranges = mapping(profiled.get("ranges")).get(group)
    own = [row[LAUNCHES] for _, row in work_rows]
    view: Dict[str, Any] = {
        "calls": ranges if isinstance(ranges, int) and 0 < ranges < 1 << 31 else counted,
        "own_launches_per_call": statistics.median(own) if own else None,
    }
    if device_type == "cuda":
        profile = mapping(mapping(profiled.get("profiles")).get(group))
        if not profile:
            return None
        per_call = {
            name: count for name, count in mapping(profile.get("kernels")).items() if isinstance(count, (int, float))
        }
        view["kernels"] = [
            (name, round(per_call.get(name, 0) * counted), ms)
            for name, _, ms in rows(profile.get("kernel_ns"), lambda ns: (0, ns))
        ]
        launches = profile.get("median_launches")
        view["launches_per_call"] = float(launches) if isinstance(launches, (int, float)) else None
        return view
    times = mapping(mapping(profiled.get("op_times")).get(group))
    if not times:
        return None
    range_ns = times.get("range_ns")
    view["range_ms"] = float(range_ns) / 1e6 if isinstance(range_ns, (int, float)) else 0.0
    view["ops"] = rows(
        times.get("ops"),
        lambda record: tuple(record) if isinstance(record, list) and len(record) == 2 else (None, None),
    )
    return view
