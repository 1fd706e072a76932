#!/usr/bin/env bash
# Stop the daemons scripts/slurm_up.sh started (by their pid files); the packages and the accounting DB stay.
set -uo pipefail
PIDFILES="/run/slurmd.pid /run/slurmctld.pid /run/slurmdbd.pid /run/mysqld/mysqld.pid /run/munge/munged.pid"
pids=""
for pidfile in $PIDFILES; do
  pid=$(cat "$pidfile" 2>/dev/null) && kill "$pid" 2>/dev/null && pids="$pids $pid"
  rm -f "$pidfile"
done
for _ in $(seq 1 60); do  # up to 15 s, then SIGKILL what is left
  left=""; for pid in $pids; do kill -0 "$pid" 2>/dev/null && left="$left $pid"; done
  [ -z "$left" ] && break
  sleep 0.25
done
for pid in $left; do kill -9 "$pid" 2>/dev/null; done
echo "slurm_down: stopped"
