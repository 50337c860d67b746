#!/usr/bin/env bash
# Runs a command (the test suite) beside a throwaway PostgreSQL server, so the store tests also run on Postgres.
#
#   scripts/test-postgres.sh COMMAND [ARGS...]
#
# The server is a private cluster in a temporary folder: initdb, trust authentication, 127.0.0.1 on a free port,
# durability off (a test server). Its URL reaches the tests as FITEVICT_TEST_POSTGRES_URL; the cluster is stopped
# and its folder removed when COMMAND ends, however it ends.
#
# The server binaries come from $FITEVICT_PG_BINDIR, PATH (initdb + pg_ctl), or /usr/lib/postgresql/*/bin. As root
# with apt-get the `postgresql` package is installed when none is found (once; later runs reuse it), and then the
# server must start: failing to provision it is an error. Elsewhere a missing server only skips the Postgres tests,
# with the reason in FITEVICT_TEST_POSTGRES_SKIP.
#
#   FITEVICT_TEST_POSTGRES_URL=postgresql+psycopg://...  use that server instead (a role that may CREATE DATABASE)
#   FITEVICT_TEST_POSTGRES=off                           skip the Postgres tests
set -euo pipefail

[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
PY=${PYTHON:-python3}

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

skip_postgres() {  # skip_postgres REASON COMMAND [ARGS...]
  export FITEVICT_TEST_POSTGRES_SKIP="$1"
  say "the store tests on PostgreSQL will be skipped: $1"
  shift
  exec "$@"
}

is_root_with_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }

has_server() { local t; for t in initdb pg_ctl postgres createdb; do [ -x "$1/$t" ] || return 1; done; }

find_bindir() {  # the folder holding initdb, pg_ctl, postgres and createdb
  local d
  # initdb on PATH is often a link into the real folder (/usr/lib/postgresql/N/bin): follow it.
  if d=$(command -v initdb 2>/dev/null) && d=$(dirname "$(readlink -f "$d")") && has_server "$d"; then
    echo "$d"; return 0
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    has_server "$d" && { echo "$d"; return 0; }
  done
  return 1
}

online_clusters() {  # "VERSION NAME" of each running Debian-managed cluster (postgresql-common)
  command -v pg_lsclusters >/dev/null || return 0
  pg_lsclusters -h 2>/dev/null | awk '$4 == "online" { print $1 " " $2 }'
}

install_postgres() {
  local before after c
  before=$(online_clusters)
  say "installing PostgreSQL for the store tests (apt-get install postgresql; once)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q --no-install-recommends postgresql; then
    apt-get update -q
    apt-get install -y -q --no-install-recommends postgresql
  fi
  # The package creates and starts a "main" cluster; the tests use their own, so stop what the install started.
  after=$(online_clusters)
  while read -r c; do
    [ -n "$c" ] || continue
    grep -qxF "$c" <<<"$before" && continue
    say "stopping the cluster the package started ($c); the tests run a private one"
    pg_ctlcluster $c stop
  done <<<"$after"
}

free_port() {
  "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

if [ "${FITEVICT_TEST_POSTGRES:-}" = off ]; then
  skip_postgres "FITEVICT_TEST_POSTGRES=off" "$@"
fi
if [ -n "${FITEVICT_TEST_POSTGRES_URL:-}" ]; then
  say "store tests on PostgreSQL use the server given in FITEVICT_TEST_POSTGRES_URL"
  exec "$@"
fi

if [ -n "${FITEVICT_PG_BINDIR:-}" ]; then
  has_server "$FITEVICT_PG_BINDIR" \
    || { echo "FITEVICT_PG_BINDIR=$FITEVICT_PG_BINDIR lacks one of initdb, pg_ctl, postgres, createdb" >&2; exit 1; }
  BINDIR=$FITEVICT_PG_BINDIR
elif ! BINDIR=$(find_bindir); then
  if is_root_with_apt; then
    install_postgres
    BINDIR=$(find_bindir) || { echo "apt-get installed postgresql but no initdb, pg_ctl, postgres and createdb were found under /usr/lib/postgresql" >&2; exit 1; }
  else
    skip_postgres "no PostgreSQL server (initdb, pg_ctl) on PATH or in /usr/lib/postgresql/*/bin, and not root with apt-get to install it; install postgresql or set FITEVICT_TEST_POSTGRES_URL" "$@"
  fi
fi

# initdb refuses to run as root: as root the cluster belongs to the postgres user the package created.
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || { echo "running as root, but there is no 'postgres' user to own the test cluster (initdb refuses root); create it: useradd --system postgres" >&2; exit 1; }
  as_owner() { runuser -u postgres -- "$@"; }
else
  as_owner() { "$@"; }
fi

if [ "$(id -u)" = 0 ]; then
  PGTMP=$(mktemp -d /tmp/fitevict-pg.XXXXXX)  # in /tmp, so the postgres user can reach it
  chown postgres: "$PGTMP"
else
  PGTMP=$(mktemp -d "${TMPDIR:-/tmp}/fitevict-pg.XXXXXX")
fi
PGDATA_DIR="$PGTMP/data"

cleanup() {
  local rc=$?
  if [ -f "$PGDATA_DIR/postmaster.pid" ] && (cd "$PGTMP" && as_owner "$BINDIR/pg_ctl" -D "$PGDATA_DIR" status >/dev/null); then
    (cd "$PGTMP" && as_owner "$BINDIR/pg_ctl" -D "$PGDATA_DIR" -m immediate -w -t 30 stop >/dev/null) \
      || { echo "could not stop the test PostgreSQL cluster in $PGDATA_DIR; its log: $PGTMP/server.log" >&2; exit "$rc"; }
  fi
  rm -rf "$PGTMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

started=0
for attempt in 1 2 3; do
  PORT=$(free_port)
  if (
    cd "$PGTMP"
    [ -d "$PGDATA_DIR" ] || as_owner "$BINDIR/initdb" -D "$PGDATA_DIR" -A trust -U fitevict -E UTF8 --locale=C --no-sync >"$PGTMP/initdb.log"
    # its own session: a Ctrl-C meant for the tests does not reach the server; the trap below stops it
    as_owner setsid -w "$BINDIR/pg_ctl" -D "$PGDATA_DIR" -l "$PGTMP/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -c port=$PORT -c unix_socket_directories=$PGTMP -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
      start >/dev/null
  ); then
    started=1; break
  fi
  echo "the test PostgreSQL server did not start on port $PORT (attempt $attempt); its log:" >&2
  tail -n 20 "$PGTMP/server.log" "$PGTMP/initdb.log" >&2 2>/dev/null || true
done
if [ "$started" != 1 ]; then
  echo "could not start a test PostgreSQL server with $BINDIR (see the log above)" >&2
  exit 1
fi
(cd "$PGTMP" && as_owner "$BINDIR/createdb" -h 127.0.0.1 -p "$PORT" -U fitevict fitevict_test) \
  || { echo "the test PostgreSQL server started on port $PORT but createdb failed" >&2; exit 1; }

export FITEVICT_TEST_POSTGRES_URL="postgresql+psycopg://fitevict@127.0.0.1:$PORT/fitevict_test"
say "store tests on PostgreSQL: $("$BINDIR/postgres" --version) on 127.0.0.1:$PORT (private cluster, stopped at the end)"
set +e
"$@"
exit $?
