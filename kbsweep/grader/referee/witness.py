"""What the referee reads from the runner's records of each call: the work of the calls that count against the
problem's, whether the candidate launched kernels of its own, and whether the records agree with the calls the
referee made itself.

Everything here runs in the referee on numbers the runner sent (docs/grading.md, threat model): evidence, never a
verdict's only ground. The calls that count are the timed ones (event-timed and captured for a replay), or every
compared call of the correctness stage when nothing was timed; a group is one stage's calls on one shape. The score
sums over every timed call, so the evidence reads every call too: the work figures are the most any one call did
(past each instance's first call: a one-time preparation, dequantising its weights, is not the call's work; a timed
instance's first call is a warm-up), and every counted call must have launched the candidate's kernels. A path
taken in a few calls of a batch moves the score, and it moves these figures as much as a path taken in all.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from kbsweep.grader.shared.profiling import TOKEN_CHARS, group_of

TIMED, COMPARED = "/timing/", "/correctness/"  # the groups whose calls count (their tags start so)
# a record: bytes torch ops that compute moved, their FLOPs, own launches, graph replays, bytes crossing to host arrays
BYTES, FLOPS, LAUNCHES, REPLAYS, HOST = range(5)


def grouped(
    records: Any, groups: Dict[str, str], instances: Dict[str, Any]
) -> Dict[str, List[Tuple[Any, List[float]]]]:
    """The runner's per-call records (command id, or id and the runner's own tag -> records, in call order) by group,
    each with the instance (``instances``: command id -> the model it called) it ran on; records of ids no command
    had, and malformed ones, are dropped."""
    out: Dict[str, List[Tuple[Any, List[float]]]] = {}
    for key, rows in (records if isinstance(records, dict) else {}).items():
        group = group_of(str(key), groups)
        if group is not None and isinstance(rows, list):
            instance = instances.get(str(key)[:TOKEN_CHARS])
            out.setdefault(group, []).extend((instance, [float(v) for v in row]) for row in rows if well_formed(row))
    return out


def well_formed(row: Any) -> bool:
    return isinstance(row, list) and len(row) == 5 and all(isinstance(v, (int, float)) for v in row)


def counted_groups(by_group: Dict[str, Any]) -> Tuple[str, List[str]]:
    """(basis, groups): the timed groups when any call was timed, else the compared ones."""
    for basis, prefix in (("timed", TIMED), ("compared", COMPARED)):
        chosen = sorted(group for group, rows in by_group.items() if group.startswith(prefix) and rows)
        if chosen:
            return basis, chosen
    return "none", []


def call_work(
    by_group: Dict[str, List[Tuple[Any, List[float]]]],
    range_flops: Any,
    problem: Callable[[str], Tuple[float, float]],
    range_bytes: Any = None,
) -> Dict[str, Any]:
    """The counted groups' calls against the problem's work per call (``problem``: group -> its shape's FLOPs and
    bytes). Past each instance's first call (its one-time preparation): the largest share of one call's FLOPs (the
    recorder's, or the profiler's, which sees ops run with dispatch disabled too) and of its bytes read and written by
    torch ops that compute (the recorder's, or the bytes the profiler saw such ops read: ``range_bytes``), over every
    call. Over every call, the first included: the most bytes one call moved between torch and host arrays, the
    candidate's own launches (a graph replay's are those its capture launched), and the groups with a call that
    launched none (a graph of library ops is not the candidate's kernel)."""
    basis, chosen = counted_groups(by_group)
    flops_seen = range_flops if isinstance(range_flops, dict) else {}
    bytes_seen = range_bytes if isinstance(range_bytes, dict) else {}
    calls = own_launches = idle_calls = 0
    flop_share = byte_share = host_bytes = 0.0
    idle_groups: List[str] = []
    for group in chosen:
        rows = by_group[group]
        problem_flops, problem_bytes = problem(group)
        seen = set()
        for (instance, row), flops, moved in zip(
            rows, aligned(flops_seen.get(group), len(rows)), aligned(bytes_seen.get(group), len(rows))
        ):
            if instance in seen:
                flop_share = max(flop_share, max(row[FLOPS], flops) / problem_flops if problem_flops else 0.0)
                byte_share = max(byte_share, max(row[BYTES], moved) / problem_bytes if problem_bytes else 0.0)
            seen.add(instance)
        calls += len(rows)
        host_bytes = max([host_bytes] + [row[HOST] for _, row in rows])
        own_launches += int(sum(row[LAUNCHES] for _, row in rows))
        idle = sum(1 for _, row in rows if row[LAUNCHES] <= 0)
        if idle:
            idle_groups.append(group)
            idle_calls += idle
    return {
        "basis": basis,
        "calls": calls,
        "flop_share": flop_share,
        "byte_share": byte_share,
        "host_bytes": host_bytes,
        "own_launches": own_launches,
        "idle_groups": idle_groups,
        "idle_calls": idle_calls,
    }


def aligned(values: Any, count: int) -> List[float]:
    """A profiled figure per call range of a group, as many as its call records (0 where it has fewer)."""
    figures = (
        [float(v) if isinstance(v, (int, float)) else 0.0 for v in values or []] if isinstance(values, list) else []
    )
    return (figures + [0.0] * count)[:count]


def mismatches(
    counted: Dict[str, int], by_group: Dict[str, List[Any]], profiled: Optional[Dict[str, Any]]
) -> List[str]:
    """Where the runner's records disagree with the calls this process made (``counted``: group -> calls): a group
    with fewer recorded calls or call ranges than that (a harness record suppressed; the runner may make calls
    the referee does not count, a warm-up's), records and ranges that disagree, and forged ranges."""
    out = []
    recorded = {group: len(rows) for group, rows in by_group.items()}
    short = sorted(group for group, n in counted.items() if n and recorded.get(group, 0) < n)
    if short:
        out.append(f"calls recorded by the runner fewer than made in {', '.join(short)}")
    if profiled:
        ranges = profiled.get("ranges")
        ranges = ranges if isinstance(ranges, dict) else {}
        unranged = sorted(group for group, n in counted.items() if n and int(ranges.get(group) or 0) < n)
        if unranged:
            out.append(f"call ranges fewer than calls made in {', '.join(unranged)}")
        if {g: n for g, n in ranges.items() if n} != {g: n for g, n in recorded.items() if n}:
            out.append("the runner's call records and its profiler's call ranges disagree")
        if profiled.get("forged_ranges"):
            out.append(
                f"{int(profiled['forged_ranges'])} call ranges no command of this grade opened, or inside another"
            )
    return out
