"""The candidate's calls for Nsight Compute (``run_profile`` on a GPU, :mod:`kbsweep.grader.ncu`): one warm-up call
of ``ModelNew``, then one call between ``cudaProfilerStart`` and ``cudaProfilerStop``, the only range ncu profiles.

Started under ncu in the runner's sandbox as an isolated interpreter (the candidate's code runs here) with
``<candidate folder> <reference.py> <shape as JSON>``. It builds the reference's model and inputs from the
reference file the agent has too and a fixed public seed (nothing here is secret: an unscored look for the agent),
loads the reference's weights into ``ModelNew`` and prints nothing of its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from kbsweep.grader.shared.arena import seed_rng
from kbsweep.grader.shared.modules import load_module

SEED = 42


def main(folder: str, reference: str, shape_json: str) -> None:
    shape, device = json.loads(shape_json), torch.device("cuda:0")
    ref = load_module("reference", Path(reference))
    init = ref.get_init_inputs(dict(shape))
    seed_rng(SEED, device)
    model = ref.Model(*init).to(device).eval()
    sys.path.insert(0, folder)  # the candidate's helper modules beside its solution
    candidate = load_module("solution", Path(folder) / "solution.py").ModelNew(*init).to(device).eval()
    candidate.load_state_dict(model.state_dict())
    inputs = list(ref.get_inputs(dict(shape), device))
    with torch.no_grad():
        candidate(*inputs)  # compiles, autotunes, allocates: not the call profiled
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        candidate(*inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main(*sys.argv[-3:])
