#!/usr/bin/env bash
# System calls per acquire+release cycle (issue 5), redlock-mio ("ours")
# beside the minimal blocking fan-out ("floor"), for N = 3 and 5.
#
# The masters are started here, directly with redis-server on loopback,
# and handed to the cycle bench binary with --servers: the traced process
# is the client alone, so `strace -f -c` counts the client's system calls
# (all of its threads, should it ever start one) and none of the masters'.
# Each (client, N) runs twice, with CYCLES cycles and with 0; the
# difference, divided by CYCLES, is the cost of one cycle, without the
# connects, the handshakes and the process start-up.
#
# Usage: scripts/syscalls.sh            # CYCLES=20000 NS="3 5"
#        CYCLES=5000 NS=3 scripts/syscalls.sh
set -euo pipefail

CYCLES=${CYCLES:-20000}
NS=${NS:-"3 5"}
CLIENTS=${CLIENTS:-"floor ours"}

cd "$(dirname "$0")/.."
# shellcheck source=scripts/common.sh
. scripts/common.sh
need_tools

echo "building the cycle bench" >&2
bin=$(cargo bench --bench cycle --no-run --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*cycle-[^"]*"' | tail -n 1 | cut -d'"' -f4)
[[ -x $bin ]] || die "could not find the cycle bench binary (cargo bench --bench cycle --no-run)"

masters_init redlock-syscalls

max_n=0
for n in $NS; do ((n > max_n)) && max_n=$n; done
for i in $(seq "$max_n"); do
    start_master "$i"
done
echo "masters: ${urls[*]}" >&2

# Runs one client with strace; $4 names the output prefix.
trace() {
    local client=$1 n=$2 cycles=$3 out=$4
    if ! strace -f -c -U name,calls -o "$out.strace" -- \
        "$bin" --client "$client" --n "$n" --cycles "$cycles" --servers "$(servers "$n")" \
        2>"$out.stderr"; then
        cat "$out.stderr" >&2
        die "$client N=$n cycles=$cycles failed"
    fi
    strace_summary "$out.strace" >"$out.calls"
    echo "  $(cat "$out.stderr")" >&2
}

columns=()
for n in $NS; do
    for client in $CLIENTS; do
        echo "tracing $client, N=$n: $CYCLES cycles and 0" >&2
        base="$work/$client-$n"
        trace "$client" "$n" 0 "$base-zero"
        trace "$client" "$n" "$CYCLES" "$base-run"
        # Per-cycle count of each system call: (run - zero) / CYCLES.
        awk -v cycles="$CYCLES" '
            FNR == NR { zero[$1] = $2; next }
            { d = $2 - zero[$1]; if (d > 0) printf "%s %.3f\n", $1, d / cycles }
        ' "$base-zero.calls" "$base-run.calls" >"$base.per-cycle"
        columns+=("$client:$n")
    done
done

# One table: a row per system call that costs at least 0.005 per cycle in
# some column, sorted by the largest; then the total and the total per
# master.
echo
echo "system calls per acquire+release cycle ($CYCLES cycles minus 0, strace -f -c, client only)"
awk -v cols="${columns[*]}" -v dir="$work" '
    BEGIN {
        ncol = split(cols, col, " ")
        for (c = 1; c <= ncol; c++) {
            split(col[c], part, ":")
            file = dir "/" part[1] "-" part[2] ".per-cycle"
            masters[c] = part[2]
            while ((getline line < file) > 0) {
                split(line, f, " ")
                v[f[1], c] = f[2]
                total[c] += f[2]
                if (!(f[1] in seen)) { seen[f[1]] = 1; names[++nn] = f[1] }
                if (f[2] > top[f[1]]) top[f[1]] = f[2]
            }
        }
        # Sort the names by their largest per-cycle count (insertion sort).
        for (i = 2; i <= nn; i++) {
            x = names[i]
            for (j = i - 1; j >= 1 && top[names[j]] < top[x]; j--) names[j + 1] = names[j]
            names[j + 1] = x
        }
        printf "%-16s", "syscall"
        for (c = 1; c <= ncol; c++) { split(col[c], part, ":"); printf " %12s", part[1] " N=" part[2] }
        printf "\n"
        for (i = 1; i <= nn; i++) {
            if (top[names[i]] < 0.005) continue
            printf "%-16s", names[i]
            for (c = 1; c <= ncol; c++) printf " %12.3f", v[names[i], c] + 0
            printf "\n"
        }
        printf "%-16s", "total"
        for (c = 1; c <= ncol; c++) printf " %12.3f", total[c]
        printf "\n%-16s", "total / master"
        for (c = 1; c <= ncol; c++) printf " %12.3f", total[c] / masters[c]
        printf "\n"
    }'
