#!/bin/sh
# Instructions per operation, exact and repeatable on a noisy machine:
#
#     sh benches/callgrind.sh [CASE...]
#
# For each case, runs `sweep --ops CASE N` under callgrind at N = 1M and 2M;
# (Ir(2M) - Ir(1M)) / 1M cancels set-up (limiter, key table, calibration)
# and leaves one operation plus the loop (the `noop` case: about 9).
# Prints a markdown table. Needs valgrind.
set -eu
cd "$(dirname "$0")/.."
cargo bench --bench sweep --no-run >/dev/null 2>&1
bin=$(ls -t target/release/deps/sweep-* | grep -v '\.d$' | head -1)
cases=${*:-noop rw-clock gov-clock rw-allow gov-allow rw-allow-coarse gov-allow-upkeep rw-deny rw-deny-at gov-deny rw-deny-coarse gov-deny-upkeep rw-deny-leaky rw-deny-fixed rw-deny-sliding rw-deny-log rw-keyed-100k gov-keyed-100k rw-multi3-allow rw-multi3-deny}
ir() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" --ops "$1" "$2" 2>&1 |
        awk '/I *refs/ { gsub(",", "", $NF); print $NF }'
}
echo "| case | instructions per op |"
echo "|---|---:|"
for c in $cases; do
    if ! "$bin" --ops "$c" 1 >/dev/null 2>&1; then
        echo "| \`$c\` | n/a (unknown case) |"
        continue
    fi
    a=$(ir "$c" 1000000)
    b=$(ir "$c" 2000000)
    if [ -n "$a" ] && [ -n "$b" ]; then
        awk -v c="$c" -v a="$a" -v b="$b" 'BEGIN { printf "| `%s` | %.1f |\n", c, (b - a) / 1e6 }'
    else
        echo "| \`$c\` | n/a |"
    fi
done
