#!/usr/bin/env bash
# Issue 42's targets for `redlock bench --rate`, on 3 local masters
# started here (empty, on free loopback ports, stopped by pid on exit):
#
# 1. cost: the generator's own cost at RATE (default 10,000/s): the p50
#    from the intended start against the p50 from the actual send.
# 2. stall: 2 of the 3 masters stopped (SIGSTOP) for 200 ms during a
#    2,000/s open-loop run (per-master timeout 1 s), and the closed-loop
#    bench under the same stall; the rounds interleave the two.
#
#   scripts/openloop-targets.sh
#   ROUNDS=5 SECS=5 RATE=10000 THREADS=4 scripts/openloop-targets.sh
#
# Prints one line per run. BIN is the redlock binary (default: this
# tree's release build, built first).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh
rounds=${ROUNDS:-3}
secs=${SECS:-5}
rate=${RATE:-10000}
threads=${THREADS:-4}
if [[ -z ${BIN:-} ]]; then
    cargo build --release -q -p redlock-cli
    BIN=target/release/redlock
fi
need_redis
masters_init openloop-targets
for i in 0 1 2; do start_master "$i"; done
servers=$(servers 3)

field() { python3 -c 'import json,sys; r=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }

cost() {
    local out
    out=$("$BIN" --servers "$servers" --no-quarantine --timeout 1s bench --rate "$rate" \
        --threads "$threads" --duration "${secs}s" --json 2>/dev/null)
    echo "$out" | field '"cost %s/s: achieved %.0f/s, latency p50 %d us, service p50 %d us, ratio %.3f; p99 %d / %d us; unsent %d" % (r["intended_per_sec"], r["achieved_per_sec"], r["latency_us"]["p50"], r["service_us"]["p50"], r["latency_us"]["p50"]/max(1,r["service_us"]["p50"]), r["latency_us"]["p99"], r["service_us"]["p99"], r["unsent"])'
}

# stall MODE: the run in the background, two masters stopped 200 ms
# about 1.5 s into its measured window, its JSON.
stall() {
    local mode=$1 out=$work/stall.json err=$work/stall.err pid
    local -a args=(--servers "$servers" --no-quarantine --timeout 1s bench --threads "$threads"
        --duration "${secs}s" --json)
    if [[ $mode == open ]]; then
        args+=(--rate 2000 --warm-up 1s)
    fi
    "$BIN" "${args[@]}" >"$out" 2>"$err" &
    pid=$!
    if [[ $mode == open ]]; then
        for _ in $(seq 200); do grep -q "open loop at" "$err" && break; sleep 0.01; done
        sleep 2.5
    else
        sleep 1.5
    fi
    kill -STOP "${pids[0]}" "${pids[1]}"
    sleep 0.2
    kill -CONT "${pids[0]}" "${pids[1]}"
    wait "$pid"
    if [[ $mode == open ]]; then
        field '"stall, open loop 2000/s: latency p50 %d p99 %d p99.9 %d max %d us; service p50 %d p99 %d max %d us; done %d errored %d unsent %d" % (r["latency_us"]["p50"], r["latency_us"]["p99"], r["latency_us"]["p999"], r["latency_us"]["max"], r["service_us"]["p50"], r["service_us"]["p99"], r["service_us"]["max"], r["done"], r["errored"], r["unsent"])' <"$out"
    else
        field '"stall, closed loop %d threads: %.0f cycles/s; acquire p50 %d p99 %d p99.9 %d max %d us; release p99 %d max %d us; errors %d" % (r["threads"], r["cycles_per_sec"], r["acquire_us"]["p50"], r["acquire_us"]["p99"], r["acquire_us"]["p999"], r["acquire_us"]["max"], r["release_us"]["p99"], r["release_us"]["max"], r["errors"])' <"$out"
    fi
}

for round in $(seq "$rounds"); do
    echo "--- round $round"
    cost
    stall open
    stall closed
done
