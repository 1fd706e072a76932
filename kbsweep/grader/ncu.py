"""Nsight Compute's speed of light for ``run_profile`` on a GPU: SM throughput, memory throughput and achieved
occupancy of the top kernels of one call of the candidate on the profiled shape, in a bounded time.

Optional: where ``ncu`` is not on PATH (or the grade is on CPU) it is one line saying so. ncu runs the candidate in
the runner's sandbox (:mod:`kbsweep.grader.runner.ncu_driver`), its figures the candidate process's, unscored.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Sequence

from kbsweep.grader.processes import runner_env
from kbsweep.grader.profile_summary import short
from kbsweep.grader.staging import stage_candidate
from kbsweep.paths import REPO_ROOT
from kbsweep.sandbox.confine import Sandbox, give, is_root, sandbox_uid
from kbsweep.sandbox.watch import head_tail, kill

LIMIT_S = 180.0  # ncu replays each kernel a few dozen times: a bound on the whole run
TOP = 5
OUTPUT_BYTES = 1 << 20  # of ncu's output (its CSV rows: --launch-count bounds them)
METRICS = {  # ncu's metric -> the column shown
    "gpu__time_duration.sum": "ns/launch",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM %",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory %",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy %",
}
BOOT = "import sys; sys.path.append({root!r}); from kbsweep.grader.runner.ncu_driver import main; main(*sys.argv[-3:])"


def speed_of_light(
    request: Any, shape: Dict[str, Any], original: Path, sandbox: Sandbox, env: Dict[str, str], view: Sequence[Path]
) -> List[str]:
    """The lines of Nsight Compute's view of the candidate file ``original`` on ``shape`` under ``request``, or the
    one line saying why there are none. It runs from a folder of its own (the grade's runner has emptied its own)."""
    if request.gpu.device != "cuda":
        return ["ncu: not available (CPU grade)"]
    found = shutil.which("ncu")
    if found is None:
        return ["ncu: not available"]
    ncu = Path(found).resolve()  # its own folder (the launcher script beside its binaries), not a symlink to it
    limit_s = min(LIMIT_S, request.timeout_s / 4)
    with tempfile.TemporaryDirectory(prefix="kbsweep-ncu-") as staged, tempfile.TemporaryFile() as log:
        folder = stage_candidate(original, Path(staged)).parent
        if sandbox.confined and is_root():
            give([folder], sandbox_uid())
        # --clock-control none: the GPU's clocks as the timed grades run them (ncu would lock them to base otherwise)
        command = [
            str(ncu),
            "--csv",
            "--page",
            "raw",
            "--print-units",
            "base",
            "--clock-control",
            "none",
            "--profile-from-start",
            "off",
            "--target-processes",
            "all",
            "--launch-count",
            "50",
            "--metrics",
            ",".join(METRICS),
            sys.executable,
            "-I",
            "-B",
            "-c",
            BOOT.format(root=str(REPO_ROOT)),
            str(folder),
            str(request.problem.grader_reference.resolve()),
            json.dumps(shape),
        ]
        # the candidate prints into ``log`` too: read back bounded, ncu's CSV at its end
        proc = sandbox.popen(
            command,
            cwd=str(folder),
            env=runner_env(env),
            writable=[(folder, str(folder))],
            readonly=[*view, ncu.parent],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            kill(proc)
            return [f"ncu: stopped after {limit_s:.0f} s"]
        out = head_tail(log, OUTPUT_BYTES)
    rows = parse(out)
    if not rows:
        return [f"ncu: no kernel profiled (exit {proc.returncode}): {why(out)}"]
    return table(rows)


def why(out: str) -> str:
    """The last line the profiled program printed (a traceback's exception) and ncu's last own line."""
    said = [line.strip() for line in out.splitlines() if line.strip()]
    program = [line for line in said if not line.startswith("==")]
    own = [line for line in said if line.startswith("==")]
    return "; ".join(line[:200] for line in (program[-1:] + own[-1:])) or "no output"


def parse(out: str) -> List[Dict[str, str]]:
    """ncu's raw CSV page: a header, a row of units, a row per kernel (its own ``==PROF==`` lines left out)."""
    lines = [line for line in out.splitlines() if line.startswith('"')]
    records = list(csv.DictReader(lines))
    return [r for r in records[1:] if r.get("Kernel Name")]


def table(rows: List[Dict[str, str]]) -> List[str]:
    """Per kernel name, the means of its launches; the :data:`TOP` of most time."""

    def number(value: str) -> float:
        try:
            return float(str(value).replace(",", ""))
        except ValueError:
            return 0.0

    by_name: Dict[str, List[List[float]]] = {}
    for row in rows:
        by_name.setdefault(row["Kernel Name"], []).append([number(row.get(metric, "")) for metric in METRICS])
    means = {name: [sum(col) / len(col) for col in zip(*values)] for name, values in by_name.items()}
    ranked = sorted(means.items(), key=lambda item: -item[1][0] * len(by_name[item[0]]))[:TOP]
    lines = [
        f"ncu (Nsight Compute, one call, the candidate's process): {len(rows)} launches, top {len(ranked)} kernels",
        "  " + " ".join(f"{label:>11}" for label in METRICS.values()) + "  kernel",
    ]
    for name, values in ranked:
        lines.append("  " + " ".join(f"{value:11.4g}" for value in values) + f"  {short(name)}")
    return lines
