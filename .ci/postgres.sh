# shellcheck shell=bash
# Start a throwaway PostgreSQL server on loopback for the store's conformance tests.
#
# Sourced by .ci/run:   source .ci/postgres.sh
# Exports CALLGATE_PG_URL=postgresql://callgate@127.0.0.1:PORT/callgate and prints one line
# with it; registers callgate_pg_stop (stops the server, removes its data directory) on
# EXIT unless the caller already has an EXIT trap (then call callgate_pg_stop yourself).
# If CALLGATE_PG_URL is already set, it is kept and nothing is started.
#
# Installs Debian's postgresql package only when no server binaries are found. PostgreSQL
# refuses to run as root, so as root the cluster is owned by the `postgres` system user
# (created by the package) and every server command runs through runuser.
#
# Safe to source under `set -euo pipefail`; returns non-zero (never exits the caller's
# shell itself) on failure.

callgate_pg__log() { printf '[postgres.sh] %s\n' "$*" >&2; }

callgate_pg__bindir() {
    local dir
    if command -v pg_config >/dev/null 2>&1; then
        dir="$(pg_config --bindir 2>/dev/null || true)"
        if [[ -n "$dir" && -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then
            printf '%s\n' "$dir"
            return 0
        fi
    fi
    # Debian keeps server binaries out of PATH, one directory per major version.
    dir="$(find /usr/lib/postgresql -maxdepth 2 -type d -name bin 2>/dev/null | sort -V | tail -n 1)"
    if [[ -n "$dir" && -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then
        printf '%s\n' "$dir"
        return 0
    fi
    return 1
}

callgate_pg__free_port() {
    python3 - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}

callgate_pg_stop() {
    if [[ -n "${CALLGATE_PG__DATA:-}" && -d "${CALLGATE_PG__DATA}" ]]; then
        callgate_pg__as_owner "${CALLGATE_PG__BIN}/pg_ctl" -D "${CALLGATE_PG__DATA}/data" \
            -m fast -w stop >/dev/null 2>&1 || true
        rm -rf "${CALLGATE_PG__DATA}"
    fi
    CALLGATE_PG__DATA=""
}

callgate_pg__as_owner() {
    if [[ "$(id -u)" == "0" ]]; then
        runuser -u "${CALLGATE_PG__OWNER}" -- "$@"
    else
        "$@"
    fi
}

callgate_pg_start() {
    if [[ -n "${CALLGATE_PG_URL:-}" ]]; then
        echo "CALLGATE_PG_URL=${CALLGATE_PG_URL} (preset)"
        return 0
    fi
    local bin
    if ! bin="$(callgate_pg__bindir)"; then
        callgate_pg__log "no PostgreSQL server binaries; installing the Debian package"
        local sudo=""
        [[ "$(id -u)" == "0" ]] || sudo="sudo"
        $sudo apt-get update -qq || return 1
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null ||
            return 1
        bin="$(callgate_pg__bindir)" || { callgate_pg__log "install left no initdb"; return 1; }
    fi
    CALLGATE_PG__BIN="$bin"
    CALLGATE_PG__OWNER="$(id -un)"
    if [[ "$(id -u)" == "0" ]]; then
        CALLGATE_PG__OWNER="postgres"
        id postgres >/dev/null 2>&1 ||
            useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin postgres ||
            return 1
    fi

    CALLGATE_PG__DATA="$(mktemp -d "${TMPDIR:-/tmp}/callgate-pg.XXXXXX")" || return 1
    chmod 755 "$CALLGATE_PG__DATA"
    if [[ "$(id -u)" == "0" ]]; then chown "$CALLGATE_PG__OWNER" "$CALLGATE_PG__DATA"; fi

    local port data="$CALLGATE_PG__DATA/data"
    port="$(callgate_pg__free_port)" || return 1
    # trust auth on loopback only: a throwaway test server, listening on 127.0.0.1.
    callgate_pg__as_owner "$bin/initdb" -D "$data" -U callgate --auth=trust \
        --encoding=UTF8 --no-locale --no-sync >"$CALLGATE_PG__DATA/initdb.log" 2>&1 || {
        callgate_pg__log "initdb failed:"; cat "$CALLGATE_PG__DATA/initdb.log" >&2; return 1; }
    # The socket goes into our own directory: /var/run/postgresql may not exist or be ours.
    callgate_pg__as_owner "$bin/pg_ctl" -D "$data" -l "$CALLGATE_PG__DATA/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $CALLGATE_PG__DATA -c max_connections=200" \
        start >/dev/null || {
        callgate_pg__log "server did not start:"; cat "$CALLGATE_PG__DATA/server.log" >&2
        return 1; }

    local i
    for i in $(seq 1 100); do
        "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" && break
        [[ "$i" == 100 ]] && { callgate_pg__log "server not ready"; return 1; }
        sleep 0.1
    done
    "$bin/createdb" -h 127.0.0.1 -p "$port" -U callgate callgate || return 1

    export CALLGATE_PG_URL="postgresql://callgate@127.0.0.1:${port}/callgate"
    if [[ -z "$(trap -p EXIT)" ]]; then
        trap callgate_pg_stop EXIT
    fi
    echo "CALLGATE_PG_URL=${CALLGATE_PG_URL}"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    # Run directly: start, print the URL, leave the server running for manual use.
    callgate_pg_start || exit 1
    trap - EXIT
    callgate_pg__log "left running; stop with: runuser -u ${CALLGATE_PG__OWNER} -- \
${CALLGATE_PG__BIN}/pg_ctl -D ${CALLGATE_PG__DATA}/data stop"
else
    callgate_pg_start
fi
