#!/bin/sh
# Instructions per operation of the floor bench's 8- and 16-byte sides,
# exact (callgrind), as benches/callgrind.sh does for the sweep cases:
#
#     sh benches/floor-ir.sh [OP...]      # default: index load cas check
#
# For each op and width: `floor --sizes l1 --only OP --width W --rounds 1`
# under callgrind at --ops 1M and 2M; (Ir(2M) - Ir(1M)) / 1M is one
# operation plus the loop (the `index` row). Needs valgrind.
set -eu
cd "$(dirname "$0")/.."
cargo bench --bench floor --no-run >/dev/null 2>&1
bin=$(ls -t target/release/deps/floor-* | grep -v '\.d$' | head -1)
ops=${*:-index load cas check}
ir() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" --sizes l1 --only "$1" \
        --width "$2" --rounds 1 --ops "$3" 2>&1 |
        awk '/I *refs/ { gsub(",", "", $NF); print $NF }'
}
echo "| op | 8 B instructions per op | 16 B instructions per op |"
echo "|---|---:|---:|"
for op in $ops; do
    row="| \`$op\`"
    for w in 8 16; do
        a=$(ir "$op" "$w" 1048576)
        b=$(ir "$op" "$w" 2097152)
        row="$row | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.1f", (b - a) / 1048576 }')"
    done
    echo "$row |"
done
