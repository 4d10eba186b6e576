#!/usr/bin/env bash
# Issue 40's measurement: what a lock cycle (acquire, release at once)
# costs the masters, and how many cycles a second, with each master's own
# commands (--lock-commands auto: SET NX PX, DELIFEQ + PUBLISH) against the
# Lua scripts (--lock-commands scripts: SET NX PX, EVALSHA), interleaved on
# the same masters so that ratios come from one run.
#
#   scripts/native-bench.sh                 3 Valkey 9.1 masters
#   SERVER=path/to/server ROUNDS=5 SECS=3 THREADS=64 RESOURCES=1024 scripts/native-bench.sh
#
# Each run: the masters' stats reset, their CPU (used_cpu_sys +
# used_cpu_user of INFO cpu) read before and after, then `redlock bench
# --json`. Per run it prints cycles/s and the masters' CPU microseconds
# per cycle (summed over the masters); at the end, per mode, the medians
# and the ratio auto/scripts of each. THREADS=1 measures one caller.
# The masters are started here on loopback ports, empty, and stopped by
# pid on exit. BIN is the redlock binary (default: this tree's release
# build, built first).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
rounds=${ROUNDS:-5}
secs=${SECS:-3}
threads=${THREADS:-64}
resources=${RESOURCES:-1024}
server=${SERVER:-$(scripts/servers.sh | grep valkey-9.1)}
if [[ -z ${BIN:-} ]]; then
    cargo build --release -q -p redlock-cli
    BIN=target/release/redlock
fi

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
ports=()
for i in 0 1 2; do
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$server" --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --daemonize no >/dev/null 2>&1 &
    pids+=($!)
    ports+=("$port")
done
for port in "${ports[@]}"; do
    for _ in $(seq 100); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
done
servers=$(printf 'redis://127.0.0.1:%s,' "${ports[@]}")
servers=${servers%,}

cpu_total() {
    local sum=0 port
    for port in "${ports[@]}"; do
        sum=$(redis-cli -p "$port" info cpu | tr -d '\r' |
            awk -F: -v s="$sum" '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}')
    done
    echo "$sum"
}

results=$(mktemp)
for round in $(seq "$rounds"); do
    for mode in scripts auto; do
        for port in "${ports[@]}"; do
            redis-cli -p "$port" flushall >/dev/null
            redis-cli -p "$port" config resetstat >/dev/null
        done
        before=$(cpu_total)
        json=$("$BIN" --servers "$servers" --no-quarantine --lock-commands "$mode" bench \
            --threads "$threads" --resources "$resources" --duration "${secs}s" --json)
        after=$(cpu_total)
        cycles=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["cycles"], d["cycles_per_sec"], d["errors"])' "$json")
        read -r n rate errors <<<"$cycles"
        us=$(python3 -c "print(($after - $before) * 1e6 / max($n, 1))")
        printf 'round %d %-7s %10.0f cycles/s  %6.2f master-us/cycle  errors %s\n' \
            "$round" "$mode" "$rate" "$us" "$errors"
        echo "$mode $rate $us" >>"$results"
    done
done
python3 - "$results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {}
for mode in ("scripts", "auto"):
    rates = [float(r[1]) for r in rows if r[0] == mode]
    cpus = [float(r[2]) for r in rows if r[0] == mode]
    med[mode] = (statistics.median(rates), statistics.median(cpus))
    print(f"{mode:8} median {med[mode][0]:10.0f} cycles/s  {med[mode][1]:6.2f} master-us/cycle")
print(f"auto/scripts: cycles/s {med['auto'][0] / med['scripts'][0]:.2f}x, "
      f"master CPU per cycle {med['auto'][1] / med['scripts'][1]:.2f}x")
EOF
rm -f "$results"
