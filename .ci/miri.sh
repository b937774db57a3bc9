#!/usr/bin/env bash
# miri over the word and algorithm modules (the library's unit tests), the
# bad-input catalogue and the threaded CAS test. miri fails weak CASes
# spuriously, so it reaches the retry arm of `AtomicWord::update` that loom
# (whose weak CAS never fails spuriously) cannot. Tests under miri use
# ManualClock only; `QuantaClock` falls back to the OS clock there.
# Needs a nightly toolchain (skipped without one). Time-bounded.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "miri: no nightly toolchain; skipped"
    exit 0
fi
t=$SECONDS
rustup component add miri rust-src --toolchain nightly >/dev/null 2>&1
timeout 300 cargo +nightly miri setup >/dev/null
echo "miri: toolchain ready in $((SECONDS - t)) s"

# A separate target dir: miri's artifacts would otherwise evict the normal ones.
export CARGO_TARGET_DIR=${MIRI_TARGET_DIR:-target/miri}
# Isolation off: proptest (in the algorithm modules' unit tests) reads the
# working directory for its failure persistence. Few cases: miri runs code
# about 1000x slower, and the stable run already does 256 per property.
export MIRIFLAGS=${MIRIFLAGS:-"-Zmiri-strict-provenance -Zmiri-disable-isolation"}
export PROPTEST_CASES=${PROPTEST_CASES:-4}
tests=(--lib)
for t in bad_input threads; do
    [ -f "tests/$t.rs" ] && tests+=(--test "$t")
done
t=$SECONDS
timeout 600 cargo +nightly miri test "${tests[@]}"
echo "miri: tests ran in $((SECONDS - t)) s; total $((SECONDS - t0)) s"
