"""What a sweep costs the orchestrator at 100, 1 000 and 10 000 cells, with cells that cost nothing: the `instant`
model on the `instant` track (conf/model/instant.yaml, conf/track/instant.yaml: it reads the reference and submits
no solution, so no cell grades), through the ordinary CLI, launcher and tracking. Per size N (N/2 repeats of the
track's two problems), on an empty outputs folder:

    plan          kbsweep plan -m ... "repeat=range(0,N/2)"
    run_half      kbsweep -m ... "repeat=range(0,N/4)"    the first N/2 cells, launched and logged
    resume_half   kbsweep -m ... "repeat=range(0,N/2)"    N cells, half finished: the other half run
    resume_all    the same again: every cell finished
    report        kbsweep report, its snapshot removed (the boards read from the store)
    export        kbsweep export

Each command's wall time, its orchestrator's own CPU-seconds and peak memory (the kbsweep process alone: its
workers are not counted), the CPU its tracking calls took (start_cell + finish_cell, timed in that process), the
seconds until it announced the cells and until its last cell was logged, the load average around it, and the
tracking store's size. Peak memory and CPU come from the process itself (getrusage at exit). Over the sizes, per
phase that logs cells, the line through (cells, CPU-s): a cell's CPU apart from the invocation's fixed cost.

    python scripts/scale_cost.py OUTPUTS_ROOT OUT.json [N ...] [--tracking-uri URI]     (default: 100 1000 10000)

``--tracking-uri``: log to that MLflow server (tracking=server) instead of the outputs folder's SQLite file, each
size its own sweep name; the store's size is then not measured. ``--server-pgid``: the server's process group (as
scripts/mlflow_server.sh writes it to DIR/server.pgid), whose CPU-seconds are recorded per phase beside the
orchestrator's: the store's work a server takes off the orchestrator, not gone.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
SWEEP = ["-m", "model=instant", "track=instant", "gpu=cpu", "preflight=off"]
# runs kbsweep's CLI and writes its own usage at exit: CPU-seconds, peak RSS, and the tracking calls' thread CPU
MEASURED = """
import atexit, json, resource, sys, time
from kbsweep.tracking import tracker as tracking
out, sys.argv = sys.argv[1], ["kbsweep", *sys.argv[2:]]
calls = {"cells_logged": 0, "tracking_cpu_s": 0.0}
def timed(name):
    real = getattr(tracking.Tracker, name)
    def call(*args, **kwargs):
        started = time.thread_time()
        try:
            return real(*args, **kwargs)
        finally:
            calls["tracking_cpu_s"] += time.thread_time() - started
            calls["cells_logged"] += name == "finish_cell"
    setattr(tracking.Tracker, name, call)
for name in ("start_cell", "finish_cell"):
    timed(name)
def usage():
    own = resource.getrusage(resource.RUSAGE_SELF)
    calls.update(cpu_s=own.ru_utime + own.ru_stime, peak_rss_mib=own.ru_maxrss / 1024)
    with open(out, "w") as fh:
        json.dump(calls, fh)
atexit.register(usage)
from kbsweep.cli import main
main()
"""


def group_cpu_s(pgid: Optional[int]) -> Optional[float]:
    """CPU-seconds of the running processes of process group ``pgid`` (user and system, from /proc)."""
    if pgid is None:
        return None
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def kbsweep(outputs: Path, args: List[str], scratch: Path, server_pgid: Optional[int] = None) -> Dict[str, Any]:
    """One command, measured: wall, the orchestrator's usage (and the server's CPU), when it announced its cells and
    logged its last."""
    usage = scratch / "usage.json"
    usage.unlink(missing_ok=True)
    env = {**os.environ, "KBSWEEP_OUTPUTS": str(outputs), "KBSWEEP_LOCK_DIR": str(outputs / "locks")}
    load, server_before = os.getloadavg()[0], group_cpu_s(server_pgid)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", MEASURED, str(usage), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    announced = last_done = None
    tail: List[str] = []
    for line in proc.stderr:
        now = time.perf_counter() - started
        if announced is None and line.startswith("[kbsweep] sweep '"):
            announced = now
        if " done, " in line:
            last_done = now
        tail = (tail + [line])[-5:]
    proc.wait()
    wall = time.perf_counter() - started
    record = {
        "args": args,
        "exit_code": proc.returncode,
        "wall_s": wall,
        "announced_s": announced,
        "last_cell_s": last_done,
        "load_before": load,
        "load_after": os.getloadavg()[0],
    }
    if server_pgid is not None:
        record["server_cpu_s"] = group_cpu_s(server_pgid) - server_before
    record.update(json.loads(usage.read_text()) if usage.exists() else {"stderr_tail": "".join(tail)})
    if proc.returncode != 0:
        record["stderr_tail"] = "".join(tail)
    return record


def store_size(outputs: Path) -> Dict[str, int]:
    database = sum(p.stat().st_size for p in outputs.glob("mlflow.db*"))
    artifacts = sum(p.stat().st_size for p in (outputs / "mlartifacts").rglob("*") if p.is_file())
    return {
        "mlflow_db_bytes": database,
        "artifact_bytes": artifacts,
        "artifact_files": sum(1 for p in (outputs / "mlartifacts").rglob("*") if p.is_file()),
    }


def one_size(root: Path, cells: int, tracking: List[str], server_pgid: Optional[int]) -> Dict[str, Any]:
    outputs = root / f"cells-{cells}"
    shutil.rmtree(outputs, ignore_errors=True)
    sweep = [*SWEEP, *tracking, *([f"sweep.name=scale-{cells}-{int(time.time())}"] if tracking else [])]
    repeats = [f"repeat=range(0,{cells // 2})"]
    measured = functools.partial(kbsweep, outputs, scratch=root, server_pgid=server_pgid)
    phases = {"plan": measured(["plan", *sweep, *repeats])}
    phases["run_half"] = measured([*sweep, f"repeat=range(0,{cells // 4})"])
    phases["resume_half"] = measured([*sweep, *repeats])
    phases["resume_all"] = measured([*sweep, *repeats])
    (outputs / "reports" / ".boards.json").unlink(missing_ok=True)
    phases["report"] = measured(["report", *tracking])
    phases["export"] = measured(["export", *tracking])
    for name in ("run_half", "resume_half"):
        ran = phases[name]
        logged = ran.get("cells_logged") or 1
        ran["cpu_ms_per_cell"] = 1000 * ran["cpu_s"] / logged
        ran["tracking_cpu_ms_per_cell"] = 1000 * ran["tracking_cpu_s"] / logged
        if "server_cpu_s" in ran:
            ran["server_cpu_ms_per_cell"] = 1000 * ran["server_cpu_s"] / logged
        if ran["announced_s"] is not None and ran["last_cell_s"] is not None:
            ran["wall_ms_per_cell"] = 1000 * (ran["last_cell_s"] - ran["announced_s"]) / logged
    return {"cells": cells, "phases": phases, "store": None if tracking else store_size(outputs)}


def per_cell_fit(sizes: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Per phase that logs cells, the least-squares line through (cells logged, CPU-s) over the sizes: the CPU a cell
    costs once the invocation's fixed start-up and end (imports, the store, the boards) is set apart, which the per-cell
    figure of one size spreads over its cells; with the tracking calls' own line beside it."""
    fits = {}
    for name in ("run_half", "resume_half"):
        phases = [size["phases"][name] for size in sizes if size["phases"][name].get("cells_logged")]
        if len(phases) < 2:
            continue
        x = [p["cells_logged"] for p in phases]
        fit = {"cells_logged": x}
        for key in ("cpu_s", "tracking_cpu_s"):
            y = [p[key] for p in phases]
            mx, my = sum(x) / len(x), sum(y) / len(y)
            slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
            fit[key.replace("_s", "_ms_per_cell")] = 1000 * slope
            fit[key.replace("_s", "_fixed_s")] = my - slope * mx
        fits[name] = fit
    return fits


def host(repo: Path = REPO) -> Dict[str, Any]:
    """The machine, and the commit of ``repo`` (the checkout whose kbsweep ran)."""
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain", "kbsweep", "conf"], cwd=repo, capture_output=True, text=True
        ).stdout.strip()
    )
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "commit": commit,
        "kbsweep_tree_dirty": dirty,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


def main(root: Path, out: Path, sizes: List[int], tracking_uri: str | None, server_pgid: Optional[int]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tracking = ["tracking=server", f"tracking.uri={tracking_uri}"] if tracking_uri else []
    record: Dict[str, Any] = {"host": host(), "tracking": tracking_uri or "sqlite (outputs/mlflow.db)", "sizes": []}
    for cells in sizes:
        record["sizes"].append(one_size(root, cells, tracking, server_pgid))
        record["per_cell_fit"] = per_cell_fit(record["sizes"])
        out.write_text(json.dumps(record, indent=1))
        summary = {
            name: {
                k: round(v, 3) if isinstance(v, float) else v
                for k, v in phase.items()
                if k not in ("args", "stderr_tail")
            }
            for name, phase in record["sizes"][-1]["phases"].items()
        }
        print(json.dumps({"cells": cells, **summary, "store": record["sizes"][-1]["store"]}, indent=1), flush=True)
    print(json.dumps({"per_cell_fit": record["per_cell_fit"]}, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the orchestrator's cost at scale")
    parser.add_argument("root", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("sizes", type=int, nargs="*", default=[100, 1000, 10000])
    parser.add_argument("--tracking-uri")
    parser.add_argument(
        "--server-pgid",
        type=lambda v: int(Path(v).read_text()) if Path(v).is_file() else int(v),
        help="the server's process group: a number or the file holding it",
    )
    args = parser.parse_args()
    main(args.root, args.out, args.sizes, args.tracking_uri, args.server_pgid)
