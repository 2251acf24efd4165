#!/bin/bash
# What deploy/docker-compose.yml relies on of the official mysql image's entrypoint
# (docker-library/mysql, docker-entrypoint.sh), in short: flags given as the command go to mysqld;
# on an empty data directory, a temporary server with those flags and no networking sets root's
# password (for root@localhost and root@'%', kept out of the binlog), creates MYSQL_DATABASE and
# MYSQL_USER, and runs /docker-entrypoint-initdb.d/*.sql; then mysqld runs in the foreground.
# Not here: *_FILE variables, MYSQL_RANDOM_ROOT_PASSWORD, *.sh init files, time zone tables.
set -euo pipefail
shopt -s nullglob
if [ "${1:0:1}" = "-" ]; then set -- mysqld "$@"; fi
if [ "$1" != mysqld ]; then exec "$@"; fi

mkdir -p /var/lib/mysql /var/lib/mysql-files /run/mysqld
chown mysql:mysql /var/lib/mysql /var/lib/mysql-files /run/mysqld
# A restarted container keeps /run: the socket lock of the mysqld before it names our own PID 1.
rm -f /run/mysqld/*.lock

if [ ! -d /var/lib/mysql/mysql ]; then
  : "${MYSQL_ROOT_PASSWORD:?database is uninitialized: set MYSQL_ROOT_PASSWORD}"
  sock=/run/mysqld/init.sock
  client() { printf '[client]\nuser=root\npassword="%s"\n' "$MYSQL_ROOT_PASSWORD"; }
  sql() { mysql --defaults-extra-file=<(client) --protocol=socket --socket="$sock" --comments "$@"; }
  "$@" --initialize-insecure --default-time-zone=SYSTEM
  "$@" --daemonize --skip-networking --default-time-zone=SYSTEM --socket="$sock"
  mysql --protocol=socket --socket="$sock" -uroot --database=mysql <<SQL
SET autocommit = 1;
SET @@SESSION.SQL_LOG_BIN = 0;
ALTER USER 'root'@'localhost' IDENTIFIED BY '${MYSQL_ROOT_PASSWORD}';
CREATE USER 'root'@'%' IDENTIFIED BY '${MYSQL_ROOT_PASSWORD}';
GRANT ALL ON *.* TO 'root'@'%' WITH GRANT OPTION;
SQL
  db=()
  if [ -n "${MYSQL_DATABASE:-}" ]; then
    sql <<< "CREATE DATABASE IF NOT EXISTS \`${MYSQL_DATABASE}\`"
    db=(--database="$MYSQL_DATABASE")
  fi
  if [ -n "${MYSQL_USER:-}" ] && [ -n "${MYSQL_PASSWORD:-}" ]; then
    sql <<< "CREATE USER '${MYSQL_USER}'@'%' IDENTIFIED BY '${MYSQL_PASSWORD}'"
    if [ -n "${MYSQL_DATABASE:-}" ]; then
      sql <<< "GRANT ALL ON \`${MYSQL_DATABASE//_/\\_}\`.* TO '${MYSQL_USER}'@'%'"
    fi
  fi
  for f in /docker-entrypoint-initdb.d/*.sql; do
    echo "docker-entrypoint.sh: running $f"
    sql "${db[@]}" < "$f"
  done
  mysqladmin --defaults-extra-file=<(client) --socket="$sock" shutdown
fi
exec "$@"
