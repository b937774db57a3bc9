#!/bin/sh
# The HTTP layer's overhead against tower_governor, as the issue asks:
#
#     sh benches/http.sh [ROUNDS]
#
# Runs the `http` criterion bench ROUNDS times (default 5; every round runs
# every contender once, so the contenders alternate), reads each round's
# medians, subtracts `bare` (the inner service alone) and prints each
# layer's overhead per request and its ratio to tower_governor's, as the
# median over rounds with the spread (min..max). Then the instructions per
# request under callgrind, if valgrind is installed: counted inside the
# request loop only (`run_ops`), so the set-up (the TSC clock's calibration
# runs a varying number of instructions) stays out, and the difference of
# 40k and 20k requests leaves out one-time costs; exact and repeatable.
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-5}
out=target/bench-report
mkdir -p "$out"
cargo bench --bench http --features axum --no-run >/dev/null 2>&1
: > "$out/http-rounds.tsv"
i=1
while [ "$i" -le "$rounds" ]; do
    rm -rf "target/criterion/http layer"
    cargo bench --bench http --features axum -- --warm-up-time 1 --measurement-time 2 >/dev/null 2>&1
    for d in "target/criterion/http layer"/*/; do
        name=$(basename "$d")
        [ -f "$d/new/estimates.json" ] || continue
        med=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["median"]["point_estimate"])' "$d/new/estimates.json")
        printf '%s\t%s\t%s\n' "$i" "$name" "$med" >> "$out/http-rounds.tsv"
    done
    i=$((i + 1))
done
python3 - "$out/http-rounds.tsv" <<'PY'
import sys, statistics
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
by = {}
for r, name, med in rows:
    by.setdefault(int(r), {})[name.replace("_", " ")] = float(med)
def med(xs): return statistics.median(xs)
names = [n for n in next(iter(by.values())) if n != "bare"]
print(f"{len(by)} rounds; ns per request (criterion median), overhead = contender - bare")
print("| contender | overhead ns, median of rounds (min..max) | ratio of median overheads to tower_governor 1 |")
print("|---|---:|---:|")
gov = med([by[r]["tower governor 1"] - by[r]["bare"] for r in by])
for n in sorted(names):
    ov = [by[r][n] - by[r]["bare"] for r in by]
    print(f"| {n} | {med(ov):.0f} ({min(ov):.0f}..{max(ov):.0f}) | {med(ov) / gov:.2f} |")
PY
if command -v valgrind >/dev/null 2>&1; then
    bin=$(ls -t target/release/deps/http-* | grep -v '\.d$' | head -1)
    ir() {
        valgrind --tool=callgrind --toggle-collect='http::run_ops' --callgrind-out-file=/dev/null \
            "$bin" --ops "$1" "$2" 2>&1 |
            awk '/I *refs/ { gsub(",", "", $NF); print $NF }'
    }
    echo
    echo "| contender | instructions per request | overhead over bare |"
    echo "|---|---:|---:|"
    base=""
    for c in "bare" "tower_governor 1" "tower_governor 1 headers" "ratewall 1" "ratewall 1 no headers" "ratewall 3" "ratewall 3 no headers"; do
        a=$(ir "$c" 20000)
        b=$(ir "$c" 40000)
        per=$(( (b - a) / 20000 ))
        [ -z "$base" ] && base=$per
        echo "| $c | $per | $(( per - base )) |"
    done
fi
