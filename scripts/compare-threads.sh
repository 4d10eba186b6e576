#!/usr/bin/env bash
# Concurrent callers at N = 3, in one run, interleaved: redlock-mio's
# shared client and its per-thread clients at T caller threads (`redlock
# bench`, 1,024 resources), the shared client with C async callers on one
# thread (`redlock bench --tasks C`), beside npm redlock 5 on ioredis with
# auto-pipelining and C concurrent callers in one process
# (../shared/peers/node/bench_conc.mjs). Each configuration runs ROUNDS
# times, in turn; the table gives the median cycles/s (acquire + release,
# one attempt each), and the ratios of the shared client to npm redlock at
# C = 64 and to the per-thread clients at the same T.
#
# The masters are started here on consecutive free loopback ports (the
# node bench takes a base port), empty, so restart quarantine is off
# (--no-quarantine).
#
# Usage: scripts/compare-threads.sh
#        ROUNDS=3 SECS=4 THREADS="1 4 16 64 256" TASKS="64 256" CALLERS="64" scripts/compare-threads.sh
set -euo pipefail

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-4}
THREADS=${THREADS:-"1 4 16 64 256"}
TASKS=${TASKS:-"64 256"}
CALLERS=${CALLERS:-"64"}

cd "$(dirname "$0")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh

need_redis
peers=$(node_peers)
[[ -f $peers/bench_conc.mjs ]] || die "no $peers/bench_conc.mjs"

echo "building redlock (release)" >&2
cargo build --release -q -p redlock-cli
bin=target/release/redlock

masters_init redlock-compare
# Three masters on consecutive ports P, P+1, P+2.
start_consecutive_masters 3
servers=$(
    IFS=,
    echo "${urls[*]}"
)
echo "masters: $servers" >&2

results=$work/results.jsonl
: >"$results"
for round in $(seq "$ROUNDS"); do
    for t in $THREADS; do
        for client in shared per-thread; do
            flag=()
            [[ $client == per-thread ]] && flag=(--client-per-thread)
            echo "round $round: T=$t $client" >&2
            "$bin" bench --servers "$servers" --threads "$t" --resources 1024 \
                --duration "${SECS}s" --timeout 1s --no-quarantine --json "${flag[@]}" 2>/dev/null |
                python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({"impl": "redlock-mio " + d["client"], "t": d["threads"], "cps": d["cycles_per_sec"], "failed": d["failed_attempts"], "errors": d["errors"], "p50": d["acquire_us"]["p50"], "p99": d["acquire_us"]["p99"]}))' >>"$results"
        done
    done
    for c in $TASKS; do
        echo "round $round: $c async callers" >&2
        "$bin" bench --servers "$servers" --tasks "$c" --resources 1024 \
            --duration "${SECS}s" --timeout 1s --no-quarantine --json 2>/dev/null |
            python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({"impl": "redlock-mio shared, tasks", "t": d["tasks"], "cps": d["cycles_per_sec"], "failed": d["failed_attempts"], "errors": d["errors"], "p50": d["acquire_us"]["p50"], "p99": d["acquire_us"]["p99"]}))' >>"$results"
    done
    for c in $CALLERS; do
        echo "round $round: npm redlock, $c callers" >&2
        node "$peers/bench_conc.mjs" --n 3 --secs "$SECS" --callers "$c" --autopipe 1 --base-port "$base" |
            python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({"impl": "npm redlock", "t": d["callers"], "cps": d["cycles_per_s"], "failed": 0, "errors": d["errors"], "p50": None, "p99": None}))' >>"$results"
    done
done

python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
groups = {}
for r in rows:
    groups.setdefault((r["impl"], r["t"]), []).append(r)
med = {k: statistics.median(x["cps"] for x in v) for k, v in groups.items()}
npm64 = med.get(("npm redlock", 64))
print(f"{'client':26} {'T/C':>4} {'cycles/s (median)':>18} {'runs':>22} {'errors':>6} {'failed':>7} {'vs npm C=64':>11} {'vs per-thread':>13} {'acquire p50/p99 us':>18}")
for (impl, t), v in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    m = med[(impl, t)]
    runs = ", ".join(f"{x['cps']:.0f}" for x in v)
    vs_npm = f"{m / npm64:.2f}x" if npm64 else "-"
    pt = med.get(("redlock-mio per-thread", t))
    vs_pt = f"{m / pt:.2f}x" if impl.startswith("redlock-mio shared") and pt else ""
    errors = sum(x["errors"] for x in v)
    failed = sum(x["failed"] for x in v)
    lat = [x for x in v if x["p50"] is not None]
    lat = f"{statistics.median(x['p50'] for x in lat):.0f}/{statistics.median(x['p99'] for x in lat):.0f}" if lat else "-"
    print(f"{impl:26} {t:>4} {m:>18.0f} {runs:>22} {errors:>6} {failed:>7} {vs_npm:>11} {vs_pt:>13} {lat:>18}")
EOF
