#!/bin/sh
# Every benchmark in one command, with short measurement times (about 5
# minutes on the 2-core bench machine, after the build):
#
#     sh benches/run.sh
#
# - criterion benches (clock floor, single limiters, windows, keyed), 1 s warm-up and
#   2 s measurement each: medians land in target/criterion/;
# - the thread sweep (1, 2, 4 threads, 1 s per point, 3 interleaved rounds) and the memory
#   measurement (one child process per point);
# - a report: target/bench-report/report.md (the tables in
#   docs/benchmarks.md), sweep.csv, and docs/sweep.svg.
set -eu
cd "$(dirname "$0")/.."
out=target/bench-report
mkdir -p "$out"
rm -rf target/criterion # the report reads every median there: no stale ones
benches=""
for b in clock single windows keyed; do
    if [ -f "benches/$b.rs" ]; then benches="$benches --bench $b"; fi
done
# shellcheck disable=SC2086 # $benches is a word list on purpose
cargo bench $benches -- --warm-up-time 1 --measurement-time 2 2>&1 | tee "$out/criterion.txt"
cargo bench --bench sweep -- --secs 1 --threads 1,2,4 \
    --criterion target/criterion --csv "$out/sweep.csv" --svg docs/sweep.svg \
    --md "$out/report.md"
# ratewall against governor, alternating rounds, median of the ratios (issue 12).
cargo bench --bench versus -- --rounds 9 --secs 0.3 --md "$out/versus.md"
# The floor of a keyed check: 8- against 16-byte atomics per cache level
# (issue 24; about 40 s). Both versus modes: sh benches/versus.sh.
cargo bench --bench floor -- --md "$out/floor.md"
echo "report: $out/report.md, $out/versus.md, $out/floor.md, $out/sweep.csv, docs/sweep.svg"
