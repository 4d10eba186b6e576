#!/usr/bin/env bash
# Issue 23's measurement: what one hand-over of a hot lock costs, in
# commands, round trips, context switches and CPU, for each shape of
# `redlock bench --resources 1 --hold H`, run interleaved on the same
# masters so that throughput ratios come from one run.
#
# A shape is PROCSxTHREADS:HOLD_MS:MODE[:n=1][:ho=K], e.g. 4x2:0:notify (4
# processes of 2 threads each, hold 0 ms, notified waiting),
# 1x8:0:notify:n=1 (one master only) or 4x2:1:notify:ho=2
# (--local-handovers 2); hw=D gives --local-handover-window D, hl=D
# --local-handover-linger D, ws=D --wake-spread D. Each run: masters flushed and their
# stats reset (CONFIG RESETSTAT), the PROCS processes started at once, then
# every master's INFO commandstats summed. Per critical section (summed
# over the processes' sections):
#   rounds   lock commands / N: SET (plain or in a script) and EVALSHA,
#            every one sent to all N masters, so one per round (a
#            fire-and-forget cleanup counts as a round here: it is a
#            round's worth of work for every master and every loop)
#   att      attempts (each runs one SET NX on N masters): 1 is ideal
#   cln      cleanups of refused attempts (GET in a script, less the
#            release's)
#   pub      PUBLISH calls / N (releases that deleted a key)
#   sub      SUBSCRIBE + UNSUBSCRIBE / N
#   cs       context switches (voluntary + involuntary) of the bench
#            processes (their rusage) and of the masters (/proc), per section
#   cpu      CPU microseconds per section: bench processes + masters
# and sections/s, microseconds per section (us: one acquire + release, the
# sections one after another), the ratio to the first shape's rate in the same round,
# the largest wait, and the smallest process share.
#
# The masters are started here on loopback ports, empty, and stopped by pid
# on exit. BIN picks the redlock binary (default: this tree's release
# build, built first); BINS="a b" runs every shape with each binary in
# turn (labelled by basename), to compare builds in one interleaved run.
#
# PIN=M:C pins the masters to CPU list M and the bench processes to CPU
# list C (taskset), e.g. PIN=0:1 on two cores: the masters then take no
# CPU time from the client, as on a deployment whose masters are other
# hosts; unpinned, on a machine with few cores, a hand-over between two
# of the client's threads competes with the masters for a core, and its
# thread wake-ups cost about what a round trip does.
#
# Each run's figures also go to handover.jsonl in HANDOVER_OUT (default:
# the scratch directory, removed on exit). On a machine other builds share,
# compare counts (rounds, att, cln, cs, cpu) rather than rates, and rates
# only as ratios within one round.
#
# Usage: scripts/handover.sh
#        ROUNDS=3 SECS=3 SHAPES="1x1:0:notify 1x8:0:notify 4x2:0:notify" scripts/handover.sh
set -euo pipefail

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-3}
SHAPES=${SHAPES:-"1x1:0:notify 1x8:0:notify 1x8:0:poll 4x2:0:notify 4x2:0:poll 4x2:1:notify 4x2:1:poll"}
TIMEOUT=${TIMEOUT:-1s}
N=${N:-3}

cd "$(dirname "$0")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh

need_redis
command -v python3 >/dev/null || die "python3 not found"

if [[ -z ${BINS:-} ]]; then
    if [[ -z ${BIN:-} ]]; then
        echo "building redlock (release)" >&2
        cargo build --release -q -p redlock-cli
        BIN=${CARGO_TARGET_DIR:-target}/release/redlock
    fi
    BINS=$BIN
fi
for b in $BINS; do
    [[ -x $b ]] || die "no $b"
done

if [[ -n ${PIN:-} ]]; then
    [[ $PIN == ?*:?* ]] || die "PIN is M:C (CPU lists for the masters and the clients)"
    command -v taskset >/dev/null || die "taskset not found (util-linux)"
fi

masters_init redlock-handover
start_consecutive_masters "$N"
echo "masters: $(servers "$N")" >&2
CLIENT_CPUS=""
if [[ -n ${PIN:-} ]]; then
    for pid in "${pids[@]}"; do
        taskset -p -c "${PIN%%:*}" "$pid" >/dev/null || die "cannot pin master $pid to CPUs ${PIN%%:*}"
    done
    CLIENT_CPUS=${PIN#*:}
    echo "masters pinned to CPUs ${PIN%%:*}, clients to CPUs $CLIENT_CPUS" >&2
fi

python3 - "$ROUNDS" "$SECS" "$TIMEOUT" "$work" "$(servers "$N")" "$(
    IFS=,
    echo "${pids[*]}"
)" "$SHAPES" "$BINS" "$CLIENT_CPUS" <<'EOF'
import json, os, statistics, subprocess, sys, time

rounds, secs, timeout, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
urls = sys.argv[5].split(",")
mpids = [int(p) for p in sys.argv[6].split(",")]
shapes = sys.argv[7].split()
bins = sys.argv[8].split()
pin = ["taskset", "-c", sys.argv[9]] if sys.argv[9] else []

def cli(url, *args):
    return subprocess.run(["redis-cli", "-u", url, *args], capture_output=True, text=True, check=True).stdout

def commandstats(url):
    out = {}
    for line in cli(url, "info", "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            name, rest = line[8:].split(":", 1)
            fields = dict(kv.split("=") for kv in rest.split(","))
            out[name] = int(fields["calls"])
    return out

def proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    cpu = (int(parts[11]) + int(parts[12])) / tck
    cs = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                cs += int(line.split()[1])
    return cpu, cs

def run(shape, binary):
    spec = shape.split(":")
    procs, threads = (int(x) for x in spec[0].split("x"))
    hold, mode = spec[1], spec[2]
    n = len(urls)
    flags = []
    for extra in spec[3:]:
        if extra.startswith("n="):
            n = int(extra[2:])
        elif extra.startswith("ho="):
            flags += ["--local-handovers", extra[3:]]
        elif extra.startswith("hw="):
            flags += ["--local-handover-window", extra[3:]]
        elif extra.startswith("hl="):
            flags += ["--local-handover-linger", extra[3:]]
        elif extra.startswith("ws="):
            flags += ["--wake-spread", extra[3:]]
    servers = urls[:n]
    for url in urls:
        cli(url, "flushall")
        cli(url, "config", "resetstat")
    before = [proc_cpu(p) for p in mpids[:n]]
    cmd = [*pin, binary, "bench", "--servers", ",".join(servers), "--no-quarantine", "--timeout", timeout,
           "--threads", str(threads), "--resources", "1", "--hold", f"{hold}ms",
           "--wait-mode", mode, "-d", f"{secs}s", "--json", *flags]
    children = []
    for i in range(procs):
        out = open(os.path.join(work, f"{i}.out"), "w")
        err = open(os.path.join(work, f"{i}.err"), "w")
        children.append((subprocess.Popen(cmd, stdout=out, stderr=err), out, err))
    cpu, cs, reports = 0.0, 0, []
    for i, (child, out, err) in enumerate(children):
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = status
        out.close(); err.close()
        cpu += usage.ru_utime + usage.ru_stime
        cs += usage.ru_nvcsw + usage.ru_nivcsw
        try:
            reports.append(json.loads(open(os.path.join(work, f"{i}.out")).read().strip().splitlines()[-1]))
        except (IndexError, ValueError):
            sys.stderr.write(f"{shape}: process {i}: {open(os.path.join(work, f'{i}.err')).read()[-300:]}\n")
            reports.append(None)
    after = [proc_cpu(p) for p in mpids[:n]]
    mcpu = sum(a[0] - b[0] for a, b in zip(after, before))
    mcs = sum(a[1] - b[1] for a, b in zip(after, before))
    stats = {}
    for url in servers:
        for k, v in commandstats(url).items():
            stats[k] = stats.get(k, 0) + v
    ok = [r for r in reports if r]
    sections = sum(r["cycles"] for r in ok) or 1
    rate = sum(r["cycles_per_sec"] for r in ok)
    shares = [100.0 * r["cycles"] / sections for r in ok]
    waits = [r.get("wait_us") or {} for r in ok]
    c = lambda k: stats.get(k, 0)
    evalsha, sets, gets = c("evalsha") + c("eval"), c("set"), c("get")
    plain_set = max(sets - (evalsha - gets), 0)
    return {
        "shape": shape, "bin": os.path.basename(binary), "rate": rate, "sections": sections,
        "rounds": (evalsha + plain_set) / n / sections,
        "att": sets / n / sections, "cln": max(gets / n / sections - 1, 0.0),
        "pub": c("publish") / n / sections,
        "sub": (c("subscribe") + c("unsubscribe")) / n / sections,
        "cs_client": cs / sections, "cs_masters": mcs / sections,
        "cpu_us": (cpu + mcpu) * 1e6 / sections, "cpu_masters_us": mcpu * 1e6 / sections,
        "p50_ms": max((w.get("p50", 0) for w in waits), default=0) / 1000,
        "max_ms": max((w.get("max", 0) for w in waits), default=0) / 1000,
        "min_share": min(shares, default=0.0) if procs > 1 else 100.0,
        "errors": sum(r["errors"] for r in ok),
    }

# Microseconds per critical section (acquire + release) across the run.
us = lambda rate: 1e6 / rate if rate else 0.0
rows = []
head = f"{'shape':22} {'bin':10} {'rnd':>3} {'sect/s':>8} {'us':>6} {'ratio':>6} {'rounds':>6} {'att':>5} {'cln':>5} {'pub':>5} {'sub':>5} {'cs cli':>6} {'cs srv':>6} {'cpu us':>7} {'p50ms':>6} {'maxms':>6} {'min%':>5}"
print(head, flush=True)
for rnd in range(1, rounds + 1):
    base = None
    for shape in shapes:
        for binary in bins:
            r = run(shape, binary)
            r["round"] = rnd
            if base is None:
                base = r["rate"]
            r["ratio"] = r["rate"] / base if base else 0
            rows.append(r)
            note = f"  errors {r['errors']}" if r["errors"] else ""
            print(f"{shape:22} {r['bin'][:10]:10} {rnd:3} {r['rate']:8.0f} {us(r['rate']):6.0f} {r['ratio']:6.2f} {r['rounds']:6.2f} {r['att']:5.2f} {r['cln']:5.2f} "
                  f"{r['pub']:5.2f} {r['sub']:5.3f} {r['cs_client']:6.1f} {r['cs_masters']:6.1f} {r['cpu_us']:7.0f} "
                  f"{r['p50_ms']:6.2f} {r['max_ms']:6.1f} {r['min_share']:5.1f}{note}", flush=True)
with open(os.path.join(os.environ.get("HANDOVER_OUT", work), "handover.jsonl"), "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
print(f"\nmedians over {rounds} rounds")
print(head.replace(f" {'rnd':>3}", ""))
for shape in shapes:
    for binary in bins:
        v = [r for r in rows if r["shape"] == shape and r["bin"] == os.path.basename(binary)]
        m = lambda k: statistics.median(r[k] for r in v)
        print(f"{shape:22} {os.path.basename(binary)[:10]:10} {m('rate'):8.0f} {us(m('rate')):6.0f} {m('ratio'):6.2f} {m('rounds'):6.2f} {m('att'):5.2f} {m('cln'):5.2f} "
              f"{m('pub'):5.2f} {m('sub'):5.3f} {m('cs_client'):6.1f} {m('cs_masters'):6.1f} {m('cpu_us'):7.0f} "
              f"{m('p50_ms'):6.2f} {m('max_ms'):6.1f} {m('min_share'):5.1f}")
EOF
