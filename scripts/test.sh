#!/usr/bin/env bash
# Sets up everything the tests need on a fresh Debian machine (as root: venv, packages, a real single-node
# Slurm, Chromium for the MLflow UI test, the CLI harnesses from npm) and runs them. Extra arguments go to pytest
# (`-n 0`: one process, no xdist workers).
set -euo pipefail
cd "$(dirname "$0")/.."
export LITELLM_LOCAL_MODEL_COST_MAP=True PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null || ! command -v bwrap >/dev/null || ! command -v npm >/dev/null; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver bubblewrap nodejs npm >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e '.[cpu,test]' 2>&1 | grep -v '^WARNING: Location' || true
. .venv/bin/activate
python -m kbsweep.harness.install >/dev/null   # the CLI harnesses' pinned npm packages, into .harnesses/
bash scripts/slurm_up.sh >/dev/null
# two workers (CI has two cores; KBSWEEP_TEST_WORKERS=0 runs in one process); tests/conftest.py keeps the tests that
# share a resource (Slurm, an MLflow server, a module fixture) on one worker. The fork-bomb and escape tests run
# first, in this process: under an xdist worker the adversarial sweep took the worker down (a segfault in the
# worker, seen twice on a full run, never on the file alone; not yet understood).
workers=(-n "${KBSWEEP_TEST_WORKERS:-2}" --dist loadgroup)
if [ "$#" -gt 0 ]; then
  python -m pytest -q "${workers[@]}" "$@"
else
  confined=(tests/test_adversarial_agent.py tests/test_sandbox.py)
  python -m pytest -q -n 0 "${confined[@]}"
  python -m pytest -q "${workers[@]}" "${confined[@]/#/--ignore=}"
fi
