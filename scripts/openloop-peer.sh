#!/usr/bin/env bash
# Issue 42, item 6: `redlock bench --rate` and npm redlock (5, on
# ioredis 5, with auto-pipelining) in the same open-loop harness, at the
# same rates on the same masters, so that one command prints both
# clients' percentiles. Both drivers use one method: starts meant at
# origin + i/R whatever the replies do, each operation (acquire, release
# at once, no contention) timed from its intended start (latency) and
# from its send (service), a warm-up discarded. The node driver is
# scripts/openloop-peer.mjs.
#
#   PEER_DIR=path/to/peers/node scripts/openloop-peer.sh
#   PEER_DIR=... RATES="1000 2000 4000 8000 16000" SECS=3 ROUNDS=2 \
#       THREADS=8 SLO_US=2000 scripts/openloop-peer.sh
#
# PEER_DIR is the npm peer's directory (its package-lock.json names
# redlock and ioredis); when it has no node_modules, it is copied to a
# cache directory and installed there with npm ci (scripts/common.sh).
# Three masters are started here on consecutive free loopback ports,
# empty, and stopped by pid on exit; they are flushed between runs. The
# two clients alternate which goes first at each rate. At the end, per
# client, the headroom: the highest rate whose p99 from the intended
# start is within SLO_US with every start sent and no error (the rule of
# `bench --sweep --slo`); and p99.9 side by side at the rates both
# sustained.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh
[[ -n ${PEER_DIR:-} ]] || die "set PEER_DIR to the npm redlock peer's directory"
rates=${RATES:-1000 2000 4000 8000 16000}
secs=${SECS:-3}
rounds=${ROUNDS:-1}
threads=${THREADS:-8}
slo_us=${SLO_US:-2000}
if [[ -z ${BIN:-} ]]; then
    cargo build --release -q -p redlock-cli
    BIN=target/release/redlock
fi
need_redis
peer=$(PEERS=$PEER_DIR node_peers)
masters_init openloop-peer
start_consecutive_masters 3
servers=$(servers 3)
results=$work/results

ours() {
    "$BIN" --servers "$servers" --no-quarantine --timeout 1s bench --rate "$1" \
        --threads "$threads" --duration "${secs}s" --warm-up 1s --json 2>/dev/null
}

theirs() {
    node scripts/openloop-peer.mjs --peer-dir "$peer" --base-port "$base" --n 3 --rate "$1" \
        --secs "$secs" --warm-up-ms 1000 --timeout-ms 1000
}

for round in $(seq "$rounds"); do
    i=0
    for rate in $rates; do
        order=(ours theirs)
        if (((i + round) % 2)); then order=(theirs ours); fi
        for who in "${order[@]}"; do
            flush_masters
            echo "$who $round $rate $("$who" "$rate")" >>"$results"
        done
        i=$((i + 1))
    done
done

python3 - "$results" "$slo_us" "$threads" <<'PY'
import json, sys
rows = []
for line in open(sys.argv[1]):
    who, rnd, rate, text = line.split(" ", 3)
    r = json.loads(text)
    unsent = r.get("unsent", 0)
    rows.append(dict(who="redlock-mio" if who == "ours" else "npm redlock", rnd=int(rnd), rate=float(rate),
        achieved=r["achieved_per_sec"], lat=r["latency_us"], svc=r["service_us"],
        errors=r.get("errored", r.get("errors", 0)), unsent=unsent))
slo = int(sys.argv[2])
print(f"3 local masters; redlock-mio: {sys.argv[3]} threads sharing one client; npm redlock: one event loop, "
      "auto-pipelining; latency from the intended start, service from the send, in us")
head = f"{'client':<12} {'round':>5} {'rate/s':>7} {'achieved':>8} {'p50':>7} {'p90':>7} {'p99':>8} {'p99.9':>8} {'max':>8} {'svc p50':>8} {'svc p99':>8} {'err':>4} {'unsent':>6}"
print(head)
for r in sorted(rows, key=lambda r: (r["rnd"], r["rate"], r["who"])):
    l, s = r["lat"], r["svc"]
    print(f"{r['who']:<12} {r['rnd']:>5} {r['rate']:>7.0f} {r['achieved']:>8.0f} {l['p50']:>7} {l['p90']:>7} {l['p99']:>8} "
          f"{l['p999']:>8} {l['max']:>8} {s['p50']:>8} {s['p99']:>8} {r['errors']:>4} {r['unsent']:>6}")
print()
for rnd in sorted({r["rnd"] for r in rows}):
    print(f"round {rnd}:")
    head = {}
    for who in ("redlock-mio", "npm redlock"):
        steps = sorted((r for r in rows if r["who"] == who and r["rnd"] == rnd), key=lambda r: r["rate"])
        best = None
        for r in steps:
            if r["lat"]["p99"] <= slo and r["unsent"] == 0 and r["errors"] == 0:
                best = r["rate"]
        head[who] = best
        print(f"  {who}: headroom at p99 <= {slo} us: " + (f"{best:.0f}/s" if best else "none"))
    if head["redlock-mio"] and head["npm redlock"]:
        print(f"  ratio: {head['redlock-mio'] / head['npm redlock']:.1f}x")
    mine = {r["rate"]: r for r in rows if r["who"] == "redlock-mio" and r["rnd"] == rnd}
    for r in sorted((r for r in rows if r["who"] == "npm redlock" and r["rnd"] == rnd), key=lambda r: r["rate"]):
        m = mine.get(r["rate"])
        if not m:
            continue
        sustained = lambda x: x["unsent"] == 0 and x["errors"] == 0 and x["achieved"] >= 0.98 * x["rate"]
        if sustained(m) and sustained(r):
            verdict = "lower" if m["lat"]["p999"] < r["lat"]["p999"] else "NOT lower"
            print(f"  {r['rate']:.0f}/s p99.9: redlock-mio {m['lat']['p999']} us, npm redlock {r['lat']['p999']} us ({verdict})")
PY
