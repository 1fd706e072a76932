#!/usr/bin/env bash
# Sets up everything the tests need on a fresh Debian machine (as root: venv, packages, a real single-node
# Slurm with MariaDB, Chromium for the MLflow UI test, the CLI harnesses from npm) and runs them. Extra arguments go to pytest
# (`-n 0`: one process, no xdist workers).
set -euo pipefail
cd "$(dirname "$0")/.."
export LITELLM_LOCAL_MODEL_COST_MAP=True PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
# Only the packages whose command is missing: an image's own Node.js (NodeSource's, npm inside) conflicts with
# Debian's npm package, and asking for both fails the whole install.
missing=()
for pair in chromium:chromium chromedriver:chromium-driver bwrap:bubblewrap npm:npm; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e '.[cpu,test]' 2>&1 | grep -v '^WARNING: Location' || true
# lint, format and types first (seconds): a finding fails the run before any daemon or test starts
bash scripts/check.sh
. .venv/bin/activate
# kbsweep's own bytecode, once: where PYTHONDONTWRITEBYTECODE is set (this machine's image sets it), every process
# the tests start (CLI runs, sweep workers, zygotes, grades importing lazily after their fork) compiled it again
python -m compileall -q kbsweep hydra_plugins >/dev/null
python -m kbsweep.harness.install >/dev/null   # the CLI harnesses' pinned npm packages, into .harnesses/
# the daemons this run starts (Slurm, MariaDB) are stopped when it ends, however it ends; those already running stay
. scripts/daemons.sh && stop_daemons_on_exit
bash scripts/slurm_up.sh >/dev/null   # Slurm, and MariaDB (its accounting; the MLflow server test's SQL store)
# Two xdist workers (CI has two cores; KBSWEEP_TEST_WORKERS=0 runs in one process), a test file per worker at a
# time (module fixtures are built once). Files that share something across files run first, in this process: one
# Slurm (a preempting job must find only its own test's jobs), the machine's `kbsweep-bomb` processes, one MLflow
# server; and test_multi, whose concurrent multi-rank grades (16 processes) failed under the other worker's load.
workers=(-n "${KBSWEEP_TEST_WORKERS:-2}" --dist loadfile)
if [ "$#" -gt 0 ]; then
  python -m pytest -q "${workers[@]}" "$@"
else
  shared=(tests/test_slurm.py tests/test_malformed.py tests/test_sandbox.py tests/test_adversarial_agent.py
          tests/test_tracking_server.py tests/test_browser_mlflow_ui.py tests/test_multi.py)
  # the slowest tests named in the log: the suite's time is held under 30 minutes on CI's two cores
  python -m pytest -q --durations=10 -n 0 "${shared[@]}"
  python -m pytest -q --durations=20 "${workers[@]}" "${shared[@]/#/--ignore=}"
fi
