#!/usr/bin/env bash
# The fast checks CI runs before the tests (scripts/test.sh): ruff's lint, ruff's format check and mypy, each with
# its configuration in pyproject.toml, each with the venv's pinned version (the `test` extra). One line per tool
# with its result and time; a tool's findings follow its line. Every tool runs; the exit status is 1 if any failed.
#   bash scripts/check.sh            (VENV=path picks another virtual environment than .venv)
set -uo pipefail
cd "$(dirname "$0")/.."
bin="${VENV:-.venv}/bin"
failed=0

check() {
  local name=$1 start out rc
  shift
  if [ ! -x "$1" ]; then
    echo "$name: FAILED: $1 is missing (pip install -e '.[test]')"
    failed=1
    return
  fi
  start=$(date +%s.%N)
  out=$("$@" 2>&1)
  rc=$?
  local took
  took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$rc" -eq 0 ]; then
    echo "$name: ok (${took}s)"
  else
    echo "$name: FAILED (exit $rc, ${took}s)"
    printf '%s\n' "$out" | sed 's/^/    /'
    failed=1
  fi
}

check "ruff check" "$bin/ruff" check --quiet --output-format concise .
check "ruff format" "$bin/ruff" format --check --quiet .
check "mypy" "$bin/mypy"   # files and options from [tool.mypy]
exit "$failed"
