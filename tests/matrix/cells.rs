//! The matrix's axes, generated from enums: every cell is one value of
//! each, and `excluded` says, once, which cannot exist and why.

/// An enum and the list of all its values, written once, so a value added
/// to the enum is a value of the matrix.
macro_rules! axis {
    ($(#[$m:meta])* $name:ident { $($v:ident => $label:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($v),+ }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$v),+];
            /// A short name: part of rule, limiter and path names.
            pub fn label(self) -> &'static str {
                match self { $($name::$v => $label),+ }
            }
        }
    };
}

axis!(
    /// What the cell's rule is.
    Kind {
        TokenBucket => "tb",
        LeakyBucket => "lb",
        FixedWindow => "fw",
        SlidingCounter => "swc",
        SlidingLog => "log",
        Tiered => "tier",
        Lockout => "lock",
        // A lockout whose Redis limiter hash-tags its keys
        // (`hash_tag_keys(true)`), as docs/http.md asks on a Cluster.
        LockoutTagged => "lockt",
        // On a Redis store: beside a Redis rate rule on the same path, so
        // its permits are taken on the Redis path of the check (after the
        // Redis rule, given back when it sheds).
        ConcurrencyLocal => "cl",
        ConcurrencyRedis => "cr",
        Shadow => "shadow",
    }
);

axis!(
    /// Where the rule keeps its state.
    Store {
        Local => "local",
        Redis => "redis",
        Cluster => "cluster",
    }
);

axis!(
    /// What the rule's limiter does when Redis cannot answer.
    Failure {
        Open => "open",
        Closed => "closed",
        FallbackShare => "share",
        Fallback => "fallback",
    }
);

axis!(
    /// When the cell is exercised.
    Phase {
        Healthy => "healthy",
        Killed => "killed",
        Back => "back",
    }
);

impl Kind {
    pub fn is_concurrency(self) -> bool {
        matches!(self, Kind::ConcurrencyLocal | Kind::ConcurrencyRedis)
    }
}

/// Why the cell (every phase of it) cannot exist, or `None` if it runs.
pub fn excluded(kind: Kind, store: Store, failure: Failure) -> Option<&'static str> {
    match (kind, store, failure) {
        (Kind::ConcurrencyRedis, Store::Local, _) => {
            Some("a Redis concurrency rule on a local store is the local concurrency kind")
        }
        (Kind::LockoutTagged, Store::Local, _) => {
            Some("a local rule has no Redis keys to tag: it is the lockout kind")
        }
        (_, Store::Local, f) if f != Failure::Open => {
            Some("a local store has no failure policy: its one cell is listed under open")
        }
        (Kind::ConcurrencyRedis, _, Failure::Fallback) => Some(
            "a rate policy cannot hold permits: `Fallback(policy)` on a Redis concurrency limiter is a build error",
        ),
        _ => None,
    }
}

/// One cell's coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cell {
    pub kind: Kind,
    pub store: Store,
    pub failure: Failure,
}

impl Cell {
    /// The rule's name, its limiter's, and its path's last segment: unique
    /// in the whole run, so logs, metrics and Redis keys name one cell.
    pub fn name(self) -> String {
        format!(
            "{}-{}-{}",
            self.store.label(),
            self.failure.label(),
            self.kind.label()
        )
    }

    pub fn path(self) -> String {
        format!("/{}", self.name())
    }
}

/// The cells of one store and failure policy that run (every kind not
/// excluded), and those excluded with their reasons.
pub fn cells_of(store: Store, failure: Failure) -> Vec<Cell> {
    Kind::ALL
        .iter()
        .filter(|&&kind| excluded(kind, store, failure).is_none())
        .map(|&kind| Cell {
            kind,
            store,
            failure,
        })
        .collect()
}

/// Cells that fail today, each with what fails, for the owners of the
/// code to fix. The run asserts that the failing cells are exactly these:
/// a fixed cell must leave the list (the last ones, a Redis lockout rule
/// on a Cluster without hash tags, left it when its block key took the
/// state key's slot).
pub const KNOWN: &[(Kind, Store, Failure, Phase, &str)] = &[];

/// The exclusions say what the matrix promises: one cell per kind on a
/// local store, no Redis concurrency there, and every cell's name (its
/// rule's, limiter's and path's) unique.
#[test]
fn a_local_store_has_one_cell_per_kind_and_every_name_is_unique() {
    let mut names = std::collections::BTreeSet::new();
    for &kind in Kind::ALL {
        let local = Failure::ALL
            .iter()
            .filter(|&&f| excluded(kind, Store::Local, f).is_none())
            .count();
        let expected = usize::from(!matches!(
            kind,
            Kind::ConcurrencyRedis | Kind::LockoutTagged
        ));
        assert_eq!(local, expected, "{kind:?} on a local store");
        for &store in Store::ALL {
            for &failure in Failure::ALL {
                let name = Cell {
                    kind,
                    store,
                    failure,
                }
                .name();
                assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
                assert!(names.insert(name.clone()), "{name} twice");
            }
        }
    }
    assert_eq!(
        names.len(),
        Kind::ALL.len() * Store::ALL.len() * Failure::ALL.len()
    );
}
