"""What the GPU check scripts share: the repository on sys.path, the lent GPU as a grading target (its conf/gpu
entry by the device's name: an H100 SXM, else the H200) and its roofline, and the sandbox they grade in
(bubblewrap where it confines commands on that machine, else ``sandbox.mode=unsafe``: each script prints which)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kbsweep.config.schema import load_gpu  # noqa: E402
from kbsweep.sandbox.confine import SandboxPolicy, self_test  # noqa: E402
from kbsweep.score.roofline import load_roofline  # noqa: E402

GPU = load_gpu(
    "h100" if torch.cuda.is_available() and "H100" in torch.cuda.get_device_name() else "h200"
)  # a CPU dry run grades as on the H200
ROOFLINE = load_roofline([str(REPO / "roofline_specs")], GPU.roofline)
UNCONFINED = self_test()  # the grader's sandbox needs bubblewrap; the lent machine may not allow it
SANDBOX = SandboxPolicy(mode="unsafe") if UNCONFINED else SandboxPolicy()
SANDBOX_NOTE = f"sandbox {SANDBOX.mode} ({UNCONFINED or 'bwrap works'})"
