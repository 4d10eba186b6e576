#!/usr/bin/env bash
# Issue 12's benchmark: waiting for a held lock across processes. PROCS
# processes at once, each with WORKERS callers, all locking one resource,
# each holding it HOLD_MS ms, then releasing it; waiting for the lock is
# each client's own:
#   notify  `redlock bench --wait-mode notify`: the shared client is woken
#           by the holder's release (or at its key's expiry), then waits
#           the library's default wake spread;
#   poll    `redlock bench --wait-mode poll`: an attempt every
#           RETRY_DELAY ([D/2, D]);
#   npm     npm redlock 5 on ioredis (../shared/peers/node/bench_contend.mjs),
#           retrying every RETRY_DELAY with as much jitter ([0, 2D]);
# and, for each spread S in SPREADS (0 included), `notify+spread=S`
# (`--wake-spread S`). The modes run in turn, ROUNDS times, on the same
# three masters, flushed before every run.
#
# One line per run: total critical sections per second (summed over the
# processes), the wait for the lock in ms (p50, p99 and max: the largest
# over the processes; ours count the waits still open at the end until
# then, npm's leave them out), each process's share of the sections and
# the smallest share (a process starved of the lock shows as 0). Then the
# median of each figure per mode.
#
# The masters are started here, empty, on consecutive free loopback ports
# (the node peer takes a base port), and stopped by pid on exit. `bench
# --servers` applies restart quarantine as for any deployment: masters
# started seconds ago would stay out of the quorum, so it is turned off
# explicitly (--no-quarantine); no lock predates these masters.
#
# `scripts/contend.sh hot` runs issue 23's table instead: a hot lock
# handed over, `redlock bench --resources 1` at 1 thread, 1 process x 8
# threads and 4 processes x 2 threads, hold 0 and 1 ms, notify and poll,
# and 8 threads on one master (N=1), interleaved on the same masters, with
# the commands, round trips and CPU each hand-over costs (see
# scripts/handover.sh, which it runs; SHAPES, ROUNDS, SECS and BINS pass
# through).
#
# Usage: scripts/contend.sh
#        ROUNDS=5 SECS=4 PROCS=4 WORKERS=2 HOLD_MS=1 SPREADS="0 200us 1ms" scripts/contend.sh
#        scripts/contend.sh hot
set -euo pipefail

if [[ ${1:-} == hot ]]; then
    export SHAPES=${SHAPES:-"1x1:0:notify 1x8:0:notify 1x8:0:poll 4x2:0:notify 4x2:0:poll 4x2:1:notify 4x2:1:poll 1x8:0:notify:n=1"}
    exec "$(dirname "$0")/handover.sh"
fi

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-4}
PROCS=${PROCS:-4}
WORKERS=${WORKERS:-2}
HOLD_MS=${HOLD_MS:-1}
RETRY_DELAY_MS=${RETRY_DELAY_MS:-200}
SPREADS=${SPREADS:-}
# Each master's answer may take this long: 4 processes and 3 masters
# share 2 cores here, and a slow round would count as an error.
TIMEOUT=${TIMEOUT:-1s}

cd "$(dirname "$0")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh

need_redis
command -v python3 >/dev/null || die "python3 not found"
peers=$(node_peers)
[[ -f $peers/bench_contend.mjs ]] || die "no $peers/bench_contend.mjs"

echo "building redlock (release)" >&2
cargo build --release -q -p redlock-cli
bin=${CARGO_TARGET_DIR:-target}/release/redlock
[[ -x $bin ]] || die "no $bin after cargo build --release"

masters_init redlock-contend
# The processes of the run under way, stopped by pid if the script ends
# before they do.
runs=()
stop_runs() {
    local pid
    for pid in "${runs[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${runs[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    runs=()
}
trap 'stop_runs; masters_cleanup' EXIT

start_consecutive_masters 3
servers=$(servers 3)
echo "masters: $servers" >&2

modes=(notify poll npm)
for spread in $SPREADS; do
    modes+=("notify+spread=$spread")
done

# Runs PROCS processes of mode $1 at once; their outputs go to
# $work/run/$i.out and .err.
run_mode() {
    local mode=$1 i
    local cmd=()
    case $mode in
    npm)
        cmd=(node "$peers/bench_contend.mjs" --n 3 --secs "$SECS" --workers "$WORKERS"
            --hold-ms "$HOLD_MS" --retry-delay "$RETRY_DELAY_MS" --base-port "$base")
        ;;
    notify | poll | notify+spread=*)
        cmd=("$bin" bench --servers "$servers" --no-quarantine --timeout "$TIMEOUT"
            --threads "$WORKERS" --resources 1 --hold "${HOLD_MS}ms"
            --retry-delay "${RETRY_DELAY_MS}ms" -d "${SECS}s" --json)
        case $mode in
        poll) cmd+=(--wait-mode poll) ;;
        notify) cmd+=(--wait-mode notify) ;;
        *) cmd+=(--wait-mode notify --wake-spread "${mode#notify+spread=}") ;;
        esac
        ;;
    esac
    rm -rf "$work/run"
    mkdir -p "$work/run"
    flush_masters
    for ((i = 0; i < PROCS; i++)); do
        "${cmd[@]}" >"$work/run/$i.out" 2>"$work/run/$i.err" &
        runs+=("$!")
    done
    local failed=0
    for i in "${!runs[@]}"; do
        wait "${runs[$i]}" || { failed=1; echo "$mode: process $i exited $?: $(tail -n 2 "$work/run/$i.err")" >&2; }
    done
    runs=()
    return "$failed"
}

results=$work/results.jsonl
: >"$results"
echo "${#modes[@]} modes x $ROUNDS rounds: $PROCS processes x $WORKERS workers, one resource, hold ${HOLD_MS} ms, ${SECS} s each" >&2
printf '%-24s %5s %12s %9s %9s %9s %9s  %s\n' mode round "sections/s" "p50 ms" "p99 ms" "max ms" "min %" "shares %"
for round in $(seq "$ROUNDS"); do
    for mode in "${modes[@]}"; do
        run_mode "$mode" || true
        python3 - "$mode" "$round" "$work/run" "$results" <<'EOF'
import glob, json, os, sys
mode, round_, run, results = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
procs = []
for path in sorted(glob.glob(os.path.join(run, "*.out")), key=lambda p: int(os.path.basename(p).split(".")[0])):
    text = open(path).read().strip()
    try:
        d = json.loads(text.splitlines()[-1])
    except (IndexError, ValueError):
        procs.append(None)
        continue
    if "wait_us" in d:  # redlock bench
        w = d["wait_us"] or {}
        procs.append({"sections": d["cycles"], "rate": d["cycles_per_sec"],
                      "p50": w.get("p50", 0) / 1000, "p99": w.get("p99", 0) / 1000,
                      "max": w.get("max", 0) / 1000, "errors": d["errors"], "open": w.get("open", 0)})
    else:  # npm redlock peer: waits in ms, open ones not counted
        # (a process that finished no wait prints no wait_max_ms)
        procs.append({"sections": d["sections"], "rate": d["sections_per_s"],
                      "p50": d.get("wait_p50_ms") or 0, "p99": d.get("wait_p99_ms") or 0,
                      "max": d.get("wait_max_ms") or 0, "errors": 0, "open": None})
ok = [p for p in procs if p is not None]
failed = len(procs) - len(ok)
total = sum(p["sections"] for p in ok)
shares = [100.0 * p["sections"] / total if total else 0.0 for p in ok]
row = {"mode": mode, "round": round_, "rate": sum(p["rate"] for p in ok),
       "p50": max((p["p50"] for p in ok), default=0), "p99": max((p["p99"] for p in ok), default=0),
       "max": max((p["max"] for p in ok), default=0), "shares": shares,
       "min_share": min(shares, default=0.0), "errors": sum(p["errors"] for p in ok), "failed": failed}
with open(results, "a") as f:
    f.write(json.dumps(row) + "\n")
note = ""
if row["errors"]:
    note += f"  errors {row['errors']}"
if failed:
    note += f"  {failed} process(es) without a report"
print(f"{mode:24} {round_:5} {row['rate']:12.0f} {row['p50']:9.2f} {row['p99']:9.2f} {row['max']:9.1f} "
      f"{row['min_share']:9.1f}  {' '.join(f'{s:.1f}' for s in shares)}{note}", flush=True)
EOF
    done
done

echo
echo "median over $ROUNDS rounds"
python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
modes = []
for r in rows:
    if r["mode"] not in modes:
        modes.append(r["mode"])
print(f"{'mode':24} {'sections/s':>12} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'min %':>9} {'errors':>7}")
for m in modes:
    v = [r for r in rows if r["mode"] == m]
    med = lambda k: statistics.median(r[k] for r in v)
    print(f"{m:24} {med('rate'):12.0f} {med('p50'):9.2f} {med('p99'):9.2f} {med('max'):9.1f} {med('min_share'):9.1f} {sum(r['errors'] for r in v):7}")
EOF
