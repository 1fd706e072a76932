"""CPU-seconds of ``profiling.session_evidence`` at a git revision and in this tree, side by side over one CPU
profiler session of interpreted demo calls (the runner's evidence step of a CPU grade), and whether both read the
same evidence from it.

    TRITON_INTERPRET=1 python scripts/evidence_cost.py REV OUT.json [CALLS]
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from kbsweep.grader.shared import profiling  # noqa: E402

TAGS = ["/import", "/correctness/0", "/timing/0", "/timing/1", "/audit"]
IDS = {tag: f"{i:0{profiling.TOKEN_CHARS}x}" for i, tag in enumerate(TAGS)}  # each group's calls under one command id


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def profiling_at(rev: str) -> str:
    """The profiler module's source at ``rev``: under grader/shared/ once the grader was split by side, grader/ before."""
    for path in ("kbsweep/grader/shared/profiling.py", "kbsweep/grader/profiling.py"):
        shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True)
        if shown.returncode == 0:
            return shown.stdout
    raise SystemExit(f"{rev}: no grader profiling module")


def main(rev: str, out: Path, calls: int = 120) -> None:
    with tempfile.TemporaryDirectory() as folder:
        before = Path(folder) / "profiling_before.py"
        before.write_text(profiling_at(rev))
        versions = {rev: load("profiling_before", before), "tree": profiling}
    solution = load("solution", REPO / "problems/demo/scale_shift/solutions/triton.py")
    model, x = solution.ModelNew(96), torch.randn(64, 96)
    with profiling.profiler_session(torch.device("cpu")) as prof:
        for i in range(calls):
            with torch.profiler.record_function(profiling.CALL_RANGE + IDS[TAGS[i % len(TAGS)]]):
                model(x)
    per_tag = {tag: calls // len(TAGS) for tag in TAGS}
    groups = {ident: tag for tag, ident in IDS.items()}
    cpu_s, read = {}, {}
    for _ in range(3):  # interleaved
        for name, module in versions.items():
            t0 = time.process_time()
            grouped = len(inspect.signature(module.session_evidence).parameters) == 3  # since ranges carry command ids
            read[name] = json.dumps(
                module.session_evidence(prof, *((groups, per_tag) if grouped else (per_tag,))), sort_keys=True
            )
            cpu_s.setdefault(name, []).append(time.process_time() - t0)
    report = {
        "calls": calls,
        "events": len(list(prof.profiler.kineto_results.events())),
        "cpu_s": cpu_s,
        "same_evidence": len(set(read.values())) == 1,
        "torch": torch.__version__,
    }
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), *(int(a) for a in sys.argv[3:]))
