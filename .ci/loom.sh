#!/usr/bin/env bash
# Every loom model (loom-tests/tests/*.rs), at 2 preemptions, in release.
# Time-bounded; prints each model's time and the total.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
export LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-2}
export RUSTFLAGS="${RUSTFLAGS:-} --cfg ratewall_loom"
t=$SECONDS
timeout 900 cargo test --release -p loom-tests --no-run
echo "loom: built in $((SECONDS - t)) s"

mapfile -t models < <(cargo test --release -q -p loom-tests -- --list --format=terse 2>/dev/null |
    sed -n 's/: test$//p' | sort -u)
[ "${#models[@]}" -gt 0 ] || { echo "loom: no models found"; exit 1; }
t=$SECONDS
for m in "${models[@]}"; do
    s=$(date +%s%N)
    timeout 600 cargo test --release -q -p loom-tests -- --exact "$m" >/tmp/loom-model.$$ 2>&1 ||
        { cat /tmp/loom-model.$$; echo "loom: $m FAILED"; exit 1; }
    printf 'loom: %-60s %6d ms\n' "$m" $((($(date +%s%N) - s) / 1000000))
done
rm -f /tmp/loom-model.$$
echo "loom: ${#models[@]} models ran in $((SECONDS - t)) s (LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS); total $((SECONDS - t0)) s"
