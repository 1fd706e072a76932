# Sourced by scripts/test.sh: the Slurm and MariaDB daemons a run finds running (by their pid files), and, when the
# run ends (success, failure, Ctrl-C or a TERM alike), stopping every one of them it did not find: those
# scripts/slurm_up.sh or the tests (scripts/mariadb_up.sh) started. Daemons that were running before stay.
#   . scripts/daemons.sh && stop_daemons_on_exit      # before anything starts them
# KBSWEEP_DAEMON_PIDFILES: the pid files, in stopping order (Slurm's daemons, its database, munge last).
KBSWEEP_DAEMON_PIDFILES=${KBSWEEP_DAEMON_PIDFILES:-"/run/slurmd.pid /run/slurmctld.pid /run/slurmdbd.pid /run/mysqld/mysqld.pid /run/munge/munged.pid"}
daemons_found=""

daemon_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_started_daemons() {
  local pidfile pid pids="" left=""
  for pidfile in $KBSWEEP_DAEMON_PIDFILES; do
    case " $daemons_found " in *" $pidfile "*) continue ;; esac
    daemon_alive "$pidfile" || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null && pids="$pids $pid"
  done
  for _ in $(seq 1 60); do  # up to 15 s, then SIGKILL what is left
    left=""; for pid in $pids; do kill -0 "$pid" 2>/dev/null && left="$left $pid"; done
    [ -z "$left" ] && break
    sleep 0.25
  done
  for pid in $left; do kill -9 "$pid" 2>/dev/null; done
  [ -z "$pids" ] || echo "daemons.sh: stopped the daemons this run started:$pids" >&2
}

stop_daemons_on_exit() {
  local pidfile
  daemons_found=""
  for pidfile in $KBSWEEP_DAEMON_PIDFILES; do daemon_alive "$pidfile" && daemons_found="$daemons_found $pidfile"; done
  trap stop_started_daemons EXIT
  trap 'exit 130' INT  # through the EXIT trap
  trap 'exit 143' TERM
}
