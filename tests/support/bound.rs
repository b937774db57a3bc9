//! The exact bound of a rate limit over an admission log, shared by the
//! lease tests (`tests/lease.rs`, `tests/keyed_hot.rs`).

/// In every interval `[t_i, t_j]` of a sorted admission log, at most
/// `burst + floor((t_j - t_i) / T)` admissions.
pub fn assert_bound(log: &[u64], burst: u64, t_ns: u64) {
    for i in 0..log.len() {
        for j in i..log.len() {
            let n = (j - i + 1) as u64;
            let allowed = burst + (log[j] - log[i]) / t_ns;
            assert!(
                n <= allowed,
                "{n} admitted in [{}, {}] > {allowed}: {log:?}",
                log[i],
                log[j]
            );
        }
    }
}
