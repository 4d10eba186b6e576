# Helpers of the system call scripts (scripts/syscalls*.sh): sourced, not
# run. They install strace when it is missing, start redis-server masters
# on free loopback ports and stop exactly those, by pid, on exit (also
# when interrupted), and read strace -c summaries.
#
# After sourcing: `need_tools`, then `masters_init PREFIX` (makes $work, a
# scratch directory removed on exit, and sets the traps), then
# `start_master I` once per master (appends to $urls and $pids).

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
# empty), and appends its URL to urls and its pid to pids.
start_master() {
    local i=$1 port pid tries
    mkdir -p "$work/m$i"
    for tries in 1 2 3 4 5 6 7 8; do
        port=$((20000 + RANDOM % 30000))
        # Something answers there already: try another port.
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            continue
        fi
        redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
            --daemonize no --dir "$work/m$i" --logfile "$work/m$i/redis.log" \
            </dev/null >/dev/null 2>&1 &
        pid=$!
        for _ in $(seq 100); do
            if [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]]; then
                pids+=("$pid")
                urls+=("redis://127.0.0.1:$port")
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
