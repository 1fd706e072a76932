#!/usr/bin/env bash
# A loopback MLflow tracking server (an SQL store, proxied artifacts) for tests, CI and local UI use.
#
#   scripts/mlflow_server.sh start DIR [PORT [STORE]]   prints the server's URI once /health answers (default port 5000)
#   scripts/mlflow_server.sh stop DIR                   stops the whole process group it started
#
# STORE is the backend store URI: sqlite:///DIR/mlflow.db by default; a database server's for several writers at
# once, e.g. mysql+pymysql://mlflow:mlflow@127.0.0.1/mlflow (MariaDB: scripts/mariadb_up.sh). DIR holds artifacts/,
# server.log, server.pgid (and the sqlite store). Log a sweep to it with `kbsweep tracking=server` and
# MLFLOW_TRACKING_URI set to the printed URI.
set -euo pipefail

verb=${1:?usage: $0 start|stop DIR [PORT [STORE]]}
dir=${2:?usage: $0 start|stop DIR [PORT [STORE]]}
port=${3:-5000}
store=${4:-}
timeout_s=${MLFLOW_SERVER_START_TIMEOUT:-120}

case "$verb" in
  start)
    mkdir -p "$dir/artifacts"
    dir=$(cd "$dir" && pwd)
    store=${store:-sqlite:///$dir/mlflow.db}
    # No job runner (it leaves huey workers behind), no cost-map download and no usage telemetry (there may be no network).
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false LITELLM_LOCAL_MODEL_COST_MAP=True MLFLOW_DISABLE_TELEMETRY=${MLFLOW_DISABLE_TELEMETRY:-true} \
      setsid mlflow server --backend-store-uri "$store" --artifacts-destination "$dir/artifacts" \
      --host 127.0.0.1 --port "$port" --workers 1 >"$dir/server.log" 2>&1 </dev/null &
    echo $! >"$dir/server.pgid"  # setsid made the server its group's leader
    for _ in $(seq "$((timeout_s * 4))"); do
      if curl -sf "http://127.0.0.1:$port/health" >/dev/null; then
        echo "http://127.0.0.1:$port"
        exit 0
      fi
      kill -0 "$(cat "$dir/server.pgid")" 2>/dev/null || { tail -20 "$dir/server.log" >&2; exit 1; }
      sleep 0.25
    done
    echo "mlflow server did not answer on port $port within ${timeout_s}s; see $dir/server.log" >&2
    "$0" stop "$dir"
    exit 1
    ;;
  stop)
    [ -f "$dir/server.pgid" ] || exit 0
    pgid=$(cat "$dir/server.pgid")
    kill -TERM -- "-$pgid" 2>/dev/null || true
    for _ in $(seq 40); do
      kill -0 -- "-$pgid" 2>/dev/null || { rm -f "$dir/server.pgid"; exit 0; }
      sleep 0.25
    done
    kill -KILL -- "-$pgid" 2>/dev/null || true
    rm -f "$dir/server.pgid"
    ;;
  *)
    echo "usage: $0 start|stop DIR [PORT [STORE]]" >&2
    exit 2
    ;;
esac
