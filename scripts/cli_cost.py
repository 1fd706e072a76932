"""Side by side: the wall time of the paths a user walks first under two checkouts of kbsweep (e.g. before and after
a change), interleaved, each command in a fresh interpreter run as the ``kbsweep`` script runs it: ``kbsweep
--help``, ``kbsweep plan``, the embedded default sweep into a fresh outputs folder, and its resume (everything
finished).

    python scripts/cli_cost.py OLD_REPO NEW_REPO OUT.json [REPEATS]
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KBSWEEP = "import sys; from kbsweep.cli import main; sys.argv[0] = 'kbsweep'; sys.exit(main())"
STEPS = (("help", ["--help"]), ("plan", ["plan"]), ("sweep", []), ("resume", []))


def one(repo: Path, args: list, outputs: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(repo), "KBSWEEP_OUTPUTS": str(outputs)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", KBSWEEP, *args], cwd=repo, env=env, capture_output=True, check=True)
    return time.perf_counter() - started


def main(old: Path, new: Path, out: Path, repeats: int) -> None:
    seconds = {f"{name}_{step}": [] for name in ("old", "new") for step, _ in STEPS}
    for _ in range(repeats):
        for name, repo in (("old", old), ("new", new)):
            with tempfile.TemporaryDirectory() as scratch:
                for step, args in STEPS:
                    seconds[f"{name}_{step}"].append(one(repo, args, Path(scratch) / "outputs"))
                    print(name, step, seconds[f"{name}_{step}"][-1], flush=True)
    medians = {key: statistics.median(values) for key, values in seconds.items()}
    record = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
        "old": str(old),
        "new": str(new),
        "seconds": seconds,
        "medians": medians,
        "new_over_old": {step: medians[f"new_{step}"] / medians[f"old_{step}"] for step, _ in STEPS},
    }
    out.write_text(json.dumps(record, indent=1))
    print(json.dumps({"medians": medians, "new_over_old": record["new_over_old"]}, indent=1))


if __name__ == "__main__":
    main(
        Path(sys.argv[1]).resolve(),
        Path(sys.argv[2]).resolve(),
        Path(sys.argv[3]),
        int(sys.argv[4]) if len(sys.argv) > 4 else 3,
    )
