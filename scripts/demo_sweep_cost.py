"""Wall time, CPU-seconds and load of a fresh scripted demo sweep on this machine: ``kbsweep -m gpu=cpu
preflight=off repeat=range(0,R)`` (R repeats × the demo track's two problems) on an empty outputs folder, the load
average sampled every 5 s while it runs (this machine is shared: the load says how much of it the sweep had), its
CPU-seconds (every process it started, counted by a cgroup of its own), and per cell its agent and final-grade
seconds from its result.json.

    python scripts/demo_sweep_cost.py KBSWEEP OUTPUTS OUT.json [REPEATS] [OVERRIDE ...]
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

CPUACCT = "/sys/fs/cgroup/cpuacct"  # a cgroup v1 CPU accounting hierarchy (needs root): the sweep's CPU-seconds, exact


def main(kbsweep: str, outputs: Path, out: Path, repeats: int, extra: list) -> None:
    shutil.rmtree(outputs, ignore_errors=True)
    command = [kbsweep, "-m", "gpu=cpu", "preflight=off", f"repeat=range(0,{repeats})", *extra]
    load, done = [], threading.Event()

    def sample() -> None:
        while not done.wait(5.0):
            load.append(round(os.getloadavg()[0], 2))

    threading.Thread(target=sample, daemon=True).start()
    group = Path(CPUACCT) / f"kbsweep-demo-{os.getpid()}"
    group.mkdir(exist_ok=True)  # every process the sweep starts stays in it, reaped by whoever
    before, started = os.getloadavg(), time.perf_counter()
    run = subprocess.run(
        command,
        env={**os.environ, "KBSWEEP_OUTPUTS": str(outputs)},
        capture_output=True,
        text=True,
        preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
    )
    wall = time.perf_counter() - started
    done.set()
    while (group / "cgroup.procs").read_text().strip():  # the last zygotes, dying with their workers
        time.sleep(0.1)
    cpu_s = int((group / "cpuacct.usage").read_text()) / 1e9
    group.rmdir()
    usage = resource.getrusage(
        resource.RUSAGE_CHILDREN
    )  # undercounts: a killed sandbox's processes are reaped outside the tree
    cells = [json.loads(p.read_text()) for p in sorted(outputs.glob("sweeps/*/*/result.json"))]
    first = min((c["started"] for c in cells), default=0.0)
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpus": os.cpu_count(),
        "command": " ".join(command[1:]),
        "exit_code": run.returncode,
        "wall_s": wall,
        "cpu_s": cpu_s,
        "cpu_s_rusage": usage.ru_utime + usage.ru_stime,
        "cells": len(cells),
        "cells_per_s": len(cells) / wall,
        "outcomes": {o: sum(c["outcome"] == o for c in cells) for o in sorted({c["outcome"] for c in cells})},
        "load_before": before,
        "load_during": load,
        "load_after": os.getloadavg(),
        "load_median": statistics.median(load) if load else None,
        "first_cell_started_s": first - (time.time() - wall) if cells else None,
        "cells_span_s": max(c["finished"] for c in cells) - first if cells else None,
        "cell_s": [
            {
                "cell": c["cell"],
                "start_s": c["started"] - first,
                "wall_s": c["finished"] - c["started"],
                "agent_s": c.get("agent_s"),
                "final_grade_s": c.get("grade_s"),
            }
            for c in cells
        ],
        "stderr_tail": run.stderr[-2000:],
    }
    out.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("cell_s", "load_during", "stderr_tail")}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 50, sys.argv[5:])
