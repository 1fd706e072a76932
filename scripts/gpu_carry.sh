#!/usr/bin/env bash
# Builds .carry/: what a lent GPU machine lacks to run the grader's GPU scripts (scripts/timer_fidelity.py,
# trust_gpu_check.py, ...), for a host that has CUDA torch and Triton already and reaches no package registry.
# Pure-Python wheels for its Python (3.12), antlr4's runtime built here (it publishes no wheel), and bubblewrap as
# a .deb. On the GPU machine, from the repository's root:
#   for f in .carry/*.deb; do dpkg -x "$f" /; done; python3 -m pip install -q --no-index --no-deps .carry/*.whl
# (installed into the interpreter, not --target: the grader's sandbox passes no PYTHONPATH).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry && mkdir .carry
binary=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
python3 -m pip download -q --no-deps "${binary[@]}" -d .carry omegaconf==2.3.1 nvidia-ml-py==13.615.71 dill==0.4.1
python3 -m pip wheel -q --no-deps -w .carry antlr4-python3-runtime==4.9.3
(cd .carry && apt-get download bubblewrap 2>/dev/null)
du -sh .carry
