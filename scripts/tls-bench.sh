#!/usr/bin/env bash
# Plain TCP against TLS at N = 3, in one run, interleaved: `redlock bench`
# against 3 plain masters and against 3 TLS-only masters (`rediss://`,
# certificates made here with openssl for IP 127.0.0.1, thrown away at the
# end), at T caller threads sharing one client, one attempt per acquire, no
# contention. Each round runs every T once per transport, the first of the
# pair alternating from round to round, so that the machine's noise hits
# both alike; each line gives one round's cycles/s, acquire p50/p99 and the
# TLS/plain ratio of that round, and the last line per T the medians over
# the rounds (the ratio is the median of the rounds' ratios).
#
# Everything listens on 127.0.0.1 only. The masters start empty, so
# restart quarantine is off (--no-quarantine). Every process started here
# (masters, bench runs) is stopped by pid on exit, also on failure or
# interruption.
#
# Usage: scripts/tls-bench.sh
#        ROUNDS=7 SECS=5 WARMUP=2 THREADS="1 4" scripts/tls-bench.sh
set -euo pipefail

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
WARMUP=${WARMUP:-2}
THREADS=${THREADS:-"1 4"}

cd "$(dirname "$0")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh

need_redis
command -v openssl >/dev/null || die "openssl not found"
command -v python3 >/dev/null || die "python3 not found"

echo "building redlock (release)" >&2
cargo build --release -q -p redlock-cli
bin=$PWD/target/release/redlock

masters_init redlock-tls-bench
# The bench run under way, stopped with the masters.
bench_pid=
stop_bench() {
    if [[ -n $bench_pid ]]; then
        kill "$bench_pid" 2>/dev/null || true
        wait "$bench_pid" 2>/dev/null || true
    fi
}
trap 'stop_bench; masters_cleanup' EXIT

# A throwaway CA, and a server certificate it signs for IP 127.0.0.1
# (ECDSA P-256, valid for a day), in $certs.
certs=$work/certs
mkdir -p "$certs"
cat >"$certs/ca.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
x509_extensions = ca
[dn]
CN = redlock-mio tls-bench CA
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF
cat >"$certs/server.cnf" <<'EOF'
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1
authorityKeyIdentifier = keyid
EOF
{
    openssl req -x509 -config "$certs/ca.cnf" -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
        -nodes -days 1 -keyout "$certs/ca.key" -out "$certs/ca.pem" &&
        openssl req -new -config /dev/null -subj "/CN=127.0.0.1" -newkey ec \
            -pkeyopt ec_paramgen_curve:P-256 -nodes \
            -keyout "$certs/server.key" -out "$certs/server.csr" &&
        openssl x509 -req -in "$certs/server.csr" -CA "$certs/ca.pem" -CAkey "$certs/ca.key" \
            -set_serial 1 -days 1 -extfile "$certs/server.cnf" -out "$certs/server.pem"
} >"$certs/openssl.log" 2>&1 || die "openssl failed: $(cat "$certs/openssl.log")"

for i in 0 1 2; do
    start_master "$i"
done
for i in 3 4 5; do
    start_master "$i" "$certs/server.pem" "$certs/server.key" "$certs/ca.pem"
done
plain=$(servers 3)
tls=$(
    IFS=,
    echo "${urls[*]:3:3}"
)
echo "plain masters: $plain" >&2
echo "TLS masters:   $tls" >&2

results=$work/results.jsonl
: >"$results"
# One bench run: transport $1 (plain or tls), $2 threads, round $3; its
# JSON report, reduced, appended to $results.
run() {
    local transport=$1 t=$2 round=$3 servers=$plain tls_flags=() secs=$SECS
    ((round)) || secs=$WARMUP
    if [[ $transport == tls ]]; then
        servers=$tls
        tls_flags=(--tls-ca "$certs/ca.pem")
    fi
    if ((round)); then
        echo "round $round: T=$t $transport" >&2
    else
        echo "warm-up: T=$t $transport" >&2
    fi
    "$bin" "${tls_flags[@]}" bench --servers "$servers" --threads "$t" \
        --duration "${secs}s" --timeout 1s --no-quarantine --json \
        >"$work/run.json" 2>"$work/run.err" &
    bench_pid=$!
    wait "$bench_pid" || die "bench failed ($transport, T=$t): $(cat "$work/run.err")"
    bench_pid=
    python3 - "$transport" "$round" "$work/run.json" >>"$results" <<'EOF'
import json, sys
transport, round_ = sys.argv[1], int(sys.argv[2])
d = json.load(open(sys.argv[3]))
want = d["masters"] if transport == "tls" else 0
if d["tls_masters"] != want:
    sys.exit(f"{transport} run spoke TLS to {d['tls_masters']} of {d['masters']} masters")
print(json.dumps({"transport": transport, "round": round_, "t": d["threads"],
                  "cps": d["cycles_per_sec"], "errors": d["errors"],
                  "failed": d["failed_attempts"],
                  "p50": d["acquire_us"]["p50"], "p99": d["acquire_us"]["p99"]}))
EOF
}

# One short unrecorded run per transport and T first: without it, the
# first round's TLS/plain ratio at T = 1 was the lowest of its run in
# each of three runs (0.68x, 0.72x, 0.76x), as if freshly started masters
# served their first TLS clients slower.
for t in $THREADS; do
    for transport in plain tls; do
        run "$transport" "$t" 0
    done
done
: >"$results"
echo "load average before the rounds: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

for round in $(seq "$ROUNDS"); do
    for t in $THREADS; do
        if ((round % 2)); then
            run plain "$t" "$round"
            run tls "$t" "$round"
        else
            run tls "$t" "$round"
            run plain "$t" "$round"
        fi
    done
done

echo "load average after the rounds: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
runs = {(r["t"], r["round"], r["transport"]): r for r in rows}
med = statistics.median
print(f"{'T':>3} {'round':>6} {'plain cycles/s':>15} {'p50/p99 us':>11} "
      f"{'TLS cycles/s':>13} {'p50/p99 us':>11} {'TLS/plain':>10} {'errors':>7}")
for t in sorted({r["t"] for r in rows}):
    rounds = sorted({r["round"] for r in rows if r["t"] == t})
    pairs = [(runs[(t, n, "plain")], runs[(t, n, "tls")]) for n in rounds]
    for n, (p, s) in zip(rounds, pairs):
        print(f"{t:>3} {n:>6} {p['cps']:>15,.0f} {p['p50']:>5}/{p['p99']:<5} "
              f"{s['cps']:>13,.0f} {s['p50']:>5}/{s['p99']:<5} {s['cps'] / p['cps']:>9.2f}x "
              f"{p['errors'] + s['errors']:>7}")
    mp = {k: med(p[k] for p, _ in pairs) for k in ("cps", "p50", "p99")}
    ms = {k: med(s[k] for _, s in pairs) for k in ("cps", "p50", "p99")}
    ratio = med(s["cps"] / p["cps"] for p, s in pairs)
    print(f"{t:>3} {'median':>6} {mp['cps']:>15,.0f} {mp['p50']:>5g}/{mp['p99']:<5g} "
          f"{ms['cps']:>13,.0f} {ms['p50']:>5g}/{ms['p99']:<5g} {ratio:>9.2f}x")
EOF
