# shellcheck shell=bash
# Helpers of the measurement scripts (scripts/*.sh): sourced, not run.
# They install strace when it is missing, start redis-server masters on
# free loopback ports and stop exactly those, by pid, on exit (also when
# interrupted), read strace -c summaries, and set up the node peers.
#
# After sourcing: `need_tools` (or `need_redis`), then `masters_init
# PREFIX` (makes $work, a scratch directory removed on exit, and sets the
# traps), then `start_master I` once per master (appends to $urls and
# $pids; `start_master I CERT KEY CA` for one that speaks TLS only), or
# `start_consecutive_masters N` once (the same, on ports $base, $base+1,
# ...: the node peers take a base port).

die() {
    echo "${0##*/}: $*" >&2
    exit 1
}

# strace (installed if missing), redis-server and redis-cli.
need_tools() {
    if ! command -v strace >/dev/null; then
        echo "installing strace" >&2
        apt-get install -y strace >/dev/null 2>&1 ||
            { apt-get update >/dev/null && apt-get install -y strace >/dev/null; } ||
            die "strace is missing and could not be installed"
    fi
    need_redis
}

# redis-server and redis-cli.
need_redis() {
    command -v redis-server >/dev/null || die "redis-server not found (apt-get install -y redis-server)"
    command -v redis-cli >/dev/null || die "redis-cli not found (apt-get install -y redis-tools)"
}

# Makes the scratch directory $work (named after $1) and arranges for the
# masters started here to be stopped, and $work removed, on exit.
masters_init() {
    work=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
    pids=()
    urls=()
    trap masters_cleanup EXIT
    trap 'exit 130' INT TERM
}

masters_cleanup() {
    # Only the masters this script started, by pid.
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}

# Starts master $1 on a free loopback port, with nothing saved (it starts
# empty), and appends its URL to urls and its pid to pids. With $2 $3 $4
# (certificate, key and CA, absolute paths: redis-server reads them after
# changing to its directory) it listens for TLS only, asking clients for
# no certificate, and its URL is rediss://; its readiness is then checked
# in plain over its unix socket (the TLS port is bound before the socket
# answers).
start_master() {
    local i=$1 cert=${2:-} key=${3:-} ca=${4:-} port pid scheme
    local -a listen ping
    mkdir -p "$work/m$i"
    for _ in 1 2 3 4 5 6 7 8; do
        port=$((20000 + RANDOM % 30000))
        # Something answers there already: try another port.
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            continue
        fi
        if [[ -n $cert ]]; then
            rm -f "$work/m$i/redis.sock"
            listen=(--port 0 --tls-port "$port"
                --tls-cert-file "$cert" --tls-key-file "$key" --tls-ca-cert-file "$ca"
                --tls-auth-clients no --unixsocket "$work/m$i/redis.sock")
            ping=(-s "$work/m$i/redis.sock")
            scheme=rediss
        else
            listen=(--port "$port")
            ping=(-p "$port")
            scheme=redis
        fi
        redis-server "${listen[@]}" --bind 127.0.0.1 --save "" --appendonly no \
            --daemonize no --dir "$work/m$i" --logfile "$work/m$i/redis.log" \
            </dev/null >/dev/null 2>&1 &
        pid=$!
        for _ in $(seq 100); do
            if [[ $(redis-cli "${ping[@]}" ping 2>/dev/null) == PONG ]]; then
                pids+=("$pid")
                urls+=("$scheme://127.0.0.1:$port")
                return 0
            fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    die "could not start master $i (see $work/m$i/redis.log)"
}

# Starts $1 masters on consecutive free loopback ports $base, $base+1, ...
# (sets base), started empty as start_master starts them.
start_consecutive_masters() {
    local n=$1 p i busy ready
    for _ in $(seq 20); do
        p=$((20000 + RANDOM % 30000))
        busy=0
        for ((i = 0; i < n; i++)); do
            if (exec 3<>"/dev/tcp/127.0.0.1/$((p + i))") 2>/dev/null; then busy=1; fi
        done
        ((busy)) && continue
        for ((i = 0; i < n; i++)); do
            mkdir -p "$work/m$i"
            redis-server --port $((p + i)) --bind 127.0.0.1 --save "" --appendonly no \
                --daemonize no --dir "$work/m$i" --logfile "$work/m$i/redis.log" \
                </dev/null >/dev/null 2>&1 &
            pids+=("$!")
            urls+=("redis://127.0.0.1:$((p + i))")
        done
        for ((i = 0; i < n; i++)); do
            ready=0
            for _ in $(seq 100); do
                if [[ $(redis-cli -p $((p + i)) ping 2>/dev/null) == PONG ]]; then
                    ready=1
                    break
                fi
                sleep 0.05
            done
            ((ready)) || die "master on port $((p + i)) did not start (see $work/m$i/redis.log)"
        done
        # shellcheck disable=SC2034 # for the caller
        base=$p
        return 0
    done
    die "no $n consecutive free ports found"
}

# Empties every master started here, so that no run inherits another's
# keys.
flush_masters() {
    local url
    for url in "${urls[@]}"; do
        redis-cli -u "$url" flushall >/dev/null || die "cannot flush $url"
    done
}

# The npm redlock peers (../shared/peers/node, or $PEERS), installed with
# npm ci when node_modules is missing. The shared directory is read-only,
# so they are copied to a cache directory of their own first (kept across
# runs, refreshed when the lock file changes); prints that directory.
node_peers() {
    local src=${PEERS:-../shared/peers/node}
    local dest=${PEERS_CACHE:-${TMPDIR:-/tmp}/redlock-mio-peers-node}
    command -v node >/dev/null || die "node not found"
    command -v npm >/dev/null || die "npm not found"
    [[ -f $src/package-lock.json ]] || die "no peers in $src (set PEERS)"
    if [[ -d $src/node_modules ]]; then
        echo "$src"
        return 0
    fi
    mkdir -p "$dest"
    # Other dependencies: install again.
    cmp -s "$src/package-lock.json" "$dest/package-lock.json" || rm -rf "$dest/node_modules"
    cp -f "$src"/*.mjs "$src"/package.json "$src"/package-lock.json "$dest"/
    chmod u+w "$dest"/*.mjs "$dest"/package.json "$dest"/package-lock.json
    if [[ ! -d $dest/node_modules ]]; then
        echo "installing the node peers in $dest (npm ci)" >&2
        (cd "$dest" && npm ci --silent >/dev/null) || die "npm ci failed in $dest"
    fi
    echo "$dest"
}

# The first $1 URLs of urls, comma-separated.
servers() {
    local IFS=,
    echo "${urls[*]:0:$1}"
}

# strace -c -U name,calls summary $1 as "name calls" lines, the total left
# out.
strace_summary() {
    awk 'NR > 2 && $1 !~ /^-/ && $1 != "total" { print $1, $2 }' "$1"
}
