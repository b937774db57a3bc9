//! One group: the cells of one store and failure policy, each rule on its
//! own path of one layer, served by a real axum server on loopback, with
//! one Redis (or one 3-master Cluster) that the phases kill and restart.

use crate::cells::{Cell, Failure, Kind, Phase, Store};
use crate::invariants::{self, Failures, Snapshot, Tally};
use crate::observe::Events;
use crate::support::http_client::{get_seen, serve};
use crate::support::redis_server::{RedisCluster, RedisServer};
use axum::extract::Path;
use axum::routing::get;
use axum::{Extension, Router};
use futures_util::future::join_all;
use ratewall::http::{Key, Mode, RateLimitInfo, RateLimitLayer, Rule};
use ratewall::redis::{FailurePolicy, RedisBackend, RedisConcurrencyLimiter, RedisLimiter};
use ratewall::{Policy, Rate, Window};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The backend's per-call timeout: generous, so a loaded machine never
/// makes a healthy Redis look failing (250 ms did, once, under 3 builds).
pub const TIMEOUT: Duration = Duration::from_secs(1);
/// The breaker's cool-down (it opens after 3 failures in a row).
pub const COOL_DOWN: Duration = Duration::from_millis(500);
/// What a loaded 2-core machine may add to any bound.
pub const MARGIN: Duration = Duration::from_secs(3);
/// How long a concurrency cell's handler holds its permit.
pub const HOLD: Duration = Duration::from_millis(300);
/// A lockout's length.
pub const BLOCK: Duration = Duration::from_secs(2);

/// The Redis a group kills and restarts.
enum Servers {
    One(RedisServer),
    Cluster(RedisCluster),
}

impl Servers {
    fn start(store: Store) -> Servers {
        match store {
            Store::Cluster => Servers::Cluster(RedisCluster::start(3)),
            // A local group still has a Redis: its layer holds one Redis
            // rule (`/canary`), so its local rules are checked in a layer
            // whose Redis dies.
            Store::Local | Store::Redis => Servers::One(RedisServer::start()),
        }
    }

    fn backend(&self, name: &str) -> RedisBackend {
        let b = match self {
            Servers::One(s) => RedisBackend::builder(s.url()),
            Servers::Cluster(c) => RedisBackend::cluster_builder(c.urls()),
        };
        b.name(name)
            .timeout(TIMEOUT)
            .breaker(3, COOL_DOWN)
            .build()
            .unwrap()
    }

    fn ports(&self) -> Vec<u16> {
        match self {
            Servers::One(s) => vec![s.port()],
            Servers::Cluster(c) => c.nodes.iter().map(RedisServer::port).collect(),
        }
    }

    fn kill(&mut self) {
        match self {
            Servers::One(s) => s.kill9(),
            Servers::Cluster(c) => c.nodes.iter_mut().for_each(RedisServer::kill9),
        }
    }

    /// Starts it again and waits until it serves (a Cluster: every node
    /// says `cluster_state:ok`).
    fn restart(&mut self) {
        match self {
            Servers::One(s) => s.restart(),
            Servers::Cluster(c) => {
                c.nodes.iter_mut().for_each(RedisServer::restart);
                let deadline = Instant::now() + Duration::from_secs(30);
                for n in &c.nodes {
                    while !n.cmd(&["CLUSTER", "INFO"]).contains("cluster_state:ok") {
                        assert!(Instant::now() < deadline, "the cluster did not come back");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        }
    }
}

fn failure_policy(f: Failure, policy: Policy) -> FailurePolicy {
    match f {
        Failure::Open => FailurePolicy::Open,
        Failure::Closed => FailurePolicy::Closed,
        Failure::FallbackShare => FailurePolicy::FallbackShare { instances: 1 },
        Failure::Fallback => FailurePolicy::Fallback(policy),
    }
}

/// The cell's policy: short windows, so a client told to come back is
/// back within a second or two.
fn policy(kind: Kind) -> Policy {
    match kind {
        Kind::TokenBucket | Kind::Shadow => Policy::token_bucket(Rate::per_second(3)),
        Kind::LeakyBucket => Policy::leaky_bucket(Rate::per_second(3)),
        Kind::FixedWindow | Kind::Lockout | Kind::LockoutTagged => {
            Policy::fixed_window(Window::per_second(3))
        }
        Kind::SlidingCounter => Policy::sliding_window_counter(Window::per_second(3)),
        Kind::SlidingLog => Policy::sliding_window_log(Window::per_second(3)),
        Kind::Tiered => Policy::token_bucket(Rate::per_second(2)),
        Kind::ConcurrencyLocal | Kind::ConcurrencyRedis => {
            Policy::fixed_window(Window::per_second(1))
        }
    }
}

/// What the group keeps of a cell beyond its rule.
pub struct Built {
    pub cell: Cell,
    /// The Redis limiters its requests reach (a tier's sibling included).
    pub limiters: Vec<String>,
    /// A Redis concurrency cell's limiter, to read what it holds.
    pub permits: Option<Arc<RedisConcurrencyLimiter>>,
    /// The Redis rate rule beside a local concurrency rule on a Redis
    /// store (its name).
    pub companion: Option<String>,
}

/// A Redis limiter of the cell's store and failure policy.
fn limiter(
    cell: Cell,
    name: &str,
    p: Policy,
    backend: &RedisBackend,
    events: &Events,
) -> RedisLimiter {
    RedisLimiter::builder(p, backend)
        .prefix("mx")
        .name(name)
        .on_failure(failure_policy(cell.failure, p))
        .on_store_event(events.hook())
        .hash_tag_keys(cell.kind == Kind::LockoutTagged)
        .build()
        .unwrap()
}

/// The cell's rules: its own, and a local concurrency rule's companion on
/// a Redis store (a Redis token bucket that never denies).
fn rules(cell: Cell, backend: &RedisBackend, events: &Events) -> (Vec<Rule>, Built) {
    let (rule, mut built) = rule(cell, backend, events);
    let mut rules = vec![rule];
    if cell.kind == Kind::ConcurrencyLocal && cell.store != Store::Local {
        let name = format!("{}-rate", cell.name());
        let p = Policy::token_bucket(Rate::per_second(1000));
        let l = limiter(cell, &name, p, backend, events);
        rules.push(Rule::redis(Key::ip(), l).on_path_prefix(cell.path()));
        built.limiters.push(name.clone());
        built.companion = Some(name);
    }
    (rules, built)
}

fn rule(cell: Cell, backend: &RedisBackend, events: &Events) -> (Rule, Built) {
    let name = cell.name();
    let p = policy(cell.kind);
    let mut built = Built {
        cell,
        limiters: Vec::new(),
        permits: None,
        companion: None,
    };
    let rule = match (cell.kind, cell.store) {
        (Kind::ConcurrencyLocal, _) => Rule::concurrent(name.clone(), Key::global(), 1),
        (Kind::ConcurrencyRedis, _) => {
            let l = RedisConcurrencyLimiter::builder(1, backend)
                .prefix("mx")
                .name(name.clone())
                .on_failure(failure_policy(cell.failure, p))
                .on_store_event(events.hook())
                .build()
                .unwrap();
            let l = Arc::new(l);
            built.permits = Some(l.clone());
            built.limiters.push(name.clone());
            Rule::redis_concurrent(Key::global(), l)
        }
        (_, Store::Local) => Rule::per_ip(name.clone(), p),
        (_, Store::Redis | Store::Cluster) => {
            let l = limiter(cell, &name, p, backend, events);
            built.limiters.push(name.clone());
            Rule::redis(Key::ip(), l)
        }
    };
    let rule = rule.on_path_prefix(cell.path());
    let rule = match cell.kind {
        Kind::Tiered => {
            if cell.store != Store::Local {
                // The premium client's requests reach the tier's sibling.
                built.limiters.push(format!("{name}.premium"));
            }
            rule.tier("premium", Policy::token_bucket(Rate::per_second(4)))
                .tier_by_header("x-plan")
        }
        Kind::Lockout | Kind::LockoutTagged => rule.block_for(BLOCK),
        Kind::Shadow => rule.mode(Mode::Shadow),
        _ => rule,
    };
    (rule, built)
}

/// Answers with the decision source of each rule of the path (so
/// the client sees a fail-open or fallback admission), holding a
/// concurrency cell's permit for [`HOLD`].
async fn handler(Path(name): Path<String>, info: Option<Extension<RateLimitInfo>>) -> String {
    if name.ends_with("-cl") || name.ends_with("-cr") {
        tokio::time::sleep(HOLD).await;
    }
    match info {
        Some(Extension(info)) => info
            .iter()
            .map(|(n, _)| format!("{n}={:?}", info.source(n)))
            .collect::<Vec<_>>()
            .join(","),
        None => "no info".into(),
    }
}

/// One request to `cell`, timed, bounded at 30 s whatever happens (a
/// tiered cell's names the premium tier).
pub async fn hit(
    addr: SocketAddr,
    cell: Cell,
) -> (Option<crate::support::http_client::Seen>, Duration) {
    hit_as(addr, cell, Client::Premium).await
}

/// Who sends a request: a tiered cell has a premium client and one of the
/// rule's own policy, on one key; other cells have one client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    Premium,
    Plain,
}

/// One request to `cell` from `client`, timed, bounded at 30 s.
pub async fn hit_as(
    addr: SocketAddr,
    cell: Cell,
    client: Client,
) -> (Option<crate::support::http_client::Seen>, Duration) {
    let headers: &[(&str, &str)] = match (cell.kind, client) {
        (Kind::Tiered, Client::Premium) => &[("x-plan", "premium")],
        _ => &[],
    };
    let t = Instant::now();
    let got = tokio::time::timeout(
        Duration::from_secs(30),
        get_seen(addr, &cell.path(), headers),
    )
    .await;
    (got.ok(), t.elapsed())
}

/// Runs the group through its three phases; returns the (cell, phase)
/// pairs it ran.
pub async fn run(
    store: Store,
    failure: Failure,
    cells: Vec<Cell>,
    sink: Failures,
) -> Vec<(Cell, Phase)> {
    let label = format!("{}-{}", store.label(), failure.label());
    let mut servers = tokio::task::block_in_place(|| Servers::start(store));
    let backend = servers.backend(&label);
    let events = Events::default();
    let mut builder = RateLimitLayer::builder().decisions_extension(true);
    let mut built = Vec::new();
    for &cell in &cells {
        // Every cell on one backend: a cell whose calls failed while the
        // store was up would open the shared breaker for all the others.
        let (rs, b) = rules(cell, &backend, &events);
        for r in rs {
            builder = builder.rule(r);
        }
        built.push(b);
    }
    if store == Store::Local {
        let canary = RedisLimiter::builder(Policy::token_bucket(Rate::per_second(1000)), &backend)
            .prefix("mx")
            .name(format!("{label}-canary"))
            .on_failure(FailurePolicy::Open)
            .on_store_event(events.hook())
            .build()
            .unwrap();
        builder = builder.rule(Rule::redis(Key::ip(), canary).on_path_prefix("/canary"));
    }
    let layer = builder.build().unwrap();
    let app = Router::new()
        .route("/{name}", get(handler))
        .layer(layer.clone());
    let (addr, stop, task) = serve("127.0.0.1:0", app).await;

    let mut ran = Vec::new();
    let mut before: HashMap<String, Snapshot> = built
        .iter()
        .flat_map(|b| std::iter::once(b.cell.name()).chain(b.companion.clone()))
        .map(|n| (n.clone(), Snapshot::of(&layer, &n)))
        .collect();
    for &phase in Phase::ALL {
        let mut back_at = None;
        let mut straddling = HashMap::new();
        match phase {
            Phase::Healthy => {}
            Phase::Killed => {
                // A request of each concurrency cell holds its permit when
                // Redis dies: its release then cannot reach Redis, and the
                // phase's end must still find nothing held.
                for b in built.iter().filter(|b| b.cell.kind.is_concurrency()) {
                    straddling.insert(b.cell, tokio::spawn(hit(addr, b.cell)));
                }
                tokio::time::sleep(HOLD / 3).await;
                tokio::task::block_in_place(|| servers.kill());
            }
            Phase::Back => {
                tokio::task::block_in_place(|| servers.restart());
                back_at = Some(Instant::now());
                // A request through the canary, so the local group's
                // Redis rule recovers too.
                if store == Store::Local {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(10),
                        get_seen(addr, "/canary", &[]),
                    )
                    .await;
                }
            }
        }
        let ports = servers.ports();
        let runs = built.iter().map(|b| {
            let (events, sink, layer, ports) = (&events, &sink, &layer, &ports);
            let straddle = straddling.remove(&b.cell);
            async move {
                let mut tally = Tally::default();
                if let Some(h) = straddle {
                    let got = h.await.expect("a request task");
                    invariants::record(b.cell, phase, true, got, &mut tally, sink);
                }
                if let Some(at) = back_at {
                    invariants::recovers(addr, b, events, at, &mut tally, sink).await;
                }
                invariants::exercise(addr, b.cell, phase, &mut tally, sink).await;
                invariants::nothing_held(layer, b, phase, ports, sink).await;
                (b.cell, tally)
            }
        });
        for ((cell, tally), b) in join_all(runs).await.into_iter().zip(&built) {
            let now = Snapshot::of(&layer, &cell.name());
            invariants::tally_matches(cell, phase, &tally, &before[&cell.name()], &now, &sink);
            invariants::metrics_match(cell, phase, &cell.name(), &now, &sink);
            if b.companion.is_none() && cell.store != Store::Local {
                invariants::store_metrics_match(cell, phase, &b.limiters, &now, &sink);
            }
            before.insert(cell.name(), now);
            if let Some(c) = &b.companion {
                let now = Snapshot::of(&layer, c);
                invariants::companion_matches(cell, phase, &tally, &before[c], &now, &sink);
                invariants::metrics_match(cell, phase, c, &now, &sink);
                invariants::store_metrics_match(cell, phase, &b.limiters, &now, &sink);
                before.insert(c.clone(), now);
            }
            ran.push((cell, phase));
        }
        if phase == Phase::Healthy {
            for b in &built {
                invariants::healthy_is_decided_by_redis(b, &events, &sink);
            }
        }
        if phase == Phase::Back {
            for b in &built {
                invariants::quiet_after_outage(b, &events, &sink);
            }
        }
    }
    drop(stop);
    let _ = task.await;
    drop(servers);
    ran
}
