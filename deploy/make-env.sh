#!/bin/sh
# Writes deploy/.env once: a random password for MySQL's root and binlake users and for each
# service's NATS user (deploy/nats/permissions.conf), for the cluster file's NATS routes, and the
# cluster file's Spark secret (master, workers and the loader's driver share it), and Grafana's
# admin password (profile monitoring).
# 0600; an existing file is kept, and only the variables it lacks (a newer binlake's) are added.
set -eu
env_file="$(dirname "$0")/.env"
existed=false
[ -e "$env_file" ] && existed=true
umask 077
added=""
for var in MYSQL_ROOT_PASSWORD BINLAKE_SOURCE_PASSWORD BINLAKE_PARSER_PASSWORD BINLAKE_SINK_PASSWORD \
           BINLAKE_STORE_PASSWORD BINLAKE_META_PASSWORD BINLAKE_LOADER_PASSWORD BINLAKE_ADMIN_PASSWORD \
           BINLAKE_ROUTE_PASSWORD BINLAKE_SPARK_SECRET BINLAKE_GRAFANA_PASSWORD; do
  if [ -e "$env_file" ] && grep -q "^$var=" "$env_file"; then
    continue
  fi
  if [ -z "$added" ] && [ -s "$env_file" ] && [ -n "$(tail -c1 "$env_file")" ]; then
    echo >> "$env_file"  # a hand-edited file without a final newline
  fi
  # hex: safe in a URL, a shell, nats-server's configuration and a Spark properties file
  echo "$var=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')" >> "$env_file"
  added="$added $var"
done
if ! $existed; then
  echo "wrote $env_file" >&2
elif [ -n "$added" ]; then
  echo "$env_file exists; kept, added$added" >&2
else
  echo "$env_file exists; kept (delete it to make new passwords before the first 'up')" >&2
fi
