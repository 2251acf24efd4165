#!/bin/bash
# mysql image's entrypoint contract on MariaDB: flags given as the command go to the server,
# the first start initialises the data directory, sets the root password, creates MYSQL_USER
# and runs initdb.d.
set -euo pipefail
if [ "${1:0:1}" = "-" ]; then set -- mariadbd "$@"; fi
args=()
for a in "${@:2}"; do
  case "$a" in  # MySQL-only server flags (MariaDB always has GTIDs, and no binlog compression)
    --gtid-mode=*|--enforce-gtid-consistency=*|--binlog-transaction-compression=*) ;;
    *) args+=("$a") ;;
  esac
done
datadir=/var/lib/mysql
if [ ! -d "$datadir/mysql" ]; then
  : "${MYSQL_ROOT_PASSWORD:?set MYSQL_ROOT_PASSWORD}"
  mariadb-install-db --user=mysql --datadir="$datadir" --skip-test-db --auth-root-authentication-method=normal >/dev/null
  sock=/run/mysqld/init.sock
  mariadbd --user=mysql --datadir="$datadir" --skip-networking --skip-log-bin --socket="$sock" &
  pid=$!
  for _ in $(seq 60); do mariadb-admin --socket="$sock" -uroot ping >/dev/null 2>&1 && break; sleep 1; done
  mariadb --socket="$sock" -uroot <<SQL
ALTER USER 'root'@'localhost' IDENTIFIED BY '${MYSQL_ROOT_PASSWORD}';
CREATE USER 'root'@'%' IDENTIFIED BY '${MYSQL_ROOT_PASSWORD}';
GRANT ALL ON *.* TO 'root'@'%' WITH GRANT OPTION;
SQL
  if [ -n "${MYSQL_USER:-}" ]; then
    : "${MYSQL_PASSWORD:?set MYSQL_PASSWORD with MYSQL_USER}"
    mariadb --socket="$sock" -uroot -p"${MYSQL_ROOT_PASSWORD}" \
      -e "CREATE USER '${MYSQL_USER}'@'%' IDENTIFIED BY '${MYSQL_PASSWORD}'"
  fi
  for f in /docker-entrypoint-initdb.d/*.sql; do
    [ -e "$f" ] && mariadb --socket="$sock" -uroot -p"${MYSQL_ROOT_PASSWORD}" < "$f"
  done
  kill "$pid"; wait "$pid" || true
fi
exec "$1" --user=mysql --datadir="$datadir" --bind-address=0.0.0.0 --port=3306 "${args[@]}"
