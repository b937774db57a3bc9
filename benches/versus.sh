#!/bin/sh
# ratewall against governor, both harness modes (issue 24): every keyed row
# measured with both sides in one process (on-CPU rates) and with each side
# in its own process (wall time), one mode after the other per row, in
# alternating rounds; prints the median ratio with its min-max and spread
# per row and mode, the CPU named.
#
#     sh benches/versus.sh [--big] [--rounds 7] [--secs 0.3] [--only NAME]
#
# Without --big (10k, 100k, 1M keys; tables for N and 2N; 1 and 2 threads;
# the one-limiter and hot-key rows): about 3.5 minutes on the 2-core bench
# machine after the build at 7 rounds (3 min 14 s; 110 s at --rounds 5
# --secs 0.2).
# --big adds the 10M-key rows and the 10M promise check: up to 0.9 GB per
# process, about 6 minutes more (each child fills its own table, 3-4 s).
set -eu
cd "$(dirname "$0")/.."
out=target/bench-report
mkdir -p "$out"
rounds=7
secs=0.3
extra=""
only=""
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --secs) secs=$2; shift 2 ;;
        --big) extra="$extra --big"; shift ;;
        --only) only=$2; shift 2 ;;
        *) echo "versus.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$only" ]; then set -- --only "$only"; else set --; fi
# shellcheck disable=SC2086 # $extra is a word list on purpose
cargo bench --bench versus -- --mode both --rounds "$rounds" --secs "$secs" \
    --md "$out/versus-both.md" $extra "$@"
echo "report: $out/versus-both.md"
