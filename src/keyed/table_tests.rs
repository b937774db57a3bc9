//! The table on hand-placed hashes, with a view whose state word *is*
//! the time to idle (0: idle), so that every scan's choice is visible.
//! Every insert of a new key through `put` first asks `room` and checks
//! that it predicted what the insert did.
//! Single-threaded: the direct slot stores and loads use Relaxed.
use super::*;
use crate::word::Plain;

struct Ttl;

impl StateView for Ttl {
    fn is_idle(&self, state: u64) -> bool {
        state == 0
    }
    fn time_to_idle(&self, state: u64) -> u64 {
        state
    }
    fn held(&self, _: u64) -> u64 {
        0
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Every key active, never idle: nothing can be reclaimed.
struct Active;
impl StateView for Active {
    fn is_idle(&self, _: u64) -> bool {
        false
    }
    fn time_to_idle(&self, _: u64) -> u64 {
        1
    }
    fn held(&self, _: u64) -> u64 {
        0
    }
    fn now(&self) -> u64 {
        0
    }
}

/// A hash of shard `shard` whose window starts at slot `start` of that
/// shard's main region; `salt` (small) tells keys with the same start
/// apart.
fn hash_at(t: &Table<Plain>, shard: usize, start: usize, salt: u64) -> u64 {
    let main = t.shards[shard].main;
    let base = ((start as u128) << 64).div_ceil(main as u128) as u64;
    let mut h = base + 2 + salt * (t.shard_mask + 1);
    while h & t.shard_mask != shard as u64 {
        h += 1;
    }
    assert_eq!(((u128::from(h) * main as u128) >> 64) as usize, start);
    h
}

/// Inserts the new key `h` with state `ttl` (a step that stores `ttl`),
/// after checking that `room` predicts what the insert does.
fn put(t: &Table<Plain>, h: u64, ttl: u64, policy: Full) -> Inserted<()> {
    let predicted = t.room(h, &Ttl, policy);
    let got = t.insert(h, &mut |_| ((), Some(ttl)), &Ttl, policy);
    let did = match got {
        Inserted::New { evicted: false, .. } => Room::Tracked,
        Inserted::New { evicted: true, .. } => Room::Evict,
        Inserted::Full { soonest } => Room::Full { soonest },
        Inserted::Existing(()) | Inserted::NotStored(()) => panic!("not a new key's insert"),
    };
    assert_eq!(predicted, did, "room vs insert of {h:x} ({policy:?})");
    got
}

fn state(t: &Table<Plain>, h: u64) -> Option<u64> {
    t.update(h, 0, &mut |s| (s, None))
}

/// The tag in slot `i` of shard 0, or the whole word of an empty slot or
/// a tombstone (`EMPTY`, `TOMB`).
fn fp_at(t: &Table<Plain>, i: usize) -> u64 {
    let v = t.shards[0].slots[i].load(Ordering::Relaxed);
    if tag_of(v) == 0 {
        v
    } else {
        tag_of(v)
    }
}

/// A one-shard table for 100 keys: 150 slots, the last 6 the stash.
fn hundred() -> Table<Plain> {
    let t = Table::new(100, 1, Plain, 0);
    assert_eq!((t.shards[0].main, t.shards[0].slots.len()), (144, 150));
    t
}

/// 100 keys in one shard, homed at slots 44..144 of the main region (one
/// each, so each sits at its home); key `i` has time to idle `ttl(i)`.
fn packed(ttl: impl Fn(usize) -> u64) -> (Table<Plain>, Vec<u64>) {
    let t = hundred();
    let keys: Vec<u64> = (0..100).map(|i| hash_at(&t, 0, 44 + i, 0)).collect();
    for (i, &h) in keys.iter().enumerate() {
        assert!(matches!(
            put(&t, h, ttl(i), Full::Reject),
            Inserted::New { evicted: false, .. }
        ));
    }
    assert_eq!(t.len(), 100);
    (t, keys)
}

/// `sweep_finds_active` looks as far as `evict_elsewhere` goes (every
/// attempt's range, wrapping around the shard) and counts keys, never
/// tombstones.
#[test]
fn sweep_finds_active_looks_over_every_attempt_and_skips_tombstones() {
    let t = hundred();
    let s = &t.shards[0];
    s.slots[5].store(TOMB, Ordering::Relaxed);
    assert!(!sweep_finds_active(s, 0), "a tombstone is not a key");
    s.slots[100].store(pack(2, 7), Ordering::Relaxed);
    assert!(
        sweep_finds_active(s, 0),
        "slot 100 is in the second range from 0"
    );
    assert!(
        sweep_finds_active(s, 101),
        "the scan wraps around the shard"
    );
}

#[test]
fn at_max_keys_a_free_window_still_rejects_or_evicts_elsewhere() {
    // Key 99 has the least time to idle of all, outside the range the
    // eviction scans.
    let (t, keys) = packed(|i| 1100 - i as u64);
    let newcomer = hash_at(&t, 0, 0, 0);
    assert_eq!(
        t.room(newcomer, &Ttl, Full::Reject),
        Room::Full { soonest: 0 }
    );
    assert_eq!(t.room(newcomer, &Ttl, Full::Evict), Room::Evict);
    // The newcomer's window (slots 0..32) is empty, but the table is at
    // `max_keys`, all active: rejected, told of no key in its window.
    assert!(matches!(
        put(&t, newcomer, 5, Full::Reject),
        Inserted::Full { soonest: 0 }
    ));
    assert!(matches!(
        put(&t, newcomer, 5, Full::Untracked),
        Inserted::Full { soonest: 0 }
    ));
    assert_eq!(t.len(), 100);
    assert_eq!(state(&t, newcomer), None);
    // Evicting: the sweeps (cursor at 0 + 2 * 64 = 128 after the two
    // rejections' sweeps, then the eviction's own sweep 128..150, 0..42,
    // the stash included) leave the eviction scanning slots 42..106:
    // keys 0..62. The least time to idle there is key 61's.
    assert!(matches!(
        put(&t, newcomer, 5, Full::Evict),
        Inserted::New { evicted: true, .. }
    ));
    assert_eq!(t.len(), 100);
    assert_eq!(state(&t, newcomer), Some(5));
    assert_eq!(state(&t, keys[61]), None, "key 61 evicted");
    assert!(keys
        .iter()
        .enumerate()
        .all(|(i, &h)| (i == 61) == state(&t, h).is_none()));
}

#[test]
fn evict_elsewhere_takes_the_least_time_to_idle_in_its_range_and_wraps() {
    let t = hundred();
    let shard = &*t.shards[0];
    let n = shard.slots.len();
    // Keys at every slot but 0..4 (the stash's 144..150 included), time
    // to idle 100 + slot, except slot 146 (20, in the stash), slots 10
    // and 20 (10: a tie, the first in scan order goes) and slot 60 (1,
    // outside the range).
    let _g = lock(&shard.inner);
    for i in 4..n {
        let ttl = match i {
            146 => 20,
            10 | 20 => 10,
            60 => 1,
            _ => 100 + i as u64,
        };
        shard.slots[i].store(pack(1000 + i as u64, ttl), Ordering::Relaxed);
    }
    shard.count.len.store(100, Ordering::Relaxed);
    // From 120, the range wraps: 120..150 and 0..34.
    let mut cursor = 120;
    assert!(evict_elsewhere(shard, &mut cursor, &Ttl));
    assert_eq!(cursor, (120 + SWEEP) % n);
    assert_eq!(fp_at(&t, 10), TOMB);
    assert_eq!(fp_at(&t, 146), 1146);
    assert_eq!(fp_at(&t, 20), 1020);
    assert_eq!(t.len(), 99);
    // Next range 34..98: slot 60.
    assert!(evict_elsewhere(shard, &mut cursor, &Ttl));
    assert_eq!(fp_at(&t, 60), TOMB);
    assert_eq!(cursor, (34 + SWEEP) % n);
    assert_eq!(t.len(), 98);
    // Next range 98..150 and 0..12: slot 146, in the stash.
    assert!(evict_elsewhere(shard, &mut cursor, &Ttl));
    assert_eq!(fp_at(&t, 146), TOMB);
    // A range with only tombstones and empties: the next ranges are
    // tried, up to four of them.
    for i in 0..n {
        if i != 3 {
            shard.slots[i].store(if i < 4 { EMPTY } else { TOMB }, Ordering::Relaxed);
        }
    }
    shard.slots[3].store(pack(7, 9), Ordering::Relaxed);
    let mut cursor = 4; // 4..68, 68..132, 132..150 + 0..46 (slot 3)
    assert!(evict_elsewhere(shard, &mut cursor, &Ttl));
    assert_eq!(fp_at(&t, 3), TOMB);
    assert!(!evict_elsewhere(shard, &mut cursor, &Ttl), "nothing left");
}

#[test]
fn the_victim_is_the_least_time_to_idle_first_in_probe_order() {
    let t = Table::new(4, 1, Plain, 0);
    // 6 slots, no stash: every window covers the shard.
    assert_eq!((t.shards[0].main, t.shards[0].slots.len()), (6, 6));
    let a = hash_at(&t, 0, 1, 0);
    let b = hash_at(&t, 0, 1, 1);
    let c = hash_at(&t, 0, 1, 2);
    let d = hash_at(&t, 0, 1, 3);
    for (h, ttl) in [(a, 30), (b, 10), (c, 10), (d, 20)] {
        assert!(matches!(
            put(&t, h, ttl, Full::Evict),
            Inserted::New { evicted: false, .. }
        ));
    }
    // Rejected: retry when the first key goes idle (10).
    let e = hash_at(&t, 0, 1, 4);
    assert!(matches!(
        put(&t, e, 1, Full::Reject),
        Inserted::Full { soonest: 10 }
    ));
    // Evicting: b and c tie at 10; b comes first from slot 1.
    assert!(matches!(
        put(&t, e, 1, Full::Evict),
        Inserted::New { evicted: true, .. }
    ));
    assert_eq!(state(&t, b), None);
    assert_eq!(state(&t, c), Some(10));
    assert_eq!(t.len(), 4);
    // An idle key's slot is reused without eviction, count unchanged.
    assert_eq!(t.update(d, 0, &mut |_| ((), Some(0))), Some(()));
    let f = hash_at(&t, 0, 1, 5);
    assert!(matches!(
        put(&t, f, 3, Full::Reject),
        Inserted::New { evicted: false, .. }
    ));
    assert_eq!(state(&t, d), None);
    assert_eq!(t.len(), 4);
    assert_eq!(t.retain_active(&Ttl), 0);
    // Make two keys idle: retain_active removes exactly those.
    let _ = t.update(a, 0, &mut |_| ((), Some(0)));
    let _ = t.update(f, 0, &mut |_| ((), Some(0)));
    assert_eq!(t.retain_active(&Ttl), 2);
    assert_eq!(t.len(), 2);
}

#[test]
fn room_predicts_insert() {
    let t = Table::new(4, 1, Plain, 0);
    let keys: Vec<u64> = (0..6).map(|i| hash_at(&t, 0, 2, i)).collect();
    for &h in &keys[..3] {
        assert_eq!(t.room(h, &Ttl, Full::Reject), Room::Tracked);
        let _ = put(&t, h, 7, Full::Reject);
    }
    assert_eq!(t.room(keys[3], &Ttl, Full::Reject), Room::Tracked);
    let _ = put(&t, keys[3], 4, Full::Reject);
    assert_eq!(
        t.room(keys[4], &Ttl, Full::Reject),
        Room::Full { soonest: 4 }
    );
    assert_eq!(
        t.room(keys[4], &Ttl, Full::Untracked),
        Room::Full { soonest: 4 }
    );
    assert_eq!(t.room(keys[4], &Ttl, Full::Evict), Room::Evict);
    let _ = t.update(keys[1], 0, &mut |_| ((), Some(0)));
    assert_eq!(t.room(keys[4], &Ttl, Full::Reject), Room::Tracked);
}

#[test]
fn a_full_window_overflows_into_the_stash_whose_keys_are_victims_too() {
    let t = hundred();
    let home0 = |salt| hash_at(&t, 0, 0, salt);
    // 32 keys homed at slot 0 fill its window (slots 0..32).
    for s in 0..32 {
        assert!(matches!(
            put(&t, home0(s), 500 + s, Full::Reject),
            Inserted::New { evicted: false, .. }
        ));
    }
    // The next 6 go to the stash (slots 144..150), though the table has
    // room: the one at 147 has the least time to idle of all.
    let stashed: Vec<u64> = (32..38).map(home0).collect();
    for (j, &h) in stashed.iter().enumerate() {
        let ttl = if j == 3 { 50 } else { 400 + j as u64 };
        assert!(matches!(
            put(&t, h, ttl, Full::Reject),
            Inserted::New { evicted: false, .. }
        ));
        assert_eq!(fp_at(&t, 144 + j), tag(h));
    }
    assert_eq!(t.len(), 38);
    // Window and stash full of active keys, 62 keys under `max_keys`:
    // the victim (and the retry time) comes from the stash.
    let x = home0(38);
    assert!(matches!(
        put(&t, x, 7, Full::Reject),
        Inserted::Full { soonest: 50 }
    ));
    assert!(matches!(
        put(&t, x, 7, Full::Untracked),
        Inserted::Full { soonest: 50 }
    ));
    assert!(matches!(
        put(&t, x, 7, Full::Evict),
        Inserted::New { evicted: true, .. }
    ));
    assert_eq!(state(&t, stashed[3]), None);
    assert_eq!(fp_at(&t, 147), tag(x));
    assert_eq!(state(&t, x), Some(7));
    assert_eq!(t.len(), 38);
    // An idle key in the stash is replaced in place, the count unchanged.
    let _ = t.update(stashed[0], 0, &mut |_| ((), Some(0)));
    let z = home0(39);
    assert!(matches!(
        put(&t, z, 8, Full::Reject),
        Inserted::New { evicted: false, .. }
    ));
    assert_eq!(fp_at(&t, 144), tag(z));
    assert_eq!(t.len(), 38);
    // Fill the table: 62 keys at slots 40..102, time to idle 1000 on.
    let rest: Vec<u64> = (0..62).map(|j| hash_at(&t, 0, 40 + j, 0)).collect();
    for (j, &h) in rest.iter().enumerate() {
        assert!(matches!(
            put(&t, h, 1000 + j as u64, Full::Reject),
            Inserted::New { evicted: false, .. }
        ));
    }
    assert_eq!(t.len(), 100);
    // A key homed at 34: its chain ends at the empty slot 34, so the
    // stash (times to idle 7 and 8 there) is not its: the least time to
    // idle of its window (34..66) is the key at slot 40's.
    let y = hash_at(&t, 0, 34, 0);
    assert!(matches!(
        put(&t, y, 9, Full::Reject),
        Inserted::Full { soonest: 1000 }
    ));
    assert!(matches!(
        put(&t, y, 9, Full::Evict),
        Inserted::New { evicted: true, .. }
    ));
    assert_eq!(state(&t, rest[0]), None);
    assert_eq!(fp_at(&t, 34), tag(y));
    assert_eq!((state(&t, x), state(&t, z)), (Some(7), Some(8)));
    assert_eq!(t.len(), 100);
}

/// Replaces the per-shard caps' tests: `max_keys` counts the keys of the
/// whole table, a shard holds more than its share, and a shard with free
/// slots still finds the table full.
#[test]
fn the_key_count_is_shared_by_the_shards() {
    let t = Table::new(8, 2, Plain, 0);
    for s in t.shards.iter() {
        assert_eq!((s.main, s.slots.len()), (6, 6)); // a share of 4 keys
    }
    // Six keys in shard 0, more than its share: all tracked.
    let first: Vec<u64> = (0..6).map(|i| hash_at(&t, 0, 0, i)).collect();
    for (i, &h) in first.iter().enumerate() {
        assert!(matches!(
            put(&t, h, 10 + i as u64, Full::Reject),
            Inserted::New { evicted: false, .. }
        ));
    }
    // Shard 0 is full of active keys though the table has room.
    assert!(matches!(
        put(&t, hash_at(&t, 0, 0, 6), 1, Full::Reject),
        Inserted::Full { soonest: 10 }
    ));
    let second: Vec<u64> = (0..2).map(|i| hash_at(&t, 1, 0, i)).collect();
    for (&h, ttl) in second.iter().zip([30, 20]) {
        assert!(matches!(
            put(&t, h, ttl, Full::Reject),
            Inserted::New { evicted: false, .. }
        ));
    }
    assert_eq!(t.len(), 8);
    // Shard 1 has four free slots, but the table is at `max_keys`: the
    // retry time and the victim come from the key's own window.
    let w = hash_at(&t, 1, 0, 2);
    assert!(matches!(
        put(&t, w, 40, Full::Reject),
        Inserted::Full { soonest: 20 }
    ));
    assert!(matches!(
        put(&t, w, 40, Full::Untracked),
        Inserted::Full { soonest: 20 }
    ));
    assert!(matches!(
        put(&t, w, 40, Full::Evict),
        Inserted::New { evicted: true, .. }
    ));
    assert_eq!(state(&t, second[1]), None);
    assert!(first.iter().all(|&h| state(&t, h).is_some()));
    assert_eq!(t.len(), 8);
    // An idle key in shard 0 is not reclaimed by an insert into shard 1
    // (the sweep stays in its shard)...
    let _ = t.update(first[2], 0, &mut |_| ((), Some(0)));
    let v = hash_at(&t, 1, 0, 3);
    assert!(matches!(
        put(&t, v, 50, Full::Reject),
        Inserted::Full { soonest: 30 }
    ));
    // ...until an insert into shard 0 or `retain_active` reclaims it.
    assert_eq!(t.retain_active(&Ttl), 1);
    assert_eq!(t.len(), 7);
    assert!(matches!(
        put(&t, v, 50, Full::Reject),
        Inserted::New { evicted: false, .. }
    ));
    assert_eq!(t.len(), 8);
}

/// With one key count, a table can be full of other shards' keys: a new
/// key whose shard holds nothing to evict finds no room even when
/// evicting (`room` predicts it: `put` checks).
#[test]
fn a_shard_with_nothing_to_evict_rejects_when_other_shards_fill_the_table() {
    let t = Table::new(2, 2, Plain, 0);
    for s in t.shards.iter() {
        assert_eq!((s.main, s.slots.len()), (2, 2));
    }
    for i in 0..2 {
        assert!(matches!(
            put(&t, hash_at(&t, 0, 0, i), 10, Full::Evict),
            Inserted::New { evicted: false, .. }
        ));
    }
    let newcomer = hash_at(&t, 1, 0, 0);
    for policy in [Full::Evict, Full::Reject, Full::Untracked] {
        assert!(matches!(
            put(&t, newcomer, 5, policy),
            Inserted::Full { soonest: 0 }
        ));
    }
    assert_eq!((t.len(), state(&t, newcomer)), (2, None));
}

/// `evict_elsewhere` looks at four 64-slot ranges after the sweep's,
/// then gives up until the next insert; `room` predicts from the same
/// cursor (a shard larger than the four ranges tells the start apart).
#[test]
fn evicting_elsewhere_starts_where_the_sweep_left_the_cursor() {
    let t = Table::new(1200, 4, Plain, 0);
    let n = t.shards[3].slots.len();
    let main = t.shards[3].main;
    assert!(n > 5 * SWEEP && main > 5 * SWEEP, "{main} + {}", n - main);
    // The one key of shard 3, at slot 10.
    let k = hash_at(&t, 3, 10, 0);
    let _ = put(&t, k, 1000, Full::Reject);
    // The other shards fill the table.
    for i in 0..1199 {
        let start = i % 400;
        let main = t.shards[i / 400].main;
        let h = hash_at(&t, i / 400, start % main, (start / main) as u64);
        assert!(matches!(
            put(&t, h, 1000, Full::Reject),
            Inserted::New { evicted: false, .. }
        ));
    }
    assert_eq!(t.len(), 1200);
    // The sweep takes 0..64, the eviction 64..320: slot 10 is not there.
    let newcomer = hash_at(&t, 3, 200, 0);
    assert!(matches!(
        put(&t, newcomer, 5, Full::Evict),
        Inserted::Full { soonest: 0 }
    ));
    assert_eq!(state(&t, k), Some(1000));
    // Next time the sweep takes 320..384 and the eviction starts at 384,
    // wrapping to slot 10.
    assert!(matches!(
        put(&t, newcomer, 5, Full::Evict),
        Inserted::New { evicted: true, .. }
    ));
    assert_eq!((state(&t, k), state(&t, newcomer)), (None, Some(5)));
    assert_eq!(t.len(), 1200);
}

/// The exact scope of docs/design.md and tests/keyed_table_props.rs: a
/// one-shard table of up to 22 keys has a main region of at most `PROBE`
/// slots (every window covers it) and at most `SWEEP` slots in all
/// (every sweep covers the shard); 23 keys do not.
#[test]
fn one_shard_of_up_to_22_keys_is_covered_by_every_window_and_sweep() {
    for k in 1..=23 {
        let t = Table::new(k, 1, Plain, 0);
        let s = &t.shards[0];
        let covered = s.main <= PROBE && s.slots.len() <= SWEEP;
        assert_eq!(
            covered,
            k <= 22,
            "{k} keys: {} + {}",
            s.main,
            s.slots.len() - s.main
        );
    }
}

#[test]
fn memory_and_capacity_add_up_over_shards() {
    let t = Table::new(10, 4, Plain, 0);
    assert_eq!(t.capacity(), 10);
    assert_eq!(t.shard_count(), 4);
    let slots: usize = t.shards.iter().map(|s| s.slots.len()).sum();
    assert!(t.memory_bytes() >= slots * 8 + 4 * std::mem::size_of::<CachePadded<Shard<Plain>>>());
    // Tags are never 0: a key's word is never an empty slot or a tombstone.
    for h in [0, 1, 2, 7, u64::MAX, 1 << 40] {
        assert!(tag(h) != 0 && tag(h) < 1 << (64 - STATE_BITS));
        assert!(pack(tag(h), 0) > TOMB);
    }
}

/// A full table (as many random keys as `max_keys`) fits, and its
/// stashes stay far from full: the margin behind the `max_keys` promise.
#[test]
#[cfg_attr(
    miri,
    ignore = "100k inserts: minutes under miri; the stable run covers it"
)]
fn a_full_table_fits_with_its_stashes_mostly_empty() {
    let n = 100_000;
    let t = Table::new(n, 64, Plain, 0);
    let mut x = 0x1234_5678_u64;
    for _ in 0..n {
        // splitmix64: distinct, well-spread hashes.
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut h = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h ^= h >> 31;
        let r = t.insert(h, &mut |_| ((), Some(7)), &Active, Full::Reject);
        assert!(
            matches!(r, Inserted::New { evicted: false, .. }),
            "key {h:x} did not fit"
        );
    }
    assert_eq!(t.len(), n);
    assert!(t.memory_bytes() <= 12 * n, "{} bytes", t.memory_bytes());
    for shard in t.shards.iter() {
        let stash = &shard.slots[shard.main..];
        // Acquire: as in `find` (no other thread here).
        let used = stash
            .iter()
            .filter(|s| tag_of(s.load(Ordering::Acquire)) > TOMB)
            .count();
        assert!(
            used * 2 <= stash.len(),
            "stash {used} of {} used",
            stash.len()
        );
    }
    // One more key: the table is at max_keys.
    assert!(matches!(
        t.insert(1 << 40, &mut |_| ((), Some(7)), &Active, Full::Reject),
        Inserted::Full { .. }
    ));
}

/// A table loads a batch's slots ahead only from 2 MiB of slots: 174,763
/// keys' worth at 12 bytes a key (1.5 slots of 8 bytes), not one key
/// fewer.
#[test]
// Tables of up to 1M keys: far too slow for miri's interpreter.
#[cfg_attr(miri, ignore)]
fn only_tables_of_at_least_2_mib_of_slots_load_ahead() {
    let slot_bytes =
        |t: &Table<Plain>| -> usize { t.shards.iter().map(|s| s.slots.len() * SLOT).sum() };
    for (keys, shards) in [(100, 1), (65_536, 64), (150_000, 64), (1_000_000, 64)] {
        let t = Table::new(keys, shards, Plain, 0);
        assert_eq!(
            t.prefetches(),
            slot_bytes(&t) >= PREFETCH_MIN_BYTES,
            "{keys} keys: {} bytes of slots",
            slot_bytes(&t)
        );
        assert_eq!(t.prefetches(), keys >= 1_000_000, "{keys} keys");
    }
    // At the boundary: the smallest one-shard table that loads ahead, and
    // the largest that does not.
    let at = |keys| Table::new(keys, 1, Plain, 0);
    // Slots grow with keys: a binary search for the first that loads ahead.
    let (mut lo, mut hi) = (1, 400_000);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if slot_bytes(&at(mid)) >= PREFETCH_MIN_BYTES {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    assert!(at(lo).prefetches() && !at(lo - 1).prefetches(), "{lo}");
    assert!((170_000..180_000).contains(&lo), "{lo}");
}

/// A load ahead (`touch`, the prefetch under it) is a hint: it changes no
/// slot and no answer, on a tracked key's slot, an empty one, any shard.
/// Under miri (`.ci/miri.sh` runs the unit tests), this is the test of the
/// crate's one `unsafe` block.
#[test]
fn a_touch_changes_no_slot() {
    let t = Table::new(8, 2, Plain, 0);
    let (a, b) = (hash_at(&t, 0, 1, 0), hash_at(&t, 1, 2, 0));
    assert!(matches!(put(&t, a, 5, Full::Reject), Inserted::New { .. }));
    let words = |t: &Table<Plain>| -> Vec<u64> {
        t.shards
            .iter()
            .flat_map(|s| s.slots.iter().map(|w| w.load(Ordering::Relaxed)))
            .collect()
    };
    let before = words(&t);
    for h in [a, b, 0, u64::MAX] {
        t.touch(h);
    }
    assert_eq!(words(&t), before);
    assert_eq!(state(&t, a), Some(5));
    assert_eq!(state(&t, b), None);
    let slot = AtomicU64::new(7);
    ahead::prefetch(&slot);
    assert_eq!(slot.load(Ordering::Relaxed), 7);
}
