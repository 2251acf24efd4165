#!/bin/sh
# Writes deploy/.env once: a random password for MySQL's root and binlake users and for each
# service's NATS user (deploy/nats/permissions.conf), and for the cluster file's NATS routes.
# 0600; an existing file is kept.
set -eu
env_file="$(dirname "$0")/.env"
if [ -e "$env_file" ]; then
  echo "$env_file exists; kept (delete it to make new passwords before the first 'up')" >&2
  exit 0
fi
umask 077
{
  for var in MYSQL_ROOT_PASSWORD BINLAKE_SOURCE_PASSWORD BINLAKE_PARSER_PASSWORD BINLAKE_SINK_PASSWORD \
             BINLAKE_STORE_PASSWORD BINLAKE_META_PASSWORD BINLAKE_LOADER_PASSWORD BINLAKE_ADMIN_PASSWORD \
             BINLAKE_ROUTE_PASSWORD; do
    # hex: safe in a URL, a shell and nats-server's configuration
    echo "$var=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
  done
} > "$env_file"
echo "wrote $env_file" >&2
