"""The report stage: boards per (track, GPU) from the tracking store (rendered by :mod:`kbsweep.reporting.render`).

A board per sweep and (track, GPU) ranks entrants, a model driven by a harness (``builtin``: kbsweep's own loop),
by the mean over the full deck and over repeats of their valid scores (a failure, a missing cell or an
audit-flagged pass counts 0). Only a pass with a clean verdict (or a human's override_clean) is valid; flagged
passes are listed with their verdict but never ranked. Repeats give a mean with a 95% confidence interval (Student
t over per-repeat deck means) and pass@1 / pass@k (the unbiased estimator over the repeats). Cells whose latest
record is an infrastructure outcome are never scored: each entrant shows their count (``infra``), and an entrant,
or a whole sweep, with nothing else is listed unranked (``unscored``; a board with no ranked entrant has nothing
scored). A board graded on a CPU says so (``cpu``): its timings are plumbing checks, not GPU performance.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

from kbsweep.outcomes import INFRA_OUTCOMES, Outcome
from kbsweep.reporting.figures import roofline_of

VALID_VERDICTS = ("clean", "override_clean")
FAST_P = (0.0, 1.0, 1.5, 2.0)  # KernelBench's fast_p thresholds
LEVEL_FAST_P = (1.0, 2.0)  # the board's per-level columns
BUILTIN = "builtin"  # the harness column's name for kbsweep's own loop
INFRA = {outcome.value for outcome in INFRA_OUTCOMES}
Tag = Optional[str]  # a run's tag (problem, track, GPU, model): None where the run lacks it


def is_valid_pass(row: Dict[str, Any]) -> bool:
    return row.get("outcome") == Outcome.PASS.value and row.get("verdict") in VALID_VERDICTS


def is_flagged(row: Dict[str, Any]) -> bool:
    """A result the audit did not clear: shown on the board, never ranked."""
    audited = (Outcome.DISQUALIFIED.value, Outcome.NEEDS_HUMAN.value)
    return row.get("outcome") in audited or (row.get("outcome") == Outcome.PASS.value and not is_valid_pass(row))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c passes (Chen et al. 2021); k is capped at n."""
    k = min(k, n)
    if n == 0:
        return 0.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_ci95(values: List[float]) -> Tuple[float, Optional[float]]:
    """Mean and the half-width of its 95% Student-t interval (None for fewer than two values)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    from scipy.stats import t

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return mean, float(t.ppf(0.975, len(values) - 1)) * sd / math.sqrt(len(values))


def shape_points(metrics: Dict[str, Any], params: Dict[str, str]) -> List[Dict[str, Any]]:
    """Achieved TFLOP/s and GB/s per shape of one run (shapes with both numbers only)."""
    points = []
    for i in range(1000):
        tflops, gbps = metrics.get(f"shape{i}.tflops"), metrics.get(f"shape{i}.gbps")
        if f"shape{i}.ms" not in metrics:
            break
        if tflops and gbps:
            points.append(
                {
                    "shape": params.get(f"shape{i}", str(i)),
                    "tflops": tflops,
                    "gbps": gbps,
                    "intensity": tflops * 1e3 / gbps,
                }
            )
    return points


def model_entry(name: Tag, rows: List[Dict[str, Any]], deck: List[Tag], k: int) -> Dict[str, Any]:
    """One entrant's line on a board (``name``: its :func:`entrant` label); ``k`` for pass@k is the board's
    largest number of tries of one problem."""
    best: Dict[Tag, float] = {}
    best_run: Dict[Tag, str] = {}
    flagged: Dict[Tag, Dict[str, Any]] = {}
    per_repeat: Dict[Tag, Dict[Tag, float]] = defaultdict(dict)  # by repeat
    tries: Dict[Tag, List[bool]] = defaultdict(list)
    for row in rows:
        problem, score = row.get("problem"), row.get("score") or 0.0
        valid = is_valid_pass(row)
        tries[problem].append(valid)
        if valid:
            per_repeat[row.get("repeat")][problem] = score
            if problem not in best or score > best[problem]:
                best[problem], best_run[problem] = score, row["run_id"]
        elif is_flagged(row) and score >= (flagged.get(problem, {}).get("score") or -1.0):
            flagged[problem] = {"score": row.get("score"), "verdict": row.get("verdict"), "run_id": row["run_id"]}
    repeats = sorted({row.get("repeat") for row in rows}, key=str)
    mean, ci = mean_ci95([sum(per_repeat[r].get(p, 0.0) for p in deck) / len(deck) for r in repeats])
    means = {p: sum(per_repeat[r].get(p, 0.0) for r in repeats) / len(repeats) for p in deck}
    passed = sum(1 for row in rows if is_valid_pass(row))
    usd = sum(row.get("cost_usd", 0.0) for row in rows)
    out_tokens = sum(row.get("tokens_output", 0.0) for row in rows)
    return {
        "entrant": name,
        "model": rows[0].get("model"),
        "harness": harness_of(rows[0]),
        "deck_mean": mean,  # over repeats of their deck means: the mean of ``means``
        "deck_ci95": ci,
        "means": means,
        "best": best,
        "best_run": best_run,
        "flagged": {p: f for p, f in flagged.items() if p not in best},
        "cells": len(rows),
        "passed": passed,
        "flagged_cells": sum(1 for row in rows if is_flagged(row)),
        "repeats": len(repeats),
        "pass_at_1": sum(pass_at_k(len(tries[p]), sum(tries[p]), 1) for p in deck) / len(deck),
        "pass_at_k": sum(pass_at_k(len(tries[p]), sum(tries[p]), k) for p in deck) / len(deck),
        "usd": usd,
        "tokens_input": sum(row.get("tokens_input", 0.0) for row in rows),
        "tokens_output": out_tokens,
        "usd_per_pass": usd / passed if passed else None,
        "tokens_output_per_pass": out_tokens / passed if passed else None,
        **held_out_gap(rows),
    }


def held_out_gap(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The mean score over public and over held-out shapes of the valid passes that have both, and the gap
    (public minus held-out: how much of the score holds only on the shapes the agent saw); None without such cells."""
    both = [
        row
        for row in rows
        if is_valid_pass(row) and row.get("score_public") is not None and row.get("score_held_out") is not None
    ]
    public = sum(row["score_public"] for row in both) / len(both) if both else None
    held_out = sum(row["score_held_out"] for row in both) / len(both) if both else None
    return {
        "public_mean": public,
        "held_out_mean": held_out,
        "held_out_gap": public - held_out if public is not None and held_out is not None else None,
        "held_out_cells": len(both),
    }


def harness_of(row: Dict[str, Any]) -> str:
    """Who drove the model: a harness's name, ``builtin`` for kbsweep's own loop (runs logged before harnesses)."""
    return row.get("harness") or BUILTIN


def entrant(row: Dict[str, Any]) -> Tag:
    """Who a board ranks, as one label (plots, trace titles): the model, ``model@harness`` for another harness than
    the built-in loop (the cells' own labels). Tables show the model and its harness in columns of their own."""
    harness = harness_of(row)
    return row.get("model") if harness == BUILTIN else f"{row.get('model')}@{harness}"


def unscored_infra(rows: List[Dict[str, Any]], scored: Set[str]) -> List[Dict[str, Any]]:
    """The latest record of each cell without a scored one (key not in ``scored``) whose run ended in an
    infrastructure outcome: retried by the sweep's next run, never scored."""
    latest: Dict[str, Dict[str, Any]] = {}
    for row in rows:
        key = row.get("cell_key") or row["run_id"]
        if (
            key not in scored
            and row.get("outcome") in INFRA
            and (key not in latest or row["start_time"] > latest[key]["start_time"])
        ):
            latest[key] = row
    return sorted(latest.values(), key=lambda r: r["start_time"])


def build_boards(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Boards per (sweep, track, GPU) from ``mlflow_store.runs_frame`` rows (the latest finished run per cell
    counts; cells left in an infrastructure outcome are counted per entrant, never scored)."""
    from kbsweep.tracking.mlflow_store import latest_per_cell

    sweeps: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for row in rows:
        sweeps[row["experiment"]].append(row)
    grouped: Dict[Tuple[str, Tag, Tag], List[Dict[str, Any]]] = defaultdict(list)
    infra: Dict[Tuple[str, Tag, Tag], List[Dict[str, Any]]] = defaultdict(list)
    for sweep, sweep_rows in sweeps.items():  # the latest record of a cell within its sweep: each sweep its board
        scored = latest_per_cell(sweep_rows)
        for row in scored:
            grouped[(sweep, row.get("track"), row.get("gpu"))].append(row)
        for row in unscored_infra(sweep_rows, {r.get("cell_key") or r["run_id"] for r in scored}):
            infra[(sweep, row.get("track"), row.get("gpu"))].append(row)
    boards = []
    for where in sorted(set(grouped) | set(infra), key=lambda item: tuple(map(str, item))):
        board = scored_board(where, grouped[where])
        left = group_by(infra[where], entrant)
        for entry in board["models"]:
            entry["infra"] = len(left.pop(entry["entrant"], []))
        board["unscored"] = [
            {
                "entrant": name,
                "model": cells[0].get("model"),
                "harness": harness_of(cells[0]),
                "infra": len(cells),
                "outcomes": dict(Counter(cell.get("outcome") for cell in cells)),
            }
            for name, cells in sorted(left.items())
        ]
        board["cpu"] = any(
            (row.get("params") or {}).get("gpu.device") == "cpu" for row in grouped[where] + infra[where]
        )
        board["experiments"] = sorted({row["experiment"] for row in grouped[where] + infra[where]})
        board["setups"] = setup_differences(grouped[where] + infra[where])
        boards.append(board)
    return boards


def setup_differences(rows: List[Dict[str, Any]]) -> List[Dict[str, str]]:
    """Per harness of ``rows`` other than the built-in loop, each ``setup.*`` param (tools, shell, instructions, how
    it ends, budgets: ``kbsweep.tracking.tracker.setup_params``) whose value differs from the built-in loop's on the
    same track; the loop's own are built here when no cell of it ran. Runs logged without a setup give none."""
    from kbsweep.harness import runner_for

    setups: Dict[str, Dict[str, str]] = {}
    for row in rows:
        params = row.get("params") or {}
        setup = {key[len("setup.") :]: value for key, value in params.items() if key.startswith("setup.")}
        if setup:
            setups.setdefault(harness_of(row), setup)
    out = []
    for harness, setup in sorted(setups.items()):
        if harness == BUILTIN:
            continue
        allow_shell = setup.get("shell") != "none"
        builtin: Mapping[str, Optional[str]] = setups.get(BUILTIN) or {
            **runner_for({"name": BUILTIN, "runner": BUILTIN}).setup(allow_shell),
            "budgets": setup.get("budgets"),
        }
        out += [
            {"harness": harness, "setting": key, "builtin": str(builtin.get(key)), "value": value}
            for key, value in sorted(setup.items())
            if builtin.get(key) != value
        ]
    return out


def scored_board(where: Tuple[str, Tag, Tag], board_rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The board of ``where`` (sweep, track, GPU) over its scored rows (none: nothing ranked)."""
    sweep, track, gpu = where
    levels = {row.get("problem"): level_of(row) for row in board_rows}
    deck = sorted(levels, key=lambda p: (natural(levels[p]), natural(p)))  # by level, then KernelBench's numbers
    by_model = group_by(board_rows, entrant)
    k = max(Counter((entrant(row), row.get("problem")) for row in board_rows).values(), default=0)
    models = sorted(
        (model_entry(m, r, deck, k) for m, r in by_model.items()),
        key=lambda e: (-e["deck_mean"], -e["passed"], e["entrant"]),
    )
    for rank, entry in enumerate(models, 1):
        entry["rank"] = rank
    shapes: Dict[Tag, Dict[Tag, List[Dict[str, Any]]]] = {problem: defaultdict(list) for problem in deck}
    for row in board_rows:  # every valid run's shapes: each repeat's points
        if is_valid_pass(row):
            shapes[row.get("problem")][entrant(row)] += shape_points(row, row["params"])
    rooflines = {row.get("problem"): roofline_of(row["params"]) for row in board_rows}
    cells = [
        {
            "entrant": entrant(row),
            "model": row.get("model"),
            "harness": harness_of(row),
            "problem": row.get("problem"),
            "repeat": row.get("repeat"),
            "outcome": row.get("outcome"),
            "verdict": row.get("verdict"),
            "valid": is_valid_pass(row),
            "flagged": is_flagged(row),
            "score": row.get("score"),
            "score_public": row.get("score_public"),
            "score_held_out": row.get("score_held_out"),
            "usd": row.get("cost_usd"),
            "tokens_output": row.get("tokens_output"),
            "run_id": row["run_id"],
            "experiment": row["experiment"],
            "level": level_of(row),
            "speedup_eager": row.get("speedup_eager"),
        }
        for row in sorted(board_rows, key=lambda r: (str(entrant(r)), str(r.get("problem")), str(r.get("repeat"))))
    ]
    board: Dict[str, Any] = {
        "sweep": sweep,
        "track": track,
        "gpu": gpu,
        "deck": deck,
        "k": k,
        "models": models,
        "cells": cells,
        "shapes": shapes,
        "rooflines": rooflines,
        "kernelbench": kernelbench_metrics(board_rows),
    }
    board["levels"] = level_aggregates(board)
    return board


def natural(name: Optional[str]) -> List[Any]:
    """Sort key: digit runs as numbers (kernelbench/2_x before kernelbench/10_y, as KernelBench numbers them)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(name))]


def level_aggregates(board: Dict[str, Any]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """Per entrant and level (the problems folder's name): cells, valid passes, fast_1 and fast_2 (the share of
    the level's cells with a valid pass faster than eager by more than 1x, 2x) and the geometric mean speedup
    over eager of the valid passes; kbsweep's verdict throughout (the KernelBench metrics table has KernelBench's)."""
    from kbsweep.score.roofline import geomean

    out: Dict[str, Dict[str, Dict[str, Any]]] = defaultdict(dict)
    for (model, level), cells in sorted(group_by(board["cells"], lambda c: (c["entrant"], c["level"])).items()):
        speedups = [c["speedup_eager"] or 0.0 for c in cells if c["valid"]]
        out[model][level] = {
            "cells": len(cells),
            "passed": len(speedups),
            **{f"fast_{p:g}": sum(1 for x in speedups if x > p) / len(cells) for p in LEVEL_FAST_P},
            "geomean": geomean([x for x in speedups if x > 0]) if any(x > 0 for x in speedups) else None,
        }
    return dict(out)


def group_by(items: List[Dict[str, Any]], key) -> Dict[Any, List[Dict[str, Any]]]:
    groups: Dict[Any, List[Dict[str, Any]]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return groups


def level_of(row: Dict[str, Any]) -> str:
    """A KernelBench cell's level: the name of the folder its problems came from (level1, level2, ...)."""
    return Path(str((row.get("params") or {}).get("track.problems_dir", "?"))).name


def kernelbench_metrics(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """KernelBench's metrics per entrant and level, its verdict deciding correctness: fast_p (the share of all cells
    correct and faster than eager by more than p; n counts every cell) and the geometric mean speedup over eager
    and torch.compile of the correct, timed cells. A cell KernelBench calls correct that kbsweep's checks failed is
    timed for these metrics alone (``kernelbench_speedup_*``; kbsweep's score stays failed)."""
    from kbsweep.score.roofline import geomean

    groups: Dict[Tuple[Tag, str], List[Dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row.get("verdict.kernelbench") is not None:
            groups[(entrant(row), level_of(row))].append(row)
    table = []
    for (model, level), cells in sorted(groups.items()):
        correct = [r for r in cells if r["verdict.kernelbench"] == "correct"]
        entry = {
            "entrant": model,
            "model": cells[0].get("model"),
            "harness": harness_of(cells[0]),
            "level": level,
            "cells": len(cells),
            "correct": len(correct),
            "kbsweep_passed": sum(1 for r in cells if r.get("verdict.kbsweep") == Outcome.PASS.value),
        }
        for p in FAST_P:
            entry[f"fast_{p:g}"] = sum(
                1 for r in correct if p == 0.0 or (kernelbench_speedup(r, "eager") or 0.0) > p
            ) / len(cells)
        for name in ("eager", "compile"):
            speedups = [s for s in (kernelbench_speedup(r, name) for r in correct) if s]
            entry[f"geomean_{name}"] = geomean(speedups) if speedups else None
        table.append(entry)
    return table


def kernelbench_speedup(row: Dict[str, Any], name: str) -> Optional[float]:
    """A cell's speedup for KernelBench's metrics (runs logged before ``kernelbench_speedup_*`` existed: kbsweep's)."""
    return row.get(f"kernelbench_speedup_{name}", row.get(f"speedup_{name}"))


def attach_regrades(boards: List[Dict[str, Any]], regrades: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each board's ``regrades``: per run of the board and GPU, the latest finished ``kbsweep regrade`` of its
    solution (``mlflow_store.runs_frame(kind="regrade")`` rows), beside the run's own outcome and score."""
    latest: Dict[Tuple[Tag, Tag], Dict[str, Any]] = {}
    for row in regrades:
        key = (row.get("kbsweep.regrade_of"), row.get("gpu"))
        if row.get("status") == "FINISHED" and (key not in latest or row["start_time"] > latest[key]["start_time"]):
            latest[key] = row
    for board in boards:
        runs = {c["run_id"]: c for c in board["cells"]}
        board["regrades"] = [
            {
                "model": runs[of]["model"],
                "harness": runs[of]["harness"],
                "problem": runs[of]["problem"],
                "repeat": runs[of]["repeat"],
                "run_id": of,
                "old_gpu": board["gpu"],
                "old_outcome": runs[of]["outcome"],
                "old_score": runs[of]["score"],
                "gpu": gpu,
                "outcome": row.get("outcome"),
                "score": row.get("score"),
                "regrade_run_id": row["run_id"],
            }
            for (of, gpu), row in sorted(latest.items(), key=lambda item: tuple(map(str, item[0])))
            if of in runs
        ]
    return boards
