#!/usr/bin/env bash
# Every loom model (loom-tests/tests/*.rs), at 2 preemptions, in release.
# Time-bounded; runs each model alone and prints its time, then the total.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
export LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-2}
export RUSTFLAGS="${RUSTFLAGS:-} --cfg ratewall_loom"
t=$SECONDS
mapfile -t bins < <(timeout 900 cargo test --release -p loom-tests --no-run --message-format=json |
    grep -o '"executable":"[^"]*"' | sed 's/"executable":"//; s/"$//')
echo "loom: built in $((SECONDS - t)) s"

count=0
t=$SECONDS
for bin in "${bins[@]}"; do
    mapfile -t models < <("$bin" --list --format=terse 2>/dev/null | sed -n 's/: test$//p')
    for m in "${models[@]}"; do
        s=$(date +%s%N)
        if ! timeout 600 "$bin" --exact "$m" >"$bin.loom-log" 2>&1; then
            cat "$bin.loom-log"
            echo "loom: $(basename "$bin") $m FAILED"
            exit 1
        fi
        printf 'loom: %-70s %6d ms\n' "$(basename "${bin%-*}")::$m" $((($(date +%s%N) - s) / 1000000))
        count=$((count + 1))
    done
    rm -f "$bin.loom-log"
done
[ "$count" -gt 0 ] || { echo "loom: no models found"; exit 1; }
echo "loom: $count models ran in $((SECONDS - t)) s (LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS); total $((SECONDS - t0)) s"
