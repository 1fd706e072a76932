"""Stores the baselines that GPU grades timed into the repo's per-GPU baseline data (docs/grading.md).

    python3 scripts/store_baselines.py GPU GRADE_JSON [GRADE_JSON ...]

Each GRADE_JSON is one result of ``kbsweep.grader.grade`` (as ``scripts/gpu_proof.py`` writes them); its
eager / compile / SOTA timings are keyed like the grader keys them (problem, reference-code hash, GPU, torch
and Triton versions from the result, timer version, shape) and merged into ``baselines/<GPU>.json``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kbsweep.grader.baselines import BaselineCache, conditions, entry_key  # noqa: E402
from kbsweep.config.problems import load_problem  # noqa: E402


def timed_baselines(result: dict, gpu: str) -> dict:
    track, name = result["problem"].split("/")
    problem = load_problem(REPO / "problems" / track / name, track)
    found = {}
    for entry in result.get("timings") or []:
        for baseline, timed in entry["baselines"].items():
            if timed and timed.get("median_ms"):
                key = entry_key(problem.id, problem.code_hash(), gpu, result["env"], entry["shape"], baseline, timed.get("compile_mode"))
                found[key] = {**timed, "conditions": conditions(result["env"])}
    return found


def main() -> None:
    gpu, files = sys.argv[1], sys.argv[2:]
    cache = BaselineCache(REPO / "baselines" / f"{gpu}.json")
    new = {}
    for path in files:
        new.update(timed_baselines(json.loads(Path(path).read_text()), gpu))
    cache.store(new)
    print(f"{len(new)} baseline timings stored in baselines/{gpu}.json")


if __name__ == "__main__":
    main()
