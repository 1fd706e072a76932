"""Wall time of resuming a sweep whose every cell is finished (``kbsweep gpu=cpu`` on an outputs folder where it
already ran), under two installs of kbsweep: OLD's runs first (each writes to the store), then NEW's first run
(which re-reads the store and keeps its snapshots), then NEW's repeats.

    python scripts/resume_cost.py OLD_KBSWEEP NEW_KBSWEEP OUTPUTS OUT.json [REPEATS]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def one(kbsweep: str, outputs: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [kbsweep, "gpu=cpu"], env={**os.environ, "KBSWEEP_OUTPUTS": outputs}, capture_output=True, check=True
    )
    return time.perf_counter() - started


def main(old: str, new: str, outputs: str, out: Path, repeats: int) -> None:
    record = {"old": [], "new_first": [], "new": [], "load": []}
    for _ in range(repeats):
        record["old"].append(one(old, outputs))
    record["new_first"].append(one(new, outputs))
    for _ in range(repeats):
        record["new"].append(one(new, outputs))
    record["load"] = os.getloadavg()
    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpus": os.cpu_count(),
        "old": old,
        "new": new,
        "seconds": record,
        "medians": {k: statistics.median(v) for k, v in record.items() if k != "load"},
    }
    out.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else 3)
