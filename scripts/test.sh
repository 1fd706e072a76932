#!/usr/bin/env bash
# Sets up everything the tests need on a fresh Debian machine (venv, packages, services) and runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
export LITELLM_LOCAL_MODEL_COST_MAP=True PIP_DISABLE_PIP_VERSION_CHECK=1
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q -e '.[cpu,test]' 2>&1 | grep -v '^WARNING: Location' || true
. .venv/bin/activate
for service in scripts/services/*.sh; do
  [ -e "$service" ] && bash "$service"
done
python -m pytest -q "$@"
