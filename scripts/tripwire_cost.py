"""CPU-seconds of one cell's contamination check (kbsweep.audit.contamination) beside N other cells: synthetic
outputs folders (N cell folders with a result.json each) and a transcript of ~200 kB, checked with the kbsweep
of CHECKOUT (give two checkouts to compare them in one run, alternating).

    python scripts/tripwire_cost.py OUT.json FOLDER CHECKOUT [CHECKOUT ...] --cells 100 1000 3000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

CHECK = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from kbsweep.audit import contamination
outputs = Path(sys.argv[2])
cell = outputs / "sweeps" / "demo" / "own0123456789abc"
events = [{"type": "assistant", "content": "text 0.123 " * 200, "tool_calls": []},
          {"type": "tool", "name": "run_shell", "arguments": "ls", "content": "x" * 20000}] * 5
started = time.process_time()
found = contamination.contamination(events, {"solution.py": "import torch\\n" * 200}, outputs, cell)
print(json.dumps({"cpu_s": time.process_time() - started, "findings": len(found)}))
"""


def plant(outputs: Path, cells: int) -> None:
    sweeps = outputs / "sweeps" / "demo"
    if sweeps.exists():
        return
    rng = random.Random(cells)
    for i in range(cells):
        folder = sweeps / hashlib.sha256(str(i).encode()).hexdigest()[:16]
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps({"score": rng.random() / 1000, "outcome": "pass"}))
    (sweeps / "own0123456789abc").mkdir()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("folder", type=Path)
    parser.add_argument("checkouts", nargs="+")
    parser.add_argument("--cells", type=int, nargs="+", default=[100, 1000, 3000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for cells in args.cells:
        outputs = args.folder / f"cells{cells}"
        plant(outputs, cells)
        for repeat in range(args.repeats):
            for checkout in args.checkouts:
                commit = subprocess.run(
                    ["git", "-C", checkout, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
                ).stdout.strip()
                run = subprocess.run(
                    [sys.executable, "-c", CHECK, checkout, str(outputs)], capture_output=True, text=True, check=True
                )
                rows.append(
                    {
                        "cells": cells,
                        "repeat": repeat,
                        "checkout": checkout,
                        "commit": commit,
                        **json.loads(run.stdout.splitlines()[-1]),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
