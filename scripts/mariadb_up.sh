#!/usr/bin/env bash
# A local MariaDB server, no systemd (Debian's mariadb-server, installed when missing): Slurm's accounting store
# (scripts/slurm_up.sh) and an MLflow server's SQL store (tests/test_tracking_server.py). Run as root. Listens on
# 127.0.0.1:3306 and /run/mysqld/mysqld.sock; starts only when not running. Arguments: SQL run once it answers.
#   bash scripts/mariadb_up.sh "CREATE DATABASE IF NOT EXISTS mlflow; ..."
set -euo pipefail

alive() { [ -s /run/mysqld/mysqld.pid ] && kill -0 "$(cat /run/mysqld/mysqld.pid)" 2>/dev/null; }
if ! command -v mariadbd >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mariadb-server >/dev/null
fi
mkdir -p /run/mysqld /var/log/slurm
chown mysql:mysql /run/mysqld
[ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
if ! alive; then
  setsid /usr/sbin/mariadbd --user=mysql --datadir=/var/lib/mysql --socket=/run/mysqld/mysqld.sock \
    --pid-file=/run/mysqld/mysqld.pid --bind-address=127.0.0.1 >/var/log/slurm/mariadbd.log 2>&1 < /dev/null &
fi
deadline=$(( $(date +%s) + 30 ))
until mariadb -e 'select 1' >/dev/null 2>&1; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "mariadb_up: no answer within 30 s; see /var/log/slurm/mariadbd.log" >&2; exit 1; }
  sleep 0.25
done
for sql in "$@"; do mariadb -e "$sql"; done
