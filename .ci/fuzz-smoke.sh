#!/usr/bin/env bash
# Fuzz smoke: a short run of every cargo-fuzz target, seeded with the
# committed corpus (fuzz/corpus/<target>/). Any crash fails; its reproducer is
# copied into the corpus, so `git status` shows it and the next commit keeps it
# (tests/fuzz_corpus.rs then replays it on stable forever).
#
# Needs a nightly toolchain (skipped without one). Installs cargo-fuzz if
# missing (about 30 s). Time-bounded: FUZZ_SECS per target (default 20).
#
# The targets run with `-s none` (no AddressSanitizer): ratewall forbids
# unsafe code, so ASan has nothing to check, and it costs ~2x throughput.
# Debug assertions and overflow checks stay on (cargo-fuzz's default).
# FUZZ_SEED=0 starts from an empty corpus (to measure how fast a planted bug
# is found without the committed inputs' help).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECS:-20}
t0=$SECONDS

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz-smoke: no nightly toolchain; skipped"
    exit 0
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    t=$SECONDS
    timeout 600 cargo install cargo-fuzz --locked --quiet
    echo "fuzz-smoke: installed cargo-fuzz in $((SECONDS - t)) s"
fi

cd fuzz
t=$SECONDS
timeout 900 cargo +nightly fuzz build -s none
echo "fuzz-smoke: built targets in $((SECONDS - t)) s"

status=0
for target in $(cargo +nightly fuzz list); do
    t=$SECONDS
    work=$(mktemp -d)
    seed=("corpus/$target")
    [ "${FUZZ_SEED:-1}" = 0 ] && seed=()
    rm -rf "artifacts/$target"
    # New inputs go to the scratch dir (first); the committed corpus is only read.
    if timeout $((secs + 120)) cargo +nightly fuzz run -s none "$target" "$work" "${seed[@]}" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$work.log" 2>&1; then
        runs=$(grep -o 'Done [0-9]* runs' "$work.log" | tail -1 || true)
        echo "fuzz-smoke: $target ok ($runs, $((SECONDS - t)) s)"
    else
        status=1
        echo "fuzz-smoke: $target FAILED after $((SECONDS - t)) s"
        grep -E -A12 'panicked|ERROR: libFuzzer|SUMMARY' "$work.log" | head -60 || tail -40 "$work.log"
        grep -E '^#[0-9]+' "$work.log" | tail -1 || true
        for crash in artifacts/"$target"/crash-* artifacts/"$target"/timeout-* artifacts/"$target"/oom-*; do
            [ -e "$crash" ] || continue
            cp "$crash" "corpus/$target/"
            echo "fuzz-smoke: reproducer added to fuzz/corpus/$target/$(basename "$crash"); commit it with the fix"
        done
    fi
    rm -rf "$work" "$work.log"
done
echo "fuzz-smoke: total $((SECONDS - t0)) s"
exit $status
