#!/usr/bin/env bash
# System calls per acquire+release cycle with T caller threads: one
# SharedRedlock for all of them ("shared": one event loop pipelining every
# thread's operations into one write per master) beside a Redlock per
# thread ("per-thread", `--client-per-thread`), through `redlock bench`.
#
# Three masters are started here, directly with redis-server on loopback
# and empty (so --no-quarantine), and handed to the release `redlock` binary
# with --servers: the traced process is the client alone, and
# `strace -f -c` counts the system calls of all its threads (callers, the
# shared client's event loop, the main thread) and none of the masters'.
#
# "per cycle" is the run's total divided by its "cycles" (locks taken and
# released, from the JSON). Start-up and shutdown (threads, connects,
# handshakes, warm-up) are in that total; "net" takes them out by also
# tracing a 1 ms run (everything but the cycles) and dividing the
# difference of the totals by the difference of the cycles. The columns
# per system call are net. Failed attempts (two threads drawing the same
# of R resources, or a slow vote) cost system calls but are not cycles, so
# they are counted beside. strace slows the client many times over: only
# counts per cycle mean anything here, not rates or latencies.
#
# Usage: scripts/syscalls-threads.sh               # THREADS="1 64"
#        THREADS=16 DURATION=5s scripts/syscalls-threads.sh
set -euo pipefail

THREADS=${THREADS:-"1 64"}
CLIENTS=${CLIENTS:-"shared per-thread"}
DURATION=${DURATION:-3s}
RESOURCES=${RESOURCES:-1024}
# The bench's default 50 ms would, under strace, turn slow votes into
# failed attempts; the timeout changes no system call of a cycle.
TIMEOUT=${TIMEOUT:-1s}
MASTERS=3

cd "$(dirname "$0")/.."
# shellcheck source=scripts/common.sh
. scripts/common.sh
need_tools

echo "building redlock (release)" >&2
cargo build --release -p redlock-cli >&2 || die "cargo build --release -p redlock-cli failed"
bin=target/release/redlock
[[ -x $bin ]] || die "no $bin after the build"

masters_init redlock-syscalls-threads
for i in $(seq "$MASTERS"); do
    start_master "$i"
done
echo "masters: ${urls[*]}" >&2

# A number field of the one-line JSON report $1.
json_field() {
    grep -o "\"$2\":[0-9]*" "$1" | head -n 1 | cut -d: -f2
}

# Traces one `redlock bench` run: T=$1, client $2, duration $3; $4 names
# the output prefix ($4.json, $4.calls).
trace() {
    local t=$1 client=$2 duration=$3 out=$4 flags=()
    [[ $client == per-thread ]] && flags+=(--client-per-thread)
    if ! strace -f -c -U name,calls -o "$out.strace" -- \
        "$bin" bench --servers "$(servers "$MASTERS")" --threads "$t" \
        --resources "$RESOURCES" --duration "$duration" --timeout "$TIMEOUT" \
        --no-quarantine --json "${flags[@]}" >"$out.json" 2>"$out.stderr"; then
        cat "$out.stderr" >&2
        die "T=$t $client --duration $duration failed"
    fi
    [[ -n $(json_field "$out.json" cycles) ]] || die "no cycles in $out.json"
    strace_summary "$out.strace" >"$out.calls"
}

rows=()
for t in $THREADS; do
    for client in $CLIENTS; do
        echo "tracing T=$t $client: $DURATION and 1ms" >&2
        base="$work/$t-$client"
        trace "$t" "$client" 1ms "$base-zero"
        trace "$t" "$client" "$DURATION" "$base-run"
        cycles=$(json_field "$base-run.json" cycles)
        ((cycles > 0)) || die "T=$t $client: no cycle completed (see $base-run.json)"
        failed=$(json_field "$base-run.json" failed_attempts)
        errors=$(json_field "$base-run.json" errors)
        zero_cycles=$(json_field "$base-zero.json" cycles)
        rows+=("$t $client $cycles $zero_cycles ${failed:-0} ${errors:-0} $base")
    done
done

echo
echo "system calls per acquire+release cycle: redlock bench, $MASTERS masters," \
    "--resources $RESOURCES, --duration $DURATION, strace -f -c (client only)"
echo "per cycle = all calls / cycles; net and the columns after it leave out" \
    "a 1 ms run's calls (start-up, shutdown)"
printf "%3s %-10s %8s %6s %6s %9s %9s %6s | %10s %6s %6s %6s %8s %6s %6s\n" \
    T client cycles failed errors syscalls "per cycle" net \
    epoll_wait write sendto read recvfrom futex other
for row in "${rows[@]}"; do
    read -r t client cycles zero_cycles failed errors base <<<"$row"
    awk -v t="$t" -v client="$client" -v cycles="$cycles" -v zc="$zero_cycles" \
        -v failed="$failed" -v errors="$errors" '
        # A count within rounding of zero, shown as 0 rather than -0.00.
        function z(x) { return x > -0.005 && x < 0.005 ? 0 : x }
        FNR == NR { zero[$1] = $2; zero_total += $2; next }
        { run[$1] = $2; total += $2 }
        END {
            net_cycles = cycles - zc
            if (net_cycles < 1) net_cycles = 1
            n = split("epoll_wait write sendto read recvfrom futex", named, " ")
            other = (total - zero_total) / net_cycles
            for (i = 1; i <= n; i++) {
                per[i] = (run[named[i]] - zero[named[i]]) / net_cycles
                other -= per[i]
                per[i] = z(per[i])
            }
            printf "%3d %-10s %8d %6d %6d %9d %9.2f %6.2f | %10.2f %6.2f %6.2f %6.2f %8.2f %6.2f %6.2f\n",
                t, client, cycles, failed, errors, total, total / cycles,
                (total - zero_total) / net_cycles,
                per[1], per[2], per[3], per[4], per[5], per[6], z(other)
        }' "$base-zero.calls" "$base-run.calls"
done
echo "failed: attempts that took no lock (two threads drawing the same resource, or" \
    "errors: unreachable quorum, slow round, failed release)"
