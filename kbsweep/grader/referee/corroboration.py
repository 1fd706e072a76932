"""The runner's own figures set against the referee's clock, batch by batch: evidence, never the score.

Where the runner reported more time than the referee's clock saw (the referee's figure with its slack for jitter
added, under :data:`FLOOR` times the runner's), its calls did work where the clock does not run: a
``time_disagreement`` finding. Where it reported less, nothing is found: the score is the clock's, and the warm
calls follow the clock too, so an under-report gains nothing, while honest batches read far above their runner's
figure (per batch up to 18.7x on an H100: a 6 us kernel under a batch's fixed cost; docs/grading.md).
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Tuple

# Honest shapes read at least 1.058 on an H100 and 1.026 on CPU (docs/grading.md)
FLOOR = 0.8


def slack_ms(mode: str, null_ms: float, calls: int) -> float:
    """What the referee's clock may read above the calls' own time in an honest batch (its jitter, the harness's
    steps around each call there): the corroboration's allowance, never part of a score."""
    return (0.1 * null_ms + 1.0 + 0.1 * calls) if mode == "host" else (0.05 * null_ms + 0.3 + 0.02 * calls)


def corroborate(shape: Dict[str, Any], ratios: List[tuple]) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
    """(the record, a finding or None) over ``ratios``: per batch the referee's figure, the runner's, the slack (each
    per call), the batch's kind and its (input copies, wall, runner's loop, CPU of the runner's other threads, and
    :func:`~kbsweep.grader.referee.timing_stage.split_ms`'s four parts) in ms."""
    over = statistics.median(r / max(c, 1e-9) for r, c, *_ in ratios)
    finding = None
    if statistics.median((r + slack) / max(c, 1e-9) for r, c, slack, *_ in ratios) < FLOOR:
        finding = {
            "kind": "time_disagreement",
            "shape": shape,
            "detail": f"{shape}: the candidate's process reported {1 / over:.2f}x the time the referee's clock saw",
        }
    record = {
        "wall_over_claimed": over,
        "floor": FLOOR,
        "runner_median_ms": statistics.median(c for _, c, *_ in ratios),
        "batches": [
            [kind, round(r, 6), round(c, 6), round(slack, 6), *(None if v is None else round(v, 4) for v in walls)]
            for r, c, slack, kind, walls in ratios
        ],
    }
    return record, finding
